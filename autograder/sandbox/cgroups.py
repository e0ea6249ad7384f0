"""One control group per sandbox: what all of a notebook's processes hold and use together, not each alone.

Per-process rlimits (``RLIMIT_AS``, ``RLIMIT_NPROC``) do not bound a sandbox as a whole: forty processes under a
1.5 GB address-space limit each can hold 60 GB together; SysV shared memory and files on tmpfs are held by no
process at all; forty busy processes, each in a session of its own, take every core of the machine from a
classmate graded beside them. The kernel's control groups count a group's processes together, however they were
made, and charge it every page they bring in:

memory
    ``memory.max`` (v1: ``memory.limit_in_bytes``, and the same for memory plus swap, so that swap never extends
    it). Charged: anonymous pages, SysV and POSIX shared memory and tmpfs files (the pages of ``/tmp``,
    ``/dev/shm`` and ``$HOME``, a segment no process holds any more), the page cache of what the sandbox reads and
    writes, and the kernel memory its processes make the kernel allocate. Past it the kernel first reclaims what
    it can (page cache), then its OOM killer kills a process *of this group only*; the grader sees the kill in
    ``memory.events`` (v1: ``memory.oom_control``'s ``oom_kill``) and stops the whole sandbox, which costs that
    notebook, from the cell that was running, and no one else (see :meth:`Group.oom_kills`).
pids
    ``pids.max``: processes and threads of the group together, whatever their uid (``RLIMIT_NPROC`` counts a uid,
    and not root's processes, such as a warm sandbox's zygote).
cpu
    a quota: ``cpu.max`` (v1: ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``) of ``cpus`` cores' time per period,
    however many processes, threads or sessions share it, and an equal weight (``cpu.weight`` / ``cpu.shares``,
    the default): when the machine is busy, each sandbox group gets the same share as any other group or
    process beside it, not one share per process. ``cpus`` is the machine's cores over the grading workers, at
    least one core (:func:`cpu_share`): a sandbox can never take more than its own worker's part of the machine, so
    a classmate graded on another worker keeps its part, and one core is what every lesson is timed on.

A group is made under the grading process's own group (per controller on v1), before the sandbox starts; its
first process writes its own pid into the group's ``cgroup.procs`` and only then becomes ``bwrap`` (see
:data:`ATTACH`), so nothing of the sandbox ever runs outside it and every process it forks is born inside. The
grader's own processes never join one. The group is removed when the sandbox retires, after whatever is left in it
has been killed.

cgroup v2 is used where the grader's group on a ``cgroup2`` mount offers ``cpu``, ``memory`` and ``pids``; else the
v1 hierarchies of those controllers (and ``cpuacct``, for the CPU time used, where it is mounted on its own).
Without root, or without a writable group to make groups under (a v2 machine without delegation), no group can be
made: :func:`hierarchy` says why, the sandbox warns once and runs with its rlimits alone (docs/ARCHITECTURE.md says
what then holds).
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import secrets
import signal
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("autograder")

PERIOD_US = 100_000  # the CPU quota's period: 100 ms, the kernel's default
CONTROLLERS = ("memory", "pids", "cpu")  # what each sandbox's group needs
V1_OPTIONAL = ("cpuacct",)  # v1 only, where it is a hierarchy of its own: the CPU time the group used
PREFIX = "sandbox-"  # sandbox-<grading pid>-<random>: whose group it is, for sweep_stale
LEAF = "autograder"  # v2: the leaf the grader's group's processes move to, so that its subtree may have controllers
READ_BYTES = 4096  # every control file read is bounded: the kernel writes these, but a fake root in a test may not

# The command that puts a sandbox in its group: run as `sh -c ATTACH sandbox-cgroup PROCS... -- BWRAP ARGS...`, it
# writes its own pid into each cgroup.procs (every process it becomes or forks from then on is inside) and execs
# bwrap; it exits 125 without running anything if one write fails.
ATTACH = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


class CgroupUnavailable(RuntimeError):
    """No group can be made for a sandbox here: no root, no writable hierarchy, a controller missing."""


def cpu_share(cores: int | None = None, workers: int = 1) -> float:
    """The cores one sandbox may use: the machine's (this process's affinity) over the grading workers, at least one.

    At least one: a lesson's cells are timed on one core, and a sandbox's kernel runs one cell at a time; more
    than its worker's part would take a classmate's."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1.0, cores / max(1, workers))


