"""A control group per sandbox: its memory, processes and CPU bound all of its processes together.

Per-process rlimits do not: many processes each under ``RLIMIT_AS``, SysV shared memory or tmpfs files no process
holds, threads or processes of other uids, and busy processes in sessions of their own all passed them on main.
The tests below run plain processes in a sandbox (no kernel), each way of taking memory, processes or CPU, and check
that the sandbox's group stopped it, and that the grader says so; then what can be checked of cgroup v2 and of a
grader without root on this machine: the files and values written (in a fake hierarchy under ``tmp_path``), the
parsing of the kernel's counts, and the warning that says what holds without a group.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from autograder.grading import grade_class
from autograder.sandbox import cgroups
from autograder.sandbox import launch as sandbox

MB = 1 << 20
# RLIMIT_AS well above the group's memory, so that only the group can stop what the tests below take.
LIMITS = replace(sandbox.Limits(), cpu_seconds=60, memory_bytes=1536 * MB, processes=64, file_bytes=1024 * MB,
                 tmpfs_bytes=1024 * MB, sandbox_memory_bytes=192 * MB, deadline=60.0)
as_root = pytest.mark.skipif(os.geteuid() != 0 or cgroups.hierarchy() is None,
                             reason="the grader makes control groups as root, where a cgroup hierarchy is mounted")


def _boxed(tmp_path: Path, code: str, limits=LIMITS, timeout: float = 90, watch: bool = True):
    """Run ``code`` in a sandbox under ``limits`` (its watchdog running when ``watch``); the finished process and
    what the sandbox's group counted, read before the group is removed."""
    box = sandbox.Sandbox(tmp_path / "box", limits)
    box.prepare()
    box.seal()
    try:
        process = subprocess.Popen(box.command([sys.executable, "-c", code]), env=box.outer_env(), cwd=box.scratch,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if watch:
            box.started(process)
        out, err = process.communicate(timeout=timeout)
        box.join(timeout=10)
        box.kill()
        group = box.cgroup
        counted = {"oom_kills": group.oom_kills(), "peak": group.memory_peak(), "refused": group.pids_refused(),
                   "cpu": group.cpu_stat(), "folders": list(group.folders.values())} if group else {}
        return process.returncode, out, err, box, counted
    finally:
        box.release()


# -- memory: every way of holding it counts against the one limit ------------------------------------------------
def _attack(name: str) -> str:
    """The cell of one of ``tests/adversarial/``'s attacks, then a line that says it ran to its end."""
    return (Path(__file__).parent / "adversarial" / f"{name}.py").read_text().split('"""', 2)[2] + "\nprint('done')\n"


MEMORY_WAYS = {
    "anonymous pages": "block = bytearray(512 << 20)\nprint('done')",
    "many processes": _attack("memory_many_processes"),  # 16 processes of 160 MB, each in its own session
    "SysV shared memory": _attack("memory_sysv_shm"),  # segments of 256 MB, each filled and detached
    "POSIX shared memory": """
from multiprocessing import shared_memory
blocks = [shared_memory.SharedMemory(create=True, size=64 << 20) for _ in range(8)]
for block in blocks:
    block.buf[:] = b"1" * (64 << 20)
    block.close()  # unmapped: the pages stay in /dev/shm
print("done")
""",
    "tmpfs files": """
with open("/tmp/big", "wb") as handle:
    for _ in range(512):
        handle.write(b"1" * (1 << 20))
print("done")
""",
}


@as_root
@pytest.mark.parametrize("way", MEMORY_WAYS)
def test_the_sandbox_as_a_whole_cannot_hold_more_memory_than_its_limit(tmp_path, way):
    code, out, err, box, counted = _boxed(tmp_path, MEMORY_WAYS[way])
    assert "done" not in out, f"{way}: ran to its end under a {LIMITS.sandbox_memory_bytes >> 20} MB limit"
    assert counted["oom_kills"] >= 1, (code, out, err[-300:])
    assert counted["peak"] <= LIMITS.sandbox_memory_bytes
    assert box.memory_hit and sandbox.memory_note(LIMITS.sandbox_memory_bytes) in box.events, box.events
    assert all(not folder.exists() for folder in counted["folders"]), "the sandbox's group outlived it"


@as_root
def test_memory_under_the_limit_is_untouched_and_the_group_holds_only_the_sandbox(tmp_path):
    code = """
import sys, time
block = bytearray(96 << 20)
print(open("/proc/self/cgroup").read(), flush=True)
time.sleep(60)
"""
    box = sandbox.Sandbox(tmp_path / "box", LIMITS)
    box.prepare()
    box.seal()
    try:
        process = subprocess.Popen(box.command([sys.executable, "-c", code]), env=box.outer_env(), cwd=box.scratch,
                                   stdout=subprocess.PIPE, text=True)
        box.started(process)
        seen = "".join(iter(process.stdout.readline, "\n"))
        inside, group = box.survivors(), box.cgroup.pids()
        assert inside and set(inside) <= set(group), "a process of the sandbox runs outside its group"
        assert os.getpid() not in group and process.pid in group, "the group holds the grader, or not bwrap"
        # its own cgroup namespace: the sandbox sees its group as the root, and no name of the host's
        assert "memory:/" in [line.split(":", 1)[1] for line in seen.splitlines()], seen
        assert box.cgroup.name not in seen, seen
        box.kill()
        assert box.cgroup.oom_kills() == 0 and not box.memory_hit and box.events == []
        folders = list(box.cgroup.folders.values())
    finally:
        box.release()
    assert box.cgroup is None and not any(folder.exists() for folder in folders), "the group outlived the sandbox"


# -- processes and threads -----------------------------------------------------------------------------------------
PIDS_WAYS = {
    "fork bomb": """
import os, time
made = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        made += 1
except OSError:
    print("made", made)
""",
    "threads": """
import threading, time
made = 0
try:
    while True:
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        made += 1
except RuntimeError:
    print("made", made)
""",
}


@as_root
@pytest.mark.parametrize("way", PIDS_WAYS)
def test_processes_and_threads_stop_at_the_groups_limit_below_the_uids(tmp_path, way):
    limits = replace(LIMITS, processes=64, sandbox_pids=16)
    code, out, err, box, counted = _boxed(tmp_path, PIDS_WAYS[way], limits, watch=False)
    assert out.startswith("made "), (code, out, err[-300:])
    made = int(out.split()[1])
    # bwrap, its init and the interpreter count too: the group refuses what RLIMIT_NPROC (64) would allow
    assert 0 < made <= limits.sandbox_pids - 2, f"{way}: {made} under pids.max {limits.sandbox_pids}"
    assert counted["refused"] >= 1


# -- CPU -----------------------------------------------------------------------------------------------------------
_BURN = """
import os, time
readers = []
for _ in range(6):  # six busy processes, each in a session of its own, for 2 s of wall time
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            pass
        os.write(write, str(time.process_time()).encode())
        os._exit(0)
    os.close(write)
    readers.append(read)
print(sum(float(os.read(read, 64)) for read in readers))
"""


@as_root
def test_many_busy_sessions_get_no_more_than_the_sandboxs_cpu_share(tmp_path):
    limits = replace(LIMITS, cpus=0.5)
    code, out, err, box, counted = _boxed(tmp_path, _BURN, limits, watch=False)
    assert code == 0, err[-300:]
    used = float(out)
    # 6 processes for 2 s would take 12 s of CPU on an idle 6-core machine (4 s on this 2-core one); the quota
    # allows 0.5 s per second, plus one period of slack for the moment they start
    assert used <= 0.5 * 2.0 + 0.3, f"six busy sessions used {used:.2f} s of CPU in 2 s under a 0.5-core quota"
    assert counted["cpu"]["nr_periods"] >= 1, "no quota period was counted: the group had no quota"


def test_a_sandbox_gets_its_workers_part_of_the_machine_and_at_least_a_core():
    assert cgroups.cpu_share(2, 1) == 2.0 and cgroups.cpu_share(2, 2) == 1.0 and cgroups.cpu_share(2, 6) == 1.0
    assert cgroups.cpu_share(16, 4) == 4.0
    assert grade_class.worker_limits(LIMITS, workers=2, cores=2).cpus == 1.0
    assert grade_class.worker_limits(LIMITS, workers=1, cores=2).cpus == 2.0
    assert grade_class.worker_limits(replace(LIMITS, cpus=0.5), workers=2, cores=2).cpus == 0.5, "a set share is kept"


# -- v2 and v1: the files written, the counts read (a fake hierarchy: this machine mounts v1) -------------------------
def _fake_hierarchy(tmp_path: Path, version: int) -> tuple[str, str]:
    """The texts of /proc/self/cgroup and /proc/self/mountinfo for a grader in group /grading, on a hierarchy of
    folders under tmp_path."""
    if version == 2:
        (tmp_path / "v2" / "grading").mkdir(parents=True)
        (tmp_path / "v2" / "grading" / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma\n")
        mountinfo = f"30 23 0:26 / {tmp_path}/v2 rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        return "0::/grading\n", mountinfo
    mountinfo = proc = ""
    for number, controller in enumerate(("cpu,cpuacct", "memory", "pids"), 1):
        (tmp_path / "v1" / controller / "grading").mkdir(parents=True)
        point = f"{tmp_path}/v1/{controller}"
        mountinfo += f"{30 + number} 23 0:{26 + number} / {point} rw - cgroup cgroup rw,{controller}\n"
        proc += f"{number}:{controller}:/grading\n"
    return proc, mountinfo + f"40 23 0:40 / {tmp_path}/v2 rw - cgroup2 cgroup2 rw\n"


def test_cgroup_v2_limits_are_the_files_and_values_the_kernel_reads(tmp_path):
    found = cgroups.find(*_fake_hierarchy(tmp_path, 2))
    assert found == cgroups.Hierarchy(2, dict.fromkeys(cgroups.CONTROLLERS, tmp_path / "v2" / "grading"))
    group = found.create(256 * MB, 40, 1.5)
    folder = tmp_path / "v2" / "grading" / group.name
    assert group.procs_files() == [folder / "cgroup.procs"]
    written = {path.name: path.read_text() for path in folder.iterdir()}
    assert written == {"memory.max": str(256 * MB), "memory.swap.max": "0", "memory.oom.group": "1",
                       "pids.max": "40", "cpu.max": "150000 100000", "cpu.weight": "100"}
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 1\n")
    (folder / "pids.events").write_text("max 7\n")
    (folder / "cpu.stat").write_text("usage_usec 5000\nnr_periods 10\nnr_throttled 4\nthrottled_usec 300\n")
    assert (group.oom_kills(), group.pids_refused()) == (2, 7)
    assert group.cpu_stat()["nr_throttled"] == 4 and group.cpu_stat()["usage_usec"] == 5000
    for name in written:
        (folder / name).unlink()
    for name in ("memory.events", "pids.events", "cpu.stat"):
        (folder / name).unlink()
    assert group.remove() == [] and not folder.exists()


def test_cgroup_v1_limits_are_written_in_each_controllers_hierarchy(tmp_path):
    found = cgroups.find(*_fake_hierarchy(tmp_path, 1))
    assert found.version == 1 and found.parents == {
        "memory": tmp_path / "v1" / "memory" / "grading", "pids": tmp_path / "v1" / "pids" / "grading",
        "cpu": tmp_path / "v1" / "cpu,cpuacct" / "grading", "cpuacct": tmp_path / "v1" / "cpu,cpuacct" / "grading"}
    group = found.create(256 * MB, 40, 1.0)
    assert len(group.procs_files()) == 3, "cpu and cpuacct share one hierarchy: one cgroup.procs"
    read = {path.name: path.read_text() for folder in set(group.folders.values()) for path in folder.iterdir()}
    assert read == {"memory.limit_in_bytes": str(256 * MB), "memory.memsw.limit_in_bytes": str(256 * MB),
                    "pids.max": "40", "cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000",
                    "cpu.shares": "1024"}
    memory = group.folders["memory"]
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (memory / "memory.max_usage_in_bytes").write_text(f"{200 * MB}\n")
    assert group.oom_kills() == 3 and group.memory_peak() == 200 * MB


def test_the_kernels_counts_are_parsed_within_bounds():
    assert cgroups.keyed("oom 1\noom_kill 2\nnot a line\nbad x\n") == {"oom": 1, "oom_kill": 2}
    assert cgroups.keyed("oom_kill 1\n" * 10_000) == {"oom_kill": 1}


def test_no_usable_hierarchy_is_said_clearly(tmp_path):
    proc, mountinfo = _fake_hierarchy(tmp_path, 2)
    (tmp_path / "v2" / "grading" / "cgroup.controllers").write_text("cpu io\n")  # not delegated: no memory, pids
    with pytest.raises(cgroups.CgroupUnavailable, match="does not offer memory, pids.*Delegate=yes"):
        cgroups.find(proc, mountinfo)
    with pytest.raises(cgroups.CgroupUnavailable, match="no cgroup hierarchy of memory, pids, cpu is mounted"):
        cgroups.find("0::/\n", "")


def test_a_v2_group_with_processes_hands_them_to_a_leaf_before_enabling_controllers(tmp_path, monkeypatch):
    parent = tmp_path / "grading"
    parent.mkdir()
    (parent / "cgroup.procs").write_text("101\n102\n")
    real = cgroups._write
    refused = []

    def write(path: Path, value: str) -> None:  # the kernel refuses while the group has processes of its own
        if path.name == "cgroup.subtree_control" and not refused:
            refused.append(value)
            raise OSError(errno.EBUSY, "Device or resource busy")
        real(path, value)

    monkeypatch.setattr(cgroups, "_write", write)
    cgroups.enable_v2(parent)
    assert refused and (parent / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (parent / cgroups.LEAF / "cgroup.procs").read_text() == "102", "the last pid written is the file's"


# -- without root --------------------------------------------------------------------------------------------------
def test_without_root_sandboxes_warn_once_and_keep_their_rlimits(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(cgroups, "_HIERARCHY", [])
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with caplog.at_level(logging.WARNING, logger="autograder"):
        assert cgroups.for_sandbox(256 * MB, 40, 1.0) is None and cgroups.for_sandbox(256 * MB, 40, 1.0) is None
    warned = [record.getMessage() for record in caplog.records]
    assert len(warned) == 1 and "does not run as root" in warned[0] and "keeps its rlimits" in warned[0], warned
    box = sandbox.Sandbox(tmp_path / "box", LIMITS)
    box.join_cgroup()
    command = box.command(["true"])
    assert box.cgroup is None and command[0] != "/bin/sh" and "RLIMIT_NPROC" in command[-2], command[:3]


@as_root
def test_a_sandbox_starts_in_its_group_or_not_at_all(tmp_path):
    box = sandbox.Sandbox(tmp_path / "box", LIMITS)
    box.prepare()
    box.seal()
    try:
        command = box.command([sys.executable, "-c", "print('ran')"])
        assert command[:2] == ["/bin/sh", "-c"] and command[command.index("--") + 1] == sandbox.bwrap()
        broken = [word.replace("cgroup.procs", "no-such-file") for word in command]
        done = subprocess.run(broken, env=box.outer_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 125 and "ran" not in done.stdout, (done.returncode, done.stdout)
    finally:
        box.release()
    assert box.cgroup is None


def _sleeping_in(group: cgroups.Group) -> subprocess.Popen:
    """A process that sleeps in ``group`` (started through its attach command), once the group lists it."""
    process = subprocess.Popen(group.attach_command() + ["sleep", "600"])
    for _ in range(100):
        if process.pid in group.pids():
            return process
        time.sleep(0.02)
    process.kill()
    raise AssertionError(f"the process never joined {group.name}")


@as_root
def test_a_group_whose_process_dies_late_is_removed_by_the_next_sandbox_or_at_exit(monkeypatch):
    """A killed process leaves its group only once the kernel has freed what it held, which a loaded machine can take
    longer than :meth:`Group.remove` waits. Such a group is not forgotten: the next group made in this process (or
    its exit) removes it. Here the process "dies late" because the first removal's kill is withheld."""
    group = cgroups.for_sandbox(64 * MB, 16, 1.0)
    process = _sleeping_in(group)
    following = None
    try:
        with monkeypatch.context() as patched:
            patched.setattr(cgroups.os, "kill", lambda pid, sig: None)  # the kill lands after the removal's wait
            left = group.remove(seconds=0.2)
        assert left == [process.pid] and group.exists() and group in cgroups._UNREMOVED
        following = cgroups.for_sandbox(64 * MB, 16, 1.0)
        assert not group.exists(), "the group left behind was still there after the next sandbox's group was made"
        assert group not in cgroups._UNREMOVED and process.wait(timeout=10) == -9
        assert following.remove() == [] and not following.exists()
    finally:
        process.kill()
        process.wait()
        if following is not None:
            following.remove()
        cgroups.reap_unremoved()


@as_root
def test_a_group_no_sandbox_holds_any_more_is_removed_by_the_next_sandbox():
    """A sandbox dropped without its release (whatever the path) leaves a group with a process in it; the next group
    this process makes kills that process and removes the group. Groups still held are left alone."""
    import gc

    held = cgroups.for_sandbox(64 * MB, 16, 1.0)
    dropped = cgroups.for_sandbox(64 * MB, 16, 1.0)
    folders = list(dropped.folders.values())
    process = _sleeping_in(dropped)
    following = None
    try:
        del dropped
        gc.collect()
        following = cgroups.for_sandbox(64 * MB, 16, 1.0)
        assert not any(folder.exists() for folder in folders), "the group no sandbox held was still there"
        assert process.wait(timeout=10) == -9
        assert held.exists() and following.exists(), "a group still held was removed"
    finally:
        process.kill()
        process.wait()
        for group in (held, following):
            if group is not None:
                group.remove()
