"""The sandbox's default-deny syscall profile (autograder/sandbox/syscall_profile.py), its uid per sandbox and its IPC.

Two views. The profile itself, for x86-64 and aarch64 and both kinds (a kernel's, a warm sandbox's zygote's): a
small classic-BPF interpreter here runs the exported program on each call of each denied family, on calls a kernel
needs, on another ABI and on an unknown call, as the kernel would. Then real sandboxes, as grading runs them (as
root): each denied family fails from inside with several variants, a key one sandbox tries to add is nowhere
(not in the kernel's per-uid key counts, not readable from another sandbox), the SysV and POSIX IPC objects of
one sandbox are invisible to another running at the same time, two live sandboxes have different uids (also
across grading processes), and a profile that cannot be built or loaded runs nothing. A notebook's IPC objects
gone in the next notebook of a warm sandbox: tests/test_warm_sandbox.py. What a kernel needs (fork, subprocess,
both pool kinds, torch): tests/test_no_namespaces.py.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys
import time
from dataclasses import replace

import pyseccomp as seccomp
import pytest

from autograder.sandbox import launch as sandbox
from autograder.sandbox import syscall_profile
from autograder.sandbox import uids as sandbox_uids

ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
ARCHES = {"x86_64": (seccomp.Arch.X86_64, seccomp.Arch.X86), "aarch64": (seccomp.Arch.AARCH64, seccomp.Arch.ARM)}
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID = 0x10000000, 0x00020000, 0x40000000, 0x20000000
CLONE_NEWIPC, SIGCHLD = 0x08000000, 17
THREAD_FLAGS = 0x003D0F00  # what pthread_create passes to clone
MB = 1 << 20


def verdict(program: bytes, arch: int, nr: int, *args: int) -> int:
    """What the kernel's seccomp would return for this call: the classic BPF program run on its seccomp_data."""
    padded = (list(args) + [0] * 6)[:6]
    data = struct.pack("=iIQ6Q", nr, arch, 0, *(a & (2**64 - 1) for a in padded))
    code = [struct.unpack_from("=HBBI", program, at) for at in range(0, len(program), 8)]
    acc = index = 0
    memory = [0] * 16
    pc = 0
    while True:
        op, jump_true, jump_false, k = code[pc]
        pc += 1
        if op == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = struct.unpack_from("=I", data, k)[0]
        elif op == 0x00:
            acc = k
        elif op == 0x60:
            acc = memory[k]
        elif op == 0x02:
            memory[k] = acc
        elif op == 0x07:
            index = acc
        elif op == 0x87:
            acc = index
        elif op == 0x54:  # BPF_ALU | BPF_AND | BPF_K
            acc &= k
        elif op == 0x05:  # BPF_JMP | BPF_JA
            pc += k
        elif op in (0x15, 0x25, 0x35, 0x45):  # JEQ, JGT, JGE, JSET with K
            taken = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
            pc += jump_true if taken else jump_false
        elif op == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"an instruction this interpreter does not know: {op:#x} at {pc - 1}")


def _number(arch: int, name: str) -> int:
    return seccomp.resolve_syscall(arch, name)


@pytest.mark.parametrize("kind", syscall_profile.KINDS)
@pytest.mark.parametrize("machine", ARCHES)
def test_every_denied_family_is_denied_on_both_machines(machine, kind):
    program = syscall_profile.program(kind, machine)
    arch, _ = ARCHES[machine]
    for family, names in syscall_profile.DENIED.items():
        tried = 0
        for name in names:
            nr = _number(arch, name)
            if nr < 0:
                continue  # this machine has no such call
            tried += 1
            want = ENOSYS if name == "clone3" else EPERM
            for args in ((0,), (CLONE_NEWUSER,), (1, 2, 3, 4, 5, 6)):
                if name == "unshare" and kind == "zygote" and args == (CLONE_NEWIPC,):
                    continue
                assert verdict(program, arch, nr, *args) == want, f"{machine} {kind}: {name}{args} ({family})"
        assert tried, f"{machine}: no call of the family {family} was checked"