def settings(version: int, memory_bytes: int, pids: int, cpus: float) -> dict[str, dict[str, str]]:
    """The files a sandbox's group is limited by, and what is written to them, per controller (in this order)."""
    quota = max(1000, round(PERIOD_US * cpus))
    if version == 2:
        return {"memory": {"memory.max": str(memory_bytes), "memory.swap.max": "0", "memory.oom.group": "1"},
                "pids": {"pids.max": str(pids)},
                "cpu": {"cpu.max": f"{quota} {PERIOD_US}", "cpu.weight": "100"}}
    return {"memory": {"memory.limit_in_bytes": str(memory_bytes), "memory.memsw.limit_in_bytes": str(memory_bytes)},
            "pids": {"pids.max": str(pids)},
            "cpu": {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": str(quota), "cpu.shares": "1024"}}


OPTIONAL_FILES = {"memory.memsw.limit_in_bytes", "memory.swap.max"}  # absent where the kernel has no swap accounting


def _read(path: Path) -> str:
    with open(path, "rb") as handle:
        return handle.read(READ_BYTES).decode("ascii", "replace")


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def keyed(text: str) -> dict[str, int]:
    """A flat-keyed control file (``memory.events``, ``memory.oom_control``, ``pids.events``, ``cpu.stat``) as
    ``{key: value}``; lines that are not ``KEY INTEGER`` are skipped."""
    found = {}
    for line in text.splitlines()[:64]:
        words = line.split()
        if len(words) == 2 and words[1].lstrip("-").isdigit():
            found[words[0]] = int(words[1])
    return found


@dataclass
class Group:
    """One sandbox's group: its folder in each controller's hierarchy (v2: one folder for all)."""

    __hash__ = object.__hash__  # one group is itself only (kept in _UNREMOVED until it is gone)
    __eq__ = object.__eq__

    version: int
    folders: dict[str, Path]  # controller -> folder (v1: memory, pids, cpu and perhaps cpuacct; v2: the same one)
    refused: str = ""  # why the last removal left a folder (for the warning)

    @property
    def name(self) -> str:
        return next(iter(self.folders.values())).name

    def procs_files(self) -> list[Path]:
        """Where a process writes its pid to join the group (each hierarchy's ``cgroup.procs`` once)."""
        return [folder / "cgroup.procs" for folder in dict.fromkeys(self.folders.values())]

    def attach_command(self) -> list[str]:
        """The command prefix that runs a command in this group (see :data:`ATTACH`)."""
        return ["/bin/sh", "-c", ATTACH, "sandbox-cgroup", *map(str, self.procs_files()), "--"]

    def _file(self, controller: str, name: str) -> Path:
        return self.folders[controller] / name

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer killed in this group because it reached its memory limit."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            return keyed(_read(self._file("memory", name))).get("oom_kill", 0)
        except OSError:
            return 0

    def memory_peak(self) -> int:
        """The most memory the group held at once, in bytes (0 where the kernel does not say)."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int(_read(self._file("memory", name)).split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def pids_refused(self) -> int:
        """How many forks or new threads ``pids.max`` refused."""
        try:
            return keyed(_read(self._file("pids", "pids.events"))).get("max", 0)
        except OSError:
            return 0

    def cpu_stat(self) -> dict[str, int]:
        """The CPU quota's counts: ``nr_periods``, ``nr_throttled``, ``throttled_time`` (v1, ns) or
        ``throttled_usec`` (v2), and ``usage_usec``: the CPU time the group used (v1: from ``cpuacct``)."""
        try:
            stat = keyed(_read(self._file("cpu", "cpu.stat")))
        except OSError:
            return {}
        if self.version == 1 and "cpuacct" in self.folders:
            try:
                stat["usage_usec"] = int(_read(self._file("cpuacct", "cpuacct.usage")).split()[0]) // 1000
            except (OSError, ValueError, IndexError):
                pass
        return stat

    def pids(self) -> list[int]:
        """Every process in the group (each hierarchy's, together)."""
        found: set[int] = set()
        for procs in self.procs_files():
            try:
                found.update(int(word) for word in _read(procs).split() if word.isdigit())
            except OSError:
                continue
        return sorted(found)

    def _lift_memory_limit(self) -> None:
        """Before the kill: the group's own memory limit off (the grader's group still bounds it), so that no
        process blocked at the limit (v1 parks tasks in its OOM wait) outlives a SIGKILL."""
        folder = self.folders.get("memory")
        if folder is None:
            return
        names = ("memory.max",) if self.version == 2 else ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes")
        for name in names:  # v1: memory plus swap first, as it may never be below memory alone
            try:
                (folder / name).write_text("max" if self.version == 2 else "-1")
            except OSError:
                pass

    def exists(self) -> bool:
        return any(folder.is_dir() for folder in self.folders.values())

    def remove(self, seconds: float = 15.0) -> list[int]:
        """Kill what is left in the group, then remove it; the pids that would not die in ``seconds``. A group
        that is still there then is not forgotten: every later group made in this process, and its exit, try again
        (:func:`reap_unremoved`), so a process that dies late (the kernel frees what it held first, which a loaded
        machine can take longer than ``seconds`` to do) leaves no group behind."""
        left = self._kill_and_rmdir(seconds)
        if self.exists():
            with _UNREMOVED_LOCK:
                if self not in _UNREMOVED:
                    _UNREMOVED.append(self)
        return left

    def _kill_and_rmdir(self, seconds: float) -> list[int]:
        deadline = time.monotonic() + seconds
        if self.pids():
            self._lift_memory_limit()  # a task waiting in the group's OOM path dies only once it may run again
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.02)
        for folder in dict.fromkeys(self.folders.values()):
            while True:  # a killed process leaves its group a moment after it is reaped
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        self.refused = f"{folder}: {os.strerror(exc.errno or 0)}" + (
                            "" if self.pids() else " with no process listed (one that has ended but was not "
                            "yet waited for still counts)")
                        break
                    time.sleep(0.02)
        return self.pids()


@dataclass(frozen=True)
class Hierarchy:
    """Where sandbox groups are made: the grading process's own group in each controller's hierarchy."""

    version: int
    parents: dict[str, Path]  # controller -> the grading process's group (v2: one folder for all)

    def create(self, memory_bytes: int, pids: int, cpus: float) -> Group:
        """Make a group for one sandbox and write its limits; :class:`CgroupUnavailable` (nothing left behind)
        when that fails."""
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        folders = {controller: parent / name for controller, parent in self.parents.items()}
        group = Group(self.version, folders)
        with _UNREMOVED_LOCK:
            _LIVE.add(group)  # before its folders exist: sweep_orphans never takes a group being made
        try:
            for folder in dict.fromkeys(folders.values()):
                folder.mkdir()
            for controller, files in settings(self.version, memory_bytes, pids, cpus).items():
                for file, value in files.items():
                    path = folders[controller] / file
                    if file in OPTIONAL_FILES and not path.exists() and (folders[controller] / "cgroup.procs").exists():
                        continue
                    _write(path, value)
        except OSError as exc:
            group.remove()
            raise CgroupUnavailable(f"cannot make the sandbox's control group {name}: {exc}") from exc
        return group

    def sweep_orphans(self) -> list[str]:
        """Kill and remove this process's groups that no :class:`Group` object holds any more (a sandbox dropped
        without its release, whatever the path): no group of a grading process outlives its sandbox."""
        mine = f"{PREFIX}{os.getpid()}-"
        with _UNREMOVED_LOCK:
            held = {group.name for group in _LIVE} | {group.name for group in _UNREMOVED}
        orphans: dict[str, dict[str, Path]] = {}
        for controller, parent in self.parents.items():
            try:
                names = [entry.name for entry in os.scandir(parent) if entry.name.startswith(mine)]
            except OSError:
                continue
            for name in names:
                if name not in held:
                    orphans.setdefault(name, {})[controller] = parent / name
        swept = []
        for name, folders in orphans.items():
            group = Group(self.version, folders)
            group._kill_and_rmdir(1.0)
            if group.exists():
                log.warning("the control group %s, left by a sandbox of this process, is still there (%s)", name,
                            group.refused or f"processes {group.pids()}")
            else:
                swept.append(name)
        return swept

    def sweep_stale(self) -> list[str]:
        """Remove the (empty) groups of sandboxes whose grading process is gone: it was killed before it could
        remove them. Their processes went with it (bwrap dies with its parent)."""
        swept = []
        for folder in dict.fromkeys(self.parents.values()):
            try:
                names = [entry.name for entry in os.scandir(folder) if entry.name.startswith(PREFIX)]
            except OSError:
                continue
            for name in names:
                pid = name[len(PREFIX):].split("-")[0]
                if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                    try:
                        (folder / name).rmdir()
                        swept.append(str(folder / name))
                    except OSError:
                        pass
        return swept


def _mounts(mountinfo: str) -> dict[str, tuple[str, str]]:
    """``/proc/self/mountinfo`` -> {controller or "cgroup2": (mount point, the mount's root in the hierarchy)}."""
    found: dict[str, tuple[str, str]] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 10:
            continue
        after = line.split(" - ", 1)[1].split()
        if len(after) < 3:
            continue
        fstype, options = after[0], after[2].split(",")
        point, root = fields[4].replace("\\040", " "), fields[3]
        if fstype == "cgroup2":
            found.setdefault("cgroup2", (point, root))
        elif fstype == "cgroup":
            for option in options:
                if option in CONTROLLERS + V1_OPTIONAL:
                    found.setdefault(option, (point, root))
    return found


def _own_groups(proc_cgroup: str) -> dict[str, str]:
    """``/proc/self/cgroup`` -> {controller or "cgroup2": the grading process's group path}."""
    found = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        if number == "0" and controllers == "":
            found["cgroup2"] = path
        for controller in controllers.split(","):
            if controller in CONTROLLERS + V1_OPTIONAL:
                found[controller] = path
    return found


def _folder(mount: tuple[str, str], path: str) -> Path:
    point, root = mount
    relative = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
    return Path(point) / ("" if relative == "." else relative)


def find(proc_cgroup: str, mountinfo: str) -> Hierarchy:
    """The hierarchy to make sandbox groups in, from the texts of ``/proc/self/cgroup`` and ``/proc/self/mountinfo``:
    v2 where the grading process's cgroup2 group offers every controller, else v1; :class:`CgroupUnavailable`
    saying why when neither does. Nothing is written."""
    mounts, own = _mounts(mountinfo), _own_groups(proc_cgroup)
    why = ""
    if "cgroup2" in mounts and "cgroup2" in own:
        parent = _folder(mounts["cgroup2"], own["cgroup2"])
        try:
            offered = _read(parent / "cgroup.controllers").split()
        except OSError:
            offered = []
        if all(c in offered for c in CONTROLLERS):
            return Hierarchy(2, dict.fromkeys(CONTROLLERS, parent))
        missing = [c for c in CONTROLLERS if c not in offered]
        why = (f"the grader's cgroup v2 group {parent} does not offer {', '.join(missing)} (grade in a group "
               "delegated to the grader, e.g. systemd's Delegate=yes)")
    missing = [c for c in CONTROLLERS if c not in mounts or c not in own]
    if missing:
        raise CgroupUnavailable(why or f"no cgroup hierarchy of {', '.join(missing)} is mounted")
    return Hierarchy(1, {c: _folder(mounts[c], own[c]) for c in CONTROLLERS + V1_OPTIONAL if c in mounts and c in own})


def enable_v2(parent: Path) -> None:
    """Let ``parent``'s children have every controller of :data:`CONTROLLERS` (``cgroup.subtree_control``).

    A v2 group with processes of its own cannot hand controllers to its children (the "no internal processes"
    rule): its processes (the grader's, in a group delegated to it) first move into a leaf of their own,
    :data:`LEAF`, beside the sandboxes' groups."""
    wanted = " ".join(f"+{c}" for c in CONTROLLERS)
    try:
        enabled = _read(parent / "cgroup.subtree_control").split()
    except OSError:
        enabled = []
    if all(c in enabled for c in CONTROLLERS):
        return
    try:
        _write(parent / "cgroup.subtree_control", wanted)
        return
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
    leaf = parent / LEAF
    leaf.mkdir(exist_ok=True)
    for pid in _read(parent / "cgroup.procs").split():
        try:
            _write(leaf / "cgroup.procs", pid)
        except OSError:
            pass  # it ended meanwhile
    _write(parent / "cgroup.subtree_control", wanted)


_HIERARCHY: list[Hierarchy | str] = []  # once per process: the hierarchy, or why there is none


def hierarchy() -> Hierarchy | None:
    """This machine's hierarchy for sandbox groups, found once per process; None (and one warning, saying why and
    what holds instead) where no group can be made."""
    if not _HIERARCHY:
        try:
            if os.geteuid() != 0:
                raise CgroupUnavailable("the grader does not run as root")
            with open("/proc/self/cgroup") as cgroup, open("/proc/self/mountinfo") as mountinfo:
                found = find(cgroup.read(), mountinfo.read())
            if found.version == 2:
                enable_v2(found.parents["memory"])
            found.sweep_stale()
            _HIERARCHY.append(found)
        except (CgroupUnavailable, OSError) as exc:
            _HIERARCHY.append(str(exc))
            log.warning("sandboxes run without a control group of their own (%s): each process keeps its rlimits, "
                        "but nothing bounds a sandbox's memory, processes and CPU as a whole (see "
                        "docs/ARCHITECTURE.md, The sandbox)", exc)
    found = _HIERARCHY[0]
    return found if isinstance(found, Hierarchy) else None


_UNREMOVED: list[Group] = []  # groups whose removal found processes still dying: tried again (reap_unremoved)
_UNREMOVED_LOCK = threading.Lock()
_LIVE: weakref.WeakSet[Group] = weakref.WeakSet()  # every group this process made whose object is still held


def reap_unremoved(seconds: float = 1.0) -> list[Group]:
    """Kill and remove the groups an earlier :meth:`Group.remove` had to leave (each waits at most ``seconds``); the
    groups still there. Called before every new group and when the grading process exits."""
    with _UNREMOVED_LOCK:
        waiting = list(_UNREMOVED)
    for group in waiting:
        group._kill_and_rmdir(seconds)
    with _UNREMOVED_LOCK:
        _UNREMOVED[:] = [group for group in _UNREMOVED if group.exists()]
        left = list(_UNREMOVED)
    for group in left:
        log.warning("the control group %s is still there (%s)", group.name,
                    group.refused or f"its processes {group.pids()} have not died yet")
    return left


atexit.register(reap_unremoved, 15.0)


def for_sandbox(memory_bytes: int, pids: int, cpus: float) -> Group | None:
    """A new group for one sandbox with these limits, or None where groups cannot be made (warned once). Groups an
    earlier removal had to leave are removed first (:func:`reap_unremoved`), and so are this process's groups that
    no sandbox holds any more (:meth:`Hierarchy.sweep_orphans`)."""
    found = hierarchy()
    if found is None:
        return None
    if _UNREMOVED:
        reap_unremoved()
    found.sweep_orphans()
    try:
        return found.create(memory_bytes, pids, cpus)
    except CgroupUnavailable as exc:
        log.warning("%s: this sandbox runs with its rlimits alone", exc)
        return None


__all__ = ["ATTACH", "CgroupUnavailable", "Group", "Hierarchy", "cpu_share", "enable_v2", "find", "for_sandbox",
           "hierarchy", "keyed", "reap_unremoved", "settings"]
