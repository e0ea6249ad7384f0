"""No process of a sandbox can make a user namespace, so none can mount a file system past the caps.

An unprivileged process may create a user namespace and hold every capability in it; with a mount namespace it
could mount a tmpfs of its own over ``/tmp`` with no size or inode cap, and fill the machine's memory (tmpfs pages
are not in RLIMIT_AS), costing every other notebook being graded on that machine. The sandbox's launcher loads
the syscall profile (``autograder.sandbox.syscall_profile``: default-deny, built with libseccomp) before anything of the
notebook runs. Each way in below is tried in a real sandbox, as grading runs it (``setns`` the kernel refuses on
its own; the profile refuses it too); what a kernel needs (fork, subprocess, multiprocessing pools, torch) still
works. The profile's other families, and a profile that cannot be loaded: tests/test_syscall_profile.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from autograder.sandbox import launch as sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the grader mounts capped file systems as root only")

MB = 1 << 20
LIMITS = replace(sandbox.Limits(), cpu_seconds=60, memory_bytes=2 << 30, processes=32, file_bytes=16 * MB,
                 tmpfs_bytes=8 * MB, scratch_bytes=6 * MB, inodes=400)
CLONE_NEWUSER, CLONE_NEWNS, SIGCHLD = 0x10000000, 0x00020000, 17

_PRELUDE = r"""
import ctypes, errno, json, os, shutil, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
def failed(result):
    return errno.errorcode.get(ctypes.get_errno(), "?") if result == -1 else None
def fill_tmp():
    # what an attacker does once in: map its uid, mount an uncapped tmpfs over /tmp, write past the cap
    uid, gid = os.getuid(), os.getgid()
    open("/proc/self/setgroups", "w").write("deny")
    open("/proc/self/uid_map", "w").write(f"0 {uid} 1")
    open("/proc/self/gid_map", "w").write(f"0 {gid} 1")
    libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, b"size=4g,nr_inodes=0")
    written = 0
    try:
        for i in range(4):
            with open(f"/tmp/fill{i}", "wb") as handle:
                for _ in range(4):
                    handle.write(b"x" * (1 << 20)); handle.flush(); written += 1
    except OSError:
        pass
    return written
out = {}
"""

# Each way in: it prints {"refused": errno name or null, "written": MB written to /tmp once in (0: never in)}.
WAYS = {
    "unshare": """
r = libc.unshare(0x10000000 | 0x00020000)
out = {"refused": failed(r), "written": fill_tmp() if r == 0 else 0}
""",
    "unshare, user namespace alone": """
r = libc.unshare(0x10000000)
out = {"refused": failed(r), "written": 0}
""",
    "clone": f"""
pid = libc.syscall(56 if os.uname().machine == "x86_64" else 220, {CLONE_NEWUSER | CLONE_NEWNS | SIGCHLD}, 0, 0, 0, 0)
if pid == 0:
    os._exit(0)  # the child never runs: the call is refused
out = {{"refused": failed(pid), "written": 0}}
if pid > 0:
    os.waitpid(pid, 0); out["refused"] = None
""",
    "clone3": """
import struct
args = struct.pack("=QQQQQQQQ", 0x10000000 | 0x00020000, 0, 0, 0, 17, 0, 0, 0)  # flags, ..., exit_signal
pid = libc.syscall(435, ctypes.c_char_p(args), len(args))
if pid == 0:
    os._exit(0)
out = {"refused": failed(pid), "written": 0}
if pid > 0:
    os.waitpid(pid, 0); out["refused"] = None
""",
    "setns into the init process's namespaces": """
refused = []
for kind in ("user", "mnt"):
    try:
        fd = os.open(f"/proc/1/ns/{kind}", os.O_RDONLY)
        refused.append(failed(libc.setns(fd, 0)))
    except OSError as exc:
        refused.append(errno.errorcode.get(exc.errno))
out = {"refused": None if None in refused else refused[0], "written": 0}
""",
    "the unshare command": """
tool = shutil.which("unshare")  # util-linux: on every Linux the grader runs on
assert tool, "no unshare command in the sandbox: this way in is not tried"
done = subprocess.run([tool, "--user", "--map-root-user", "--mount", "sh", "-c",
                       "mount -t tmpfs -o size=4g tmpfs /tmp && head -c 16777216 /dev/zero > /tmp/fill && echo in"],
                      capture_output=True, text=True)
got_in = "in" in done.stdout.split()
out = {"refused": None if got_in else (done.stderr.strip() or "refused"), "written": 16 if got_in else 0}
""",
}


def _run(box: sandbox.Sandbox, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(box.command([sys.executable, "-c", code]), env=box.outer_env(), cwd=box.scratch,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    made = sandbox.Sandbox(tmp_path_factory.mktemp("no-namespaces") / "box", LIMITS)
    made.prepare()
    made.seal()
    yield made
    made.release()


@pytest.mark.parametrize("way", WAYS)
def test_no_way_into_a_new_user_namespace(box, way):
    done = _run(box, _PRELUDE + WAYS[way] + "\nprint(json.dumps(out))")
    assert done.returncode == 0, done.stderr[-800:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["refused"], f"{way}: a new user namespace was made ({result})"
    assert result["written"] == 0


def test_what_a_kernel_needs_still_works(box):
    """fork, subprocess (clone3 falls back to clone), multiprocessing pools of both kinds, torch's threads."""
    code = """
import json, multiprocessing, os, subprocess
out = {"subprocess": subprocess.run(["echo", "hi"], capture_output=True, text=True).stdout.strip()}
pid = os.fork()
if pid == 0:
    os._exit(7)
out["os.fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
for kind in ("fork", "spawn"):
    with multiprocessing.get_context(kind).Pool(2) as pool:
        out[f"{kind} pool"] = pool.map(abs, [-1, -2])
import torch
torch.set_num_threads(2)
out["torch"] = float((torch.ones(64, 64) @ torch.ones(64, 64)).sum())
print(json.dumps(out))
"""
    done = _run(box, code)
    assert done.returncode == 0, done.stderr[-800:]
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "subprocess": "hi", "os.fork": 7, "fork pool": [1, 2], "spawn pool": [1, 2], "torch": 64.0 ** 3}