@pytest.mark.parametrize("machine", ARCHES)
def test_namespace_flags_are_read_from_clone_and_unshare(machine):
    arch, _ = ARCHES[machine]
    kernel, zygote = (syscall_profile.program(kind, machine) for kind in ("kernel", "zygote"))
    clone, unshare = _number(arch, "clone"), _number(arch, "unshare")
    for flag in (CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWIPC, 0x02000000, 0x04000000):
        for program in (kernel, zygote):
            assert verdict(program, arch, clone, flag | SIGCHLD) == EPERM, hex(flag)
            assert verdict(program, arch, clone, flag | THREAD_FLAGS) == EPERM, hex(flag)
            assert verdict(program, arch, clone, (1 << 32) | flag) == EPERM, "the high word hides nothing"
        assert verdict(kernel, arch, unshare, flag) == EPERM
    for program in (kernel, zygote):
        assert verdict(program, arch, clone, SIGCHLD) == ALLOW  # fork
        assert verdict(program, arch, clone, THREAD_FLAGS) == ALLOW  # a thread
    assert verdict(zygote, arch, unshare, CLONE_NEWIPC) == ALLOW  # the zygote's child, before it drops root
    for flags in (CLONE_NEWIPC | CLONE_NEWUSER, CLONE_NEWIPC | CLONE_NEWNS, CLONE_NEWUSER, 0):
        assert verdict(zygote, arch, unshare, flags) == EPERM, hex(flags)


@pytest.mark.parametrize("kind", syscall_profile.KINDS)
@pytest.mark.parametrize("machine", ARCHES)
def test_what_a_kernel_needs_is_allowed_and_nothing_unknown(machine, kind):
    program = syscall_profile.program(kind, machine)
    arch, other_abi = ARCHES[machine]
    for name in ("read", "write", "openat", "close", "mmap", "munmap", "mprotect", "futex", "execve", "wait4",
                 "rt_sigaction", "epoll_pwait", "getrandom", "sched_getaffinity", "shmget", "semget", "msgget",
                 "memfd_create", "set_robust_list", "rseq", "prctl", "setresuid", "kill", "exit_group"):
        assert verdict(program, arch, _number(arch, name), 0) == ALLOW, name
    socket = _number(arch, "socket")
    assert verdict(program, arch, socket, 1) == ALLOW  # AF_UNIX: the kernel's channels
    assert verdict(program, arch, socket, 40) == EPERM  # AF_VSOCK: the host
    personality = _number(arch, "personality")
    assert verdict(program, arch, personality, 0xFFFFFFFF) == ALLOW  # a query
    assert verdict(program, arch, personality, 0x0040000) == EPERM  # ADDR_NO_RANDOMIZE
    assert verdict(program, arch, 1000, 0) == EPERM  # a call it does not know
    assert verdict(program, other_abi, 1, 0) == EPERM  # another ABI (i386, arm32)
    if machine == "x86_64":
        assert verdict(program, arch, 0x40000000 | 0, 0) == EPERM  # x32


def test_a_profile_that_cannot_be_built_stops_grading(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # as if it were not installed
    with pytest.raises(syscall_profile.ProfileUnavailable, match=r"apt-get install libseccomp2.*\./course setup"):
        syscall_profile.program.__wrapped__("kernel")
    monkeypatch.setattr(syscall_profile, "program", syscall_profile.program.__wrapped__)
    box = sandbox.Sandbox(tmp_path / "box", sandbox.Limits())
    with pytest.raises(sandbox.SandboxUnavailable, match="nothing is graded without it"):
        box.command([sys.executable, "-c", "print('ran')"])
    box.release()
    with pytest.raises(syscall_profile.ProfileUnavailable, match="knows x86_64 and aarch64, not riscv64"):
        syscall_profile.program("kernel", "riscv64")


# -- real sandboxes (as grading runs them: root) -----------------------------------------------------------------
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's own uid and capped mounts need root")
LIMITS = replace(sandbox.Limits(), cpu_seconds=60, memory_bytes=2 << 30, processes=32, file_bytes=16 * MB,
                 tmpfs_bytes=8 * MB, scratch_bytes=6 * MB, inodes=400)

_PRELUDE = r"""
import ctypes, errno, json, os, struct, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {"x86_64": dict(add_key=248, request_key=249, keyctl=250, bpf=321, perf_event_open=298, userfaultfd=323,
                     ptrace=101, process_vm_readv=310, pidfd_open=434, pidfd_getfd=438, kexec_load=246,
                     kexec_file_load=320, reboot=169, mount=165, umount2=166, fsopen=430, open_tree=428,
                     pivot_root=155, chroot=161, unshare=272, setns=308, io_uring_setup=425, init_module=175),
      "aarch64": dict(add_key=217, request_key=218, keyctl=219, bpf=280, perf_event_open=241, userfaultfd=282,
                      ptrace=117, process_vm_readv=270, pidfd_open=434, pidfd_getfd=438, kexec_load=104,
                      kexec_file_load=294, reboot=142, mount=40, umount2=39, fsopen=430, open_tree=428,
                      pivot_root=41, chroot=51, unshare=97, setns=268, io_uring_setup=425,
                      init_module=105)}[os.uname().machine]
def call(name, *args):
    result = libc.syscall(NR[name], *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return errno.errorcode.get(ctypes.get_errno(), "?") if result == -1 else f"returned {result}"
out = {}
"""

# Each family: variants, each printing what the call gave (an errno name, or "returned N" if it went through).
FAMILIES = {
    "kernel keyring": """
out["add_key to the user keyring"] = call("add_key", b"user", b"stash", b"MultiHeadAttention", 18, -4)
out["add_key to the session keyring"] = call("add_key", b"user", b"stash", b"x", 1, -3)
out["keyctl: join a new session keyring"] = call("keyctl", 1, b"mine")  # KEYCTL_JOIN_SESSION_KEYRING
out["keyctl: the user keyring's id"] = call("keyctl", 0, -4, 0)  # KEYCTL_GET_KEYRING_ID
out["keyctl: search"] = call("keyctl", 10, -4, b"user", b"stash", 0)  # KEYCTL_SEARCH
out["request_key"] = call("request_key", b"user", b"stash", None, 0)
""",
    "bpf": """
attr = struct.pack("=IIII", 2, 4, 4, 1) + bytes(112)  # BPF_MAP_TYPE_ARRAY
out["BPF_MAP_CREATE"] = call("bpf", 0, attr, len(attr))
out["BPF_PROG_LOAD"] = call("bpf", 5, bytes(128), 128)
""",
    "perf_event_open": """
attr = struct.pack("=IIQ", 1, 128, 0) + bytes(104)  # PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK
out["on itself"] = call("perf_event_open", attr, 0, -1, -1, 0)
out["on every process, one CPU"] = call("perf_event_open", attr, -1, 0, -1, 0)
""",
    "userfaultfd": """
out["user mode only"] = call("userfaultfd", 0o2000000 | 1)  # O_CLOEXEC | UFFD_USER_MODE_ONLY
out["plain"] = call("userfaultfd", 0)
""",
    "tracing another process": """
child = subprocess.Popen(["sleep", "30"])
buffer = ctypes.create_string_buffer(8)
local = struct.pack("=QQ", ctypes.addressof(buffer), 8)
out["PTRACE_ATTACH"] = call("ptrace", 16, child.pid, 0, 0)
out["PTRACE_SEIZE"] = call("ptrace", 0x4206, child.pid, 0, 0)
out["process_vm_readv"] = call("process_vm_readv", child.pid, local, 1, local, 1, 0)
pidfd = libc.syscall(NR["pidfd_open"], child.pid, 0)
out["pidfd_getfd"] = call("pidfd_getfd", pidfd, 0, 0)
out["PTRACE_TRACEME"] = call("ptrace", 0, 0, 0, 0)
child.kill()
""",
    "mounting": """
out["mount a tmpfs"] = call("mount", b"tmpfs", b"/tmp", b"tmpfs", 0, b"size=4g")
out["remount /"] = call("mount", None, b"/", None, 32 | 1, None)  # MS_REMOUNT | MS_RDONLY
out["umount2"] = call("umount2", b"/tmp", 2)
out["fsopen"] = call("fsopen", b"tmpfs", 0)
out["open_tree"] = call("open_tree", -100, b"/tmp", 1)  # OPEN_TREE_CLONE
out["pivot_root"] = call("pivot_root", b"/tmp", b"/tmp")
out["chroot"] = call("chroot", b"/tmp")
""",
    "namespaces": """
for name, flag in (("user", 0x10000000), ("mount", 0x20000), ("network", 0x40000000), ("ipc", 0x08000000),
                   ("uts", 0x04000000), ("pid", 0x20000000), ("cgroup", 0x02000000)):
    out[f"unshare {name}"] = call("unshare", flag)
fd = os.open("/proc/self/ns/ipc", os.O_RDONLY)
out["setns into an ipc namespace"] = call("setns", fd, 0)
""",
    "kexec, reboot, modules, io_uring": """
out["kexec_load"] = call("kexec_load", 0, 0, None, 0)
out["kexec_file_load"] = call("kexec_file_load", -1, -1, 0, b"", 2)  # KEXEC_FILE_NO_INITRAMFS
out["reboot (a harmless command)"] = call("reboot", 0xfee1dead, 672274793, 0, None)  # LINUX_REBOOT_CMD_CAD_OFF
out["init_module"] = call("init_module", None, 0, b"")
out["io_uring_setup"] = call("io_uring_setup", 4, bytes(120))
""",
}


def _run(box: sandbox.Sandbox, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(box.command([sys.executable, "-c", code]), env=box.outer_env(), cwd=box.scratch,
                          capture_output=True, text=True, timeout=timeout)


def _made(path) -> sandbox.Sandbox:
    made = sandbox.Sandbox(path, LIMITS)
    made.prepare()
    made.seal()
    return made


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    made = _made(tmp_path_factory.mktemp("profile") / "box")
    yield made
    made.release()


@as_root
@pytest.mark.parametrize("family", FAMILIES)
def test_each_denied_family_fails_inside_a_sandbox(box, family):
    done = _run(box, _PRELUDE + FAMILIES[family] + "\nprint(json.dumps(out))")
    assert done.returncode == 0, done.stderr[-800:]
    results = json.loads(done.stdout.splitlines()[-1])
    assert len(results) >= 2
    through = {way: got for way, got in results.items() if got not in ("EPERM", "ENOSYS")}
    assert not through, f"{family}: these went through (or failed past the profile): {through}"


def _key_counts() -> dict[int, str]:
    """The kernel's keys per uid (/proc/key-users: every user's, as root on the host)."""
    with open("/proc/key-users") as handle:
        return {int(line.split(":")[0]): line.split(":", 1)[1].strip() for line in handle if ":" in line}


@as_root
def test_no_key_of_a_sandbox_reaches_the_kernel_another_sandbox_or_nobody(tmp_path):
    first, second = _made(tmp_path / "first"), _made(tmp_path / "second")
    before = _key_counts().get(first.uid)  # None, unless a run without the profile left keys of that uid
    try:
        added = _run(first, _PRELUDE + """
out["add"] = call("add_key", b"user", b"stash", b"class MultiHeadAttention", 24, -4)
out["add to the session keyring"] = call("add_key", b"user", b"stash", b"class MultiHeadAttention", 24, -3)
print(json.dumps(out))""")
        assert added.returncode == 0, added.stderr[-800:]
        assert set(json.loads(added.stdout.splitlines()[-1]).values()) == {"EPERM"}
        assert _key_counts().get(first.uid) == before, "the kernel holds new keys of the sandbox's uid"
        read = _run(second, _PRELUDE + """
out["search the first sandbox's key"] = call("keyctl", 10, -4, b"user", b"stash", 0)
out["read /proc/keys"] = open("/proc/keys").read()
print(json.dumps(out))""")
        assert read.returncode == 0, read.stderr[-800:]
        got = json.loads(read.stdout.splitlines()[-1])
        assert got["search the first sandbox's key"] == "EPERM" and "stash" not in got["read /proc/keys"]
        nobody = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "cat",
                                 "/proc/keys"], capture_output=True, text=True, timeout=30)
        assert nobody.returncode == 0, nobody.stderr
        assert "MultiHeadAttention" not in nobody.stdout and "stash" not in nobody.stdout
    finally:
        first.release()
        second.release()


_HOLD_IPC = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
made = {"shm": libc.shmget(0x5EC2E7, 1 << 20, 0o1600), "sem": libc.semget(0x5EC2E8, 1, 0o1600),
        "msg": libc.msgget(0x5EC2E9, 0o1600)}
with open("/dev/shm/stash", "w") as handle:  # POSIX shared memory: a file of the sandbox's /dev/shm
    handle.write("withheld answers")
libc.mq_open.restype = ctypes.c_int
made["mq"] = libc.mq_open(b"/stash", os.O_CREAT | os.O_RDWR, 0o600, None)
print("held", made, flush=True)
time.sleep(60)
"""

_LOOK_FOR_IPC = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
found = {kind: open(f"/proc/sysvipc/{kind}").read().splitlines()[1:] for kind in ("shm", "sem", "msg")}
found["shmget by key"] = libc.shmget(0x5EC2E7, 0, 0)
found["/dev/shm"] = os.listdir("/dev/shm")
found["mq_open"] = libc.mq_open(b"/stash", os.O_RDONLY, 0, None)
print(json.dumps(found))
"""


@as_root
def test_a_sandboxes_ipc_objects_are_invisible_to_a_classmates_running_at_the_same_time(tmp_path):
    first, second = _made(tmp_path / "first"), _made(tmp_path / "second")
    holder = subprocess.Popen(first.command([sys.executable, "-c", _HOLD_IPC]), env=first.outer_env(),
                              cwd=first.scratch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline()
        assert line.startswith("held") and "-1" not in line, (line, holder.stderr.read() if not line else "")
        looked = _run(second, _LOOK_FOR_IPC)
        assert looked.returncode == 0, looked.stderr[-800:]
        assert json.loads(looked.stdout.splitlines()[-1]) == {
            "shm": [], "sem": [], "msg": [], "shmget by key": -1, "/dev/shm": [], "mq_open": -1}
    finally:
        holder.kill()
        holder.wait(timeout=30)
        first.release()
        second.release()


@as_root
def test_two_live_sandboxes_have_different_uids_even_from_two_grading_processes(tmp_path):
    boxes = [_made(tmp_path / f"box{i}") for i in range(3)]
    try:
        uids = [box.uid for box in boxes]
        assert len(set(uids)) == 3 and all(sandbox_uids.UID_BASE <= uid < sandbox_uids.UID_BASE
                                           + sandbox_uids.UID_COUNT for uid in uids), uids
        seen = [int(_run(box, "import os; print(os.getuid())").stdout) for box in boxes[:2]]
        assert seen == uids[:2]
        # another grading process, starting its search at a uid this one holds, gets another
        other = subprocess.run([sys.executable, "-c", "from autograder.sandbox import uids as sandbox_uids; "
                                f"print(sandbox_uids.lease(start={uids[0] - sandbox_uids.UID_BASE}).uid)"],
                               capture_output=True, text=True, timeout=60)
        assert other.returncode == 0, other.stderr
        assert int(other.stdout) not in uids
    finally:
        for box in boxes:
            box.release()
    again = sandbox_uids.lease(start=uids[0] - sandbox_uids.UID_BASE)  # given back: free again
    try:
        assert again.uid == uids[0]
    finally:
        again.release()


@as_root
def test_uids_are_leased_only_in_a_folder_root_alone_writes_and_never_an_accounts(tmp_path, monkeypatch):
    shared, private = tmp_path / "shared", tmp_path / "private"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)  # like /tmp: anyone could plant or hold lock files there
    monkeypatch.setattr(sandbox_uids, "LOCK_FOLDERS", (shared,))
    with pytest.raises(sandbox_uids.NoUidLeft, match="not a folder that root alone may write"):
        sandbox_uids.lease()
    with pytest.raises(sandbox.SandboxUnavailable, match="make it root's with mode 0700"):
        sandbox.Sandbox(tmp_path / "box", LIMITS)
    monkeypatch.setattr(sandbox_uids, "LOCK_FOLDERS", (shared, private))
    taken = sandbox_uids.UID_BASE + 123
    monkeypatch.setattr(sandbox_uids, "_has_account", lambda uid: uid == taken)  # as if an account had it
    held = sandbox_uids.lease(start=123)
    try:
        assert held.uid == taken + 1 and (private / str(held.uid)).exists()
        assert private.stat().st_mode & 0o777 == 0o700
    finally:
        held.release()
    assert not (private / str(held.uid)).exists(), "a released lease left its lock file"


@as_root
def test_a_uid_still_running_is_not_given_back(tmp_path):
    box = _made(tmp_path / "box")
    sleeper = subprocess.Popen(["setpriv", f"--reuid={box.uid}", f"--regid={box.uid}", "--clear-groups",
                                "sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while not sandbox_uids.running(box.uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        box.release()
        assert box.uid_lease is not None and box.uid_lease.held, "a uid with a live process was given back"
    finally:
        sleeper.kill()
        sleeper.wait()
    box.uid_lease.release()
    assert not box.uid_lease.held


@as_root
def test_the_launcher_runs_nothing_without_its_profile(box, monkeypatch):
    """A program the kernel refuses (here: an empty one) stops the sandbox before the notebook's first line."""
    monkeypatch.setattr(sandbox, "seccomp_program", lambda kind="kernel": b"")
    done = _run(box, "print('ran')")
    assert done.returncode != 0 and "ran" not in done.stdout
    assert "the seccomp filter was refused" in done.stderr and "nothing runs without it" in done.stderr
