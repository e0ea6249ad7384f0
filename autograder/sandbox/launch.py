"""The student's kernel runs inside a bubblewrap sandbox: what it may see, write and use, and how it is stopped.

One :class:`Sandbox` per graded notebook, or, grading as root, one
:class:`~autograder.sandbox.warm.WarmSandbox` per student: the same bwrap sandbox, whose first process is a root
*zygote* (:mod:`autograder.sandbox.zygote`) that imported the lessons' libraries once and forks each of the
student's notebooks a kernel (see that class for what is reset between two notebooks).
:class:`~autograder.sandbox.kernel.SandboxedKernelManager` is jupyter_client's kernel manager with one change: the
kernel command is wrapped in ``bwrap`` (see :meth:`Sandbox.command`), or the kernel is the zygote's fork.
nbclient, nbgrader and the kernel itself are unchanged; ``TrustedExecute`` builds the sandbox and hands its kernel
manager to nbclient.

Inside the sandbox
    - no network (``--unshare-net``): the kernel's ZMQ channels use the ``ipc`` transport, socket files in the
      notebook's scratch folder, bound at the same path inside and out;
    - its own pid, IPC and UTS namespaces, a new session; ``/proc`` shows only the sandbox;
    - read-only: ``/usr`` (and the ``/bin``, ``/lib`` links), a few files of ``/etc``, the Python installation,
      the virtual environment and the companion package ``decoder_course``. Nothing else of the host exists:
      not ``autograder/``, ``solutions/``, the work folder (gradebook, secret, other students' notebooks) nor
      the instructor's submissions;
    - writable: ``/home/student`` (cwd and ``$HOME``), ``/tmp`` and ``/dev/shm``, the harvest folder's
      ``outputs/`` (``cases/`` is read-only) and the kernel's socket folder: nothing else, and each of them on a
      file system with its own cap (see *The writable space* below);
    - a clean environment (``--clearenv``): no secret, no path of the grading process;
    - a default-deny syscall profile (:func:`seccomp_program`, built with libseccomp: see
      :mod:`autograder.sandbox.syscall_profile`) that the launcher loads before anything of the notebook runs, or
      nothing
      runs: no kernel keyring, ``bpf``, ``perf_event_open``, ``userfaultfd``, tracing, mounting, new namespaces
      (in a user namespace a process would hold every capability and could mount a file system of its own past
      every cap below), ``kexec``, ...;
    - its own uid (as root): no two live sandboxes share one (:func:`lease_uid`), and no account owns it;
    - its own IPC namespace per kernel, in a warm sandbox too (the zygote's child unshares one before it drops
      to the sandbox uid): SysV shared memory, semaphores and message queues and POSIX message queues go with the
      notebook's last process; POSIX shared memory lives in ``/dev/shm``, emptied between two notebooks.

The writable space
    Grading as root, every path the kernel can write lies on a tmpfs that the grader mounts for this sandbox
    alone (:func:`mount_tmpfs`) with ``size=`` and ``nr_inodes=``: one for ``$HOME``, ``/tmp`` and ``/dev/shm``
    together (``Limits.tmpfs_bytes``), one for the harvest outputs (``Limits.scratch_bytes``), a tiny one for the
    kernel's sockets and one, never bound inside, for the kernel's stderr. The kernel enforces the caps: a write,
    an ``fallocate`` or a new file past one fails with ``ENOSPC`` in the student's own code; a sparse file's
    holes take nothing; a tree however deep or wide stops at the inode cap; what the notebook leaves behind is
    still on the capped file system until it is unmounted (``MNT_DETACH``: nothing is walked). The grader never
    walks these trees to enforce anything: it asks the kernel (``statvfs``, O(1)) whether a cap was reached, to
    say so in the log, and whether a warm sandbox is back to its fresh state, else retires it. Without root the
    grader cannot mount: ``$HOME``, ``/tmp`` and ``/dev/shm`` are tmpfs that bwrap mounts with ``--size``
    (no inode cap), and the two host folders bound inside are watched (``Limits.scratch_bytes``, by the blocks
    they take): grade as root for the guarantees above.

Limits
    The kernel's first process (:data:`_LAUNCHER`) sets rlimits, then, when grading runs as root, drops to an
    unprivileged uid of its own (``uid`` below) so that ``RLIMIT_NPROC`` applies (root is exempt from it): CPU
    seconds, address space, processes, file size, no core dumps. nbclient's per-cell timeout interrupts a cell;
    a watchdog thread kills the whole sandbox past the notebook's deadline or when the scratch folder outgrows
    its cap. Killing the outer ``bwrap`` (``--die-with-parent``) tears down the pid namespace, which kills every
    process in it, however it was forked; :meth:`Sandbox.kill` then checks that nothing survived. As root, every
    process of the sandbox is also in a control group of its own (:mod:`autograder.sandbox.cgroups`, made by
    :meth:`Sandbox.prepare`, joined before bwrap runs: :meth:`Sandbox.command`), which bounds their memory (shared
    memory and tmpfs pages included), processes and CPU together; the watchdog stops the sandbox when the kernel's
    OOM killer acted in it (:meth:`Sandbox.note_memory`).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import decoder_course
from autograder.sandbox import cgroups, syscall_profile
from autograder.sandbox import uids as sandbox_uids

UNAVAILABLE = "bubblewrap is not available: install it, or pass --no-sandbox to grade without one (unsafe)"
HOME = "/home/student"  # the kernel's cwd and $HOME inside the sandbox
HARVEST = "/harvest"  # the harvest folder inside the sandbox ($DECODER_COURSE_HARVEST)
# Environment variables passed from the grading process to the kernel: rendering and thread settings only.
PASS_ENV = ("LANG", "LC_ALL", "TZ", "MPLBACKEND", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
            "NBGRADER_EXECUTION")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "passwd", "group",
             "fonts", "mime.types", "matplotlibrc")
MPLCONFIG = f"{HOME}/.config/matplotlib"  # $MPLCONFIGDIR inside the sandbox: on the fresh tmpfs of $HOME


@functools.cache
def font_cache() -> Path | None:
    """matplotlib's font list, built once per machine and matplotlib version, outside any sandbox.

    Every sandbox starts with an empty ``$HOME``, where matplotlib would rebuild its font list on the first
    ``import matplotlib.pyplot`` (about 0.2 s of every graded notebook). The list is built here instead, with an
    empty ``$HOME`` (so only the fonts of ``/usr`` and of matplotlib itself, which every sandbox sees at the same
    paths), and bound read-only into each sandbox's ``$MPLCONFIGDIR``. None when it cannot be built: each kernel
    then builds its own, as before.
    """
    try:
        import matplotlib
    except ImportError:
        return None
    folder = Path(tempfile.gettempdir()) / f"decoder-course-mpl-{os.getuid()}-{matplotlib.__version__}"
    if folder.is_dir():
        info = folder.lstat()
        if folder.is_symlink() or info.st_uid != os.getuid() or info.st_mode & 0o022:
            return None  # someone else's (in a shared /tmp): never hand a kernel a list another user wrote
        found = sorted(folder.glob("fontlist-v*.json"))
        return found[-1] if found else None
    staging = Path(tempfile.mkdtemp(prefix=".mpl-", dir=folder.parent))
    try:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(staging), "MPLCONFIGDIR": str(staging), "LANG": "C.UTF-8"}
        subprocess.run([sys.executable, "-s", "-c", "import matplotlib.font_manager"], env=env, timeout=120,
                       check=True, capture_output=True)
        if not list(staging.glob("fontlist-v*.json")):
            return None
        try:
            staging.rename(folder)  # atomic: another worker's copy may have landed first, which is as good
        except OSError:
            pass
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return font_cache.__wrapped__() if folder.is_dir() else None  # checked as any found folder is


@dataclass(frozen=True)
class Limits:
    """What one notebook may use. The defaults suit every lesson on a 2-core CPU; tests set tighter ones. The
    three times are an idle machine's: each notebook stretches them by the machine's :func:`slowdown`."""

    cell_timeout: int = 120  # s per cell (nbclient), then the cell is interrupted
    interrupt_grace: int = 4  # s for an interrupted cell to stop before the sandbox is killed
    deadline: float = 900.0  # s for the whole notebook from kernel start, then the sandbox is killed
    cpu_seconds: int = 1200  # RLIMIT_CPU of each sandbox process
    memory_bytes: int = 6 << 30  # RLIMIT_AS (address space) of each sandbox process
    processes: int = 256  # RLIMIT_NPROC: processes and threads of the sandbox together
    file_bytes: int = 128 << 20  # RLIMIT_FSIZE: largest file a sandbox process may write
    tmpfs_bytes: int = 256 << 20  # /home/student, /tmp and /dev/shm together (as root; else each)
    scratch_bytes: int = 256 << 20  # the harvest outputs (a tmpfs of their own as root; else watched)
    inodes: int = 20_000  # files and folders on each writable file system (as root)
    output_bytes: int = 16 << 20  # bytes of kernel messages one notebook may store (outputs, widgets, updates)
    cell_output_bytes: int = 4 << 20  # the same for one cell; also the largest message frame the grader accepts
    notebook_bytes: int = 16 << 20  # submitted notebooks larger than this are refused before grading
    # The sandbox's control group (as root: see autograder.sandbox.cgroups), all of its processes together:
    sandbox_memory_bytes: int = 4 << 30  # memory, shared memory and tmpfs pages, page cache; past it: stopped
    sandbox_pids: int = 0  # processes and threads (pids.max); 0: processes + PIDS_SPARE
    cpus: float = 0.0  # cores of CPU time per period; 0: cgroups.cpu_share() (grade_many: cores / its workers)


PIDS_SPARE = 4  # a sandbox's processes besides the student's: the outer bwrap, its init, the zygote
PROBE_CPU_SECONDS = 0.05  # CPU time :func:`slowdown`'s busy loop gets; its wall time is the measurement
MAX_SLOWDOWN = 8.0  # limits stretch no further: a machine this busy should not grade (a timeout says so)


def slowdown(probe_cpu_seconds: float = PROBE_CPU_SECONDS) -> float:
    """How many times longer than on an idle machine CPU-bound work takes here now, from 1 to
    :data:`MAX_SLOWDOWN`. Measured before each notebook; its cell timeout, interrupt grace and deadline are
    stretched by it, so that a machine busy with other work (other graders, a neighbour's CI job) turns no
    slow-but-correct cell, the canary's above all, into a timeout. ``cpu_seconds`` is not stretched: a busy machine
    costs no more CPU.

    The busier of two views: the run queue of the last minute (the load average per CPU this process may use:
    six runnable processes on two CPUs get a third of one each), and this thread's share of a core right now (the
    wall time of a busy loop over the CPU time it got: a cgroup's CPU quota shows there, and a load that has just
    begun). Neither alone will do: the scheduler may leave the probe a core of its own while the kernel, another
    process, shares the other, and the load average lags."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    queued = os.getloadavg()[0] / max(cpus, 1)
    wall, cpu = time.perf_counter(), time.thread_time()
    while time.thread_time() - cpu < probe_cpu_seconds:
        sum(range(2000))
    share = (time.perf_counter() - wall) / max(time.thread_time() - cpu, 1e-9)
    return round(min(MAX_SLOWDOWN, max(1.0, queued, share)), 2)


def stretch_note(seconds: float, factor: float) -> str:
    """How a stretched time limit came about, after its value: "" or " (120 s × 2.5, this machine's measured
    slowdown)"."""
    return f" ({seconds:g} s × {factor:g}, this machine's measured slowdown)" if factor > 1.0 else ""


def memory_note(limit_bytes: int) -> str:
    """What the log says when a notebook's sandbox reached its memory limit (see :meth:`Sandbox.note_memory`)."""
    return (f"the notebook's processes together reached the sandbox's memory limit ({limit_bytes / 2**20:g} MB: "
            "memory, shared memory and the files of /tmp, /dev/shm and $HOME together): the kernel's OOM killer "
            "ended one of them and the sandbox was stopped")


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces here."""


def bwrap() -> str | None:
    return shutil.which("bwrap")


# -- capped file systems (grading as root) ------------------------------------------------------------------------
_LIBC = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2
KERNEL_DIR_BYTES, LOG_BYTES = 1 << 20, 1 << 20  # sockets and a connection file; the kernel's stderr
_MOUNTED: set[str] = set()  # every tmpfs this process mounted and has not unmounted yet
_MOUNTED_LOCK = threading.Lock()


def mount_tmpfs(target: Path, size: int, inodes: int, mode: int = 0o700) -> None:
    """Mount a fresh tmpfs on ``target`` that holds at most ``size`` bytes and ``inodes`` files and folders.

    The kernel enforces both: fallocate is charged as writing is, holes are not, and a file or folder past the
    inode cap cannot be made. No set-uid bit or device node on it means anything."""
    options = f"size={size},nr_inodes={inodes},mode={mode:o}".encode()
    if _LIBC.mount(b"tmpfs", os.fsencode(target), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
        errno = ctypes.get_errno()
        raise SandboxUnavailable(f"cannot mount the sandbox's capped tmpfs on {target}: {os.strerror(errno)} "
                                 "(grading as root needs the right to mount: CAP_SYS_ADMIN)")
    with _MOUNTED_LOCK:
        _MOUNTED.add(str(target))


def unmount(target: Path | str) -> None:
    """Detach a tmpfs :func:`mount_tmpfs` made: its files go with the last process that still holds one open,
    and nothing is walked (a tree too deep to walk goes as fast as an empty one)."""
    with _MOUNTED_LOCK:
        if str(target) not in _MOUNTED:
            return
        _MOUNTED.discard(str(target))
    _LIBC.umount2(os.fsencode(target), _MNT_DETACH)


OWNER = ".owner"  # in a scratch folder with capped mounts: the pid and start time of the process that made them


def _started(pid: int) -> str:
    fields = _stat_fields(pid)
    return fields[19] if len(fields) > 19 else ""


def sweep_stale() -> list[str]:
    """Unmount the capped file systems of sandboxes whose grading process is gone (it was killed before it could
    retire them): their scratch folder's :data:`OWNER` names a pid that no longer runs, or runs another program.
    Called as each grading process starts (:func:`check_available`); the mounts it unmounted."""
    swept = []
    try:
        with open("/proc/mounts") as handle:
            targets = [line.split()[1] for line in handle if line.split()[2:3] == ["tmpfs"]]
    except OSError:
        return swept
    for target in targets:
        path = Path(target.replace("\\040", " "))
        for scratch in (path.parent, path.parent.parent):
            try:
                pid, started = (scratch / OWNER).read_text().split()
            except (OSError, ValueError):
                continue
            if not pid.isdigit() or _started(int(pid)) == started:
                break  # its owner still runs
            _LIBC.umount2(os.fsencode(path), _MNT_DETACH)
            swept.append(str(path))
            break
    return swept


@atexit.register
def unmount_all() -> None:
    """At exit: no tmpfs of this process outlives it, whatever stopped its sandboxes."""
    for target in sorted(_MOUNTED, reverse=True):
        unmount(target)


@dataclass(frozen=True)
class Usage:
    """What a file system holds, as the kernel counts it (``statvfs``): no walk."""

    used_bytes: int
    used_inodes: int
    full: bool  # no byte or no inode left


def usage(path: Path | str) -> Usage | None:
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    return Usage((info.f_blocks - info.f_bfree) * info.f_frsize, info.f_files - info.f_ffree,
                 info.f_bavail == 0 or info.f_favail == 0)


@functools.lru_cache(maxsize=1)
def _probe() -> str:
    """'' when a sandbox can start here, else why not (cached: asked once per process)."""
    exe = bwrap()
    if exe is None:
        return "the `bwrap` command was not found"
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as tmp:
        box = Sandbox(Path(tmp), Limits())
        try:
            box.prepare()
            done = subprocess.run(box.command([sys.executable, "-c", "pass"]), env=box.outer_env(),
                                  cwd=tmp, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError, SandboxUnavailable) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            box.release()
    if done.returncode != 0:
        return (done.stderr or done.stdout or f"exit status {done.returncode}").strip()[-500:]
    return ""


def check_available() -> None:
    """Raise :class:`SandboxUnavailable` with a clear message unless a sandbox can start on this machine; as root,
    first unmount what killed grading processes left (:func:`sweep_stale`)."""
    if os.geteuid() == 0:
        sweep_stale()
    why = _probe()
    if why:
        raise SandboxUnavailable(f"{UNAVAILABLE}. ({why})")


# -- the syscall profile (seccomp) and the sandbox's uid --------------------------------------------------------
def seccomp_program(kind: str = "kernel") -> bytes:
    """The sandbox's syscall profile for this machine as a BPF program (:mod:`autograder.sandbox.syscall_profile`: a
    default-deny allow-list built with libseccomp); ``kind`` "zygote" for a warm sandbox's zygote. Raises
    :class:`SandboxUnavailable` when it cannot be built: nothing runs without it."""
    try:
        return syscall_profile.program(kind)
    except syscall_profile.ProfileUnavailable as exc:
        raise SandboxUnavailable(str(exc)) from exc


def lease_uid() -> sandbox_uids.UidLease:
    """A uid of the new sandbox's own (:mod:`autograder.sandbox.uids`), or :class:`SandboxUnavailable`."""
    try:
        return sandbox_uids.lease()
    except sandbox_uids.NoUidLeft as exc:
        raise SandboxUnavailable(str(exc)) from exc


# The sandbox's first process: rlimits, then (as root) the sandbox's uid, then the syscall profile (it refuses to
# run anything without it: see seccomp_program), then exec the kernel (or a warm sandbox's zygote).
# argv: -c CODE LIMITS_JSON KERNEL_ARGV...
_LAUNCHER = syscall_profile.LOADER + r"""
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
for name, value in cfg["rlimits"].items():
    if cfg.get("zygote") and name == "RLIMIT_AS":
        continue  # a zygote's kernels get it, above what the zygote imported
    resource.setrlimit(getattr(resource, name), (value, value + (5 if name == "RLIMIT_CPU" else 0)))
if os.getuid() == 0 and not cfg.get("zygote"):  # a zygote stays root: each kernel it forks drops to the uid
    uid = cfg["uid"]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
refused = load_seccomp(cfg["seccomp"])
if refused:
    sys.exit(f"sandbox: {refused}: nothing runs without it")
os.umask(0o077)
os.execv(sys.argv[2], sys.argv[2:])
"""


@dataclass
class Sandbox:
    """One notebook's sandbox: its scratch folder, its command line, its watchdog and its end."""

    scratch: Path  # host folder, removed by the caller
    limits: Limits
    uid: int = -1  # the sandbox's own (:func:`lease_uid`), unless given
    events: list[str] = field(default_factory=list)  # what happened, in words, for the log and the instructor
    process: subprocess.Popen | None = None
    pid_ns: str = ""
    slowdown: float = 1.0  # this notebook's deadline is limits.deadline times this (see :func:`slowdown`)
    deadline_hit: bool = False  # this notebook's kernel was killed at its deadline
    _stop: threading.Event = field(default_factory=threading.Event)
    _watchdog: threading.Thread | None = None
    _started: float = 0.0
    _noted_others: bool = False
    uid_lease: sandbox_uids.UidLease | None = None
    cgroup: cgroups.Group | None = None  # as root: all of the sandbox's processes (prepare, release)
    memory_hit: bool = False  # the sandbox's memory limit was reached: its kernel was stopped
    _oom_seen: int = 0  # the group's OOM kills before this notebook

    def __post_init__(self) -> None:
        if self.uid < 0:
            self.uid_lease = lease_uid()
            self.uid = self.uid_lease.uid

    @property
    def root_mode(self) -> bool:
        return os.geteuid() == 0

    @property
    def harvest(self) -> Path:
        """The host side of the harvest folder: ``cases/`` (read-only inside) and ``outputs/``."""
        return self.scratch / "harvest"

    @property
    def kernel_dir(self) -> Path:
        """Connection file and ZMQ ipc sockets, bound at the same path inside."""
        return self.scratch / "kernel"

    @property
    def log_path(self) -> Path:
        return self.scratch / "log" / "kernel.log"

    @property
    def space(self) -> Path:
        """As root, the host side of ``$HOME``, ``/tmp`` and ``/dev/shm``: folders of one capped tmpfs."""
        return self.scratch / "space"

    def capped(self) -> dict[str, tuple[Path, int, int]]:
        """What the kernel can write, by the words the log uses: (host folder, bytes, inodes) of each tmpfs."""
        lim = self.limits
        return {f"{HOME}, /tmp and /dev/shm": (self.space, lim.tmpfs_bytes, lim.inodes),
                "the harvest outputs": (self.harvest / "outputs", lim.scratch_bytes, lim.inodes),
                "the kernel's socket folder": (self.kernel_dir, KERNEL_DIR_BYTES, 64),
                "the kernel's error log": (self.log_path.parent, LOG_BYTES, 8)}

    # -- folders ---------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Make the scratch folders, as root each writable one a capped tmpfs; call before writing the cases
        (again: nothing changes)."""
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.scratch.chmod(0o711)  # the sandbox uid may traverse it, not list it
        self.harvest.mkdir(exist_ok=True)
        (self.harvest / "cases").mkdir(exist_ok=True)
        for folder, size, inodes in self.capped().values():
            if folder == self.space and not self.root_mode:
                continue
            if not folder.is_dir():
                folder.mkdir()
                if self.root_mode:
                    (self.scratch / OWNER).write_text(f"{os.getpid()} {_started(os.getpid())}")
                    mount_tmpfs(folder, size, inodes)
        if self.root_mode:
            for name, mode in (("home", 0o700), ("tmp", 0o1777), ("shm", 0o1777)):
                (self.space / name).mkdir(exist_ok=True)
                (self.space / name).chmod(mode)
            self.space.chmod(0o755)
            os.chown(self.space / "home", self.uid, self.uid)
        self.join_cgroup()

    def seal(self) -> None:
        """After the cases are written: the sandbox uid owns what it may write, and only that."""
        for path in (self.harvest, self.harvest / "cases"):
            path.chmod(0o755)
        for path in (self.harvest / "cases").iterdir():
            path.chmod(0o444)
        for path in (self.kernel_dir, self.harvest / "outputs"):
            path.chmod(0o700)
            if self.root_mode:
                os.chown(path, self.uid, self.uid)

    def release(self) -> None:
        """Unmount this sandbox's capped file systems (lazily: nothing is walked); then the scratch folder can
        go. Call once no process of the sandbox runs."""
        for folder, _, _ in self.capped().values():
            unmount(folder)
        self.leave_cgroup()  # first: what is left of the sandbox is killed, so its uid can go back
        if self.uid_lease is not None and not sandbox_uids.running(self.uid):
            self.uid_lease.release()  # else kept (until this process ends): no other sandbox gets that uid

    # -- the control group (autograder.sandbox.cgroups) --------------------------------------------------------------
    def join_cgroup(self) -> None:
        """Make this sandbox's control group (once), unless groups cannot be made here (then warned once): every
        process :meth:`command` starts is in it from its first instruction."""
        if self.cgroup is None:
            lim = self.limits
            self.cgroup = cgroups.for_sandbox(lim.sandbox_memory_bytes, lim.sandbox_pids or lim.processes + PIDS_SPARE,
                                              lim.cpus or cgroups.cpu_share())
            self._oom_seen = 0

    def leave_cgroup(self) -> None:
        """Kill what is left in the group and remove it."""
        if self.cgroup is not None:
            if left := self.cgroup.remove():
                self.events.append(f"processes of the sandbox survived the kill: {left}")
            self.cgroup = None

    def out_of_memory(self) -> bool:
        """The kernel's OOM killer killed a process of this sandbox, since this notebook began, because the
        sandbox as a whole reached ``Limits.sandbox_memory_bytes``."""
        return self.cgroup is not None and self.cgroup.oom_kills() > self._oom_seen

    def note_memory(self) -> None:
        """Say (once) that the notebook reached the sandbox's memory limit: the cause of the kernel's end."""
        if self.out_of_memory() and not self.memory_hit:
            self.memory_hit = True
            self.events.append(memory_note(self.limits.sandbox_memory_bytes))

    def full(self) -> list[str]:
        """The capped file systems the notebook filled (no byte or no inode left), in words; as root only."""
        if not self.root_mode:
            return []
        said = []
        for what, (folder, size, inodes) in self.capped().items():
            used = usage(folder)
            if used is not None and used.full:
                said.append(f"the notebook filled {what} (cap {size / 2**20:g} MB, {inodes} files and folders): "
                            "its writes past the cap failed")
        return said

    def give(self, path: Path | str) -> None:
        """Let the sandbox uid read a file the grading process wrote (the connection file)."""
        if self.root_mode:
            os.chown(path, self.uid, self.uid)

    # -- the command -----------------------------------------------------------------------------------------
    def read_only_paths(self) -> list[str]:
        """Host folders the kernel may read: the Python installation, the virtualenv, the companion package."""
        paths = {sys.base_prefix, sys.prefix, str(Path(decoder_course.__file__).resolve().parent),
                 str(Path(sys.executable).resolve().parent.parent)}
        kept = []
        for path in sorted(paths):
            if path.startswith("/usr/") or path == "/usr":
                continue
            if any(path.startswith(other + "/") for other in paths if other != path):
                continue  # inside another bound folder
            kept.append(path)
        private = Path(__file__).resolve().parents[1]  # autograder/: references, checks, this file
        for path in kept:
            if private == Path(path) or Path(path) in private.parents:
                raise SandboxUnavailable(f"the sandbox would expose {private} through {path}; install the course "
                                         "package (decoder_course) outside the repository's root")
        return kept

    def command(self, kernel_argv: list[str], zygote: bool = False) -> list[str]:
        """The bwrap command line that runs ``kernel_argv`` inside this sandbox (as the sandbox uid, unless it is
        a warm sandbox's ``zygote``, which stays root so that no kernel can signal it)."""
        lim = self.limits
        # its group first: see autograder.sandbox.cgroups
        args = [*(self.cgroup.attach_command() if self.cgroup else ()),
                bwrap() or "bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent", "--new-session",
                "--clearenv"]
        if not self.root_mode:  # as root, the launcher keeps the capabilities to drop to the sandbox uid
            args += ["--unshare-user", "--cap-drop", "ALL"]
        args += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        # /etc made explicitly with 0755: a parent bwrap creates on its own is not searchable by the sandbox uid,
        # and then fontconfig, passwd and ld.so.cache are invisible (matplotlib printed a fontconfig error).
        args += ["--perms", "0755", "--dir", "/etc"]
        for name in ETC_FILES:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        # The private filesystems first: a bound folder below /tmp or /home must not be hidden by them.
        args += ["--proc", "/proc", "--dev", "/dev"]
        if self.root_mode:  # the folders of this sandbox's capped tmpfs (prepare)
            args += ["--bind", str(self.space / "shm"), "/dev/shm", "--bind", str(self.space / "tmp"), "/tmp",
                     "--perms", "0755", "--dir", "/home", "--bind", str(self.space / "home"), HOME]
        else:  # bwrap's own tmpfs: a size cap each, no inode cap
            size = str(lim.tmpfs_bytes)
            args += ["--perms", "1777", "--size", size, "--tmpfs", "/dev/shm",
                     "--perms", "1777", "--size", size, "--tmpfs", "/tmp",
                     "--perms", "0755", "--dir", "/home",
                     "--perms", "0777", "--size", size, "--tmpfs", HOME]
        made: set[str] = {"/", "/usr", "/etc", "/proc", "/dev", "/dev/shm", "/tmp", "/home", HOME}
        for path in self.read_only_paths():
            args += self._parents(path, made) + ["--ro-bind", path, path]
        kernel = str(self.kernel_dir)
        args += self._parents(kernel, made) + ["--bind", kernel, kernel]
        fonts = font_cache()
        if fonts is not None:  # matplotlib's font list, read-only in its (otherwise writable) config folder
            args += ["--perms", "0755", "--dir", f"{HOME}/.config", "--perms", "0777", "--dir", MPLCONFIG,
                     "--ro-bind", str(fonts), f"{MPLCONFIG}/{fonts.name}"]
        args += ["--perms", "0755", "--dir", HARVEST,
                 "--ro-bind", str(self.harvest / "cases"), f"{HARVEST}/cases",
                 "--bind", str(self.harvest / "outputs"), f"{HARVEST}/outputs",
                 "--remount-ro", "/", "--chdir", HOME]
        for name, value in self.inner_env().items():
            args += ["--setenv", name, value]
        rlimits = {"RLIMIT_CPU": lim.cpu_seconds, "RLIMIT_AS": lim.memory_bytes, "RLIMIT_NPROC": lim.processes,
                   "RLIMIT_FSIZE": lim.file_bytes, "RLIMIT_CORE": 0}
        launcher = json.dumps({"rlimits": rlimits, "uid": self.uid, "zygote": zygote,
                               "seccomp": seccomp_program("zygote" if zygote else "kernel").hex()})
        return args + ["--", sys.executable, "-s", "-c", _LAUNCHER, launcher] + list(kernel_argv)

    @staticmethod
    def _parents(path: str, made: set[str]) -> list[str]:
        """Create a bound path's missing parents, world-traversable (bwrap would copy e.g. /root's 0700)."""
        args = []
        parts = Path(path).parts
        for depth in range(2, len(parts)):
            parent = str(Path(*parts[:depth]))
            if parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", parent]
        return args

    def inner_env(self) -> dict[str, str]:
        env = {name: os.environ[name] for name in PASS_ENV if name in os.environ}
        env.update({
            "HOME": HOME, "USER": "student", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "DECODER_COURSE_HARVEST": HARVEST, "MPLCONFIGDIR": MPLCONFIG,
            "PYTHONNOUSERSITE": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        })
        env.setdefault("LANG", "C.UTF-8")
        return env

    @staticmethod
    def outer_env() -> dict[str, str]:
        """The environment of ``bwrap`` itself (the kernel's is set inside): nothing of the grader's."""
        return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}

    # -- running ---------------------------------------------------------------------------------------------
    def started(self, process: subprocess.Popen) -> None:
        """Called once the outer bwrap runs: start the watchdog."""
        self.process = process
        self._started = time.monotonic()
        self._watchdog = threading.Thread(target=self._watch, name="sandbox-watchdog", daemon=True)
        self._watchdog.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the watchdog (and a kill it started) to finish."""
        if self._watchdog is not None:
            self._watchdog.join(timeout)

    def _watch(self) -> None:
        lim = self.limits
        while not self._stop.wait(0.2):
            if self.out_of_memory():  # the OOM killer took one process: the notebook as a whole is stopped
                self._kill_for("")
                return
            if self.process is None or self.process.poll() is not None:
                return
            if not self.pid_ns:
                self.pid_ns = self._find_pid_ns()
            if time.monotonic() - self._started > lim.deadline * self.slowdown:
                self.deadline_hit = True
                self._kill_for(f"the notebook ran past its {lim.deadline * self.slowdown:g} s deadline"
                               f"{stretch_note(lim.deadline, self.slowdown)}: the sandbox was stopped")
                return
            if self.root_mode:
                continue  # the caps are the file systems' own (prepare): nothing to watch
            used = self.scratch_usage()
            if used > lim.scratch_bytes:
                self._kill_for(f"the notebook wrote {used / 2**20:.0f} MB into its scratch folder (cap "
                               f"{lim.scratch_bytes / 2**20:.0f} MB): the sandbox was stopped")
                return

    def _kill_for(self, why: str) -> None:
        if why:
            self.events.append(why)
        self.kill()

    def scratch_usage(self) -> int:
        """Without root only: bytes the host folders the sandbox may write take on disk (not following links;
        a sparse file's holes take nothing)."""
        total = 0
        for folder in (self.kernel_dir, self.harvest / "outputs"):
            for root, dirs, files in os.walk(folder):
                for name in files + dirs:
                    try:
                        total += os.lstat(os.path.join(root, name)).st_blocks * 512
                    except OSError:
                        pass
        try:
            total += self.log_path.stat().st_size
        except OSError:
            pass
        return total

    def _find_pid_ns(self) -> str:
        """The sandbox's pid namespace, read from a child of the outer bwrap (to find survivors later)."""
        assert self.process is not None
        for pid in _pids():
            if _ppid(pid) == self.process.pid:
                try:
                    return os.readlink(f"/proc/{pid}/ns/pid")
                except OSError:
                    return ""
        return ""

    def survivors(self) -> list[int]:
        """Processes still running from this sandbox: in its pid namespace, or (as root) of its uid."""
        mine = []
        for pid in _pids():
            if _state(pid) in ("Z", "X", ""):
                continue  # dead, waiting to be reaped by the host's init: nothing runs
            try:
                if self.root_mode and os.stat(f"/proc/{pid}").st_uid == self.uid:
                    mine.append(pid)
                elif self.pid_ns and os.readlink(f"/proc/{pid}/ns/pid") == self.pid_ns:
                    mine.append(pid)
            except OSError:
                continue
        return mine

    def kill(self) -> None:
        """Stop everything in the sandbox: kill the outer bwrap (which tears down the pid namespace), then
        whatever is left."""
        self._stop.set()
        self.note_others()
        if self.process is not None and self.process.poll() is None:
            try:
                self.process.kill()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if left := _kill_until_gone(self.survivors):
            self.events.append(f"processes of the sandbox survived the kill: {left}")
        self.note_memory()
        self.note_full()

    def note_full(self) -> None:
        """Say which caps the notebook reached (once each): the cause of the errors its cells show."""
        for said in self.full():
            if said not in self.events:
                self.events.append(said)

    def note_others(self) -> None:
        """Say (once) how many processes besides the kernel were running when the notebook ended."""
        others = self._others()
        if others and not self._noted_others:
            self._noted_others = True
            self.events.append(f"{len(others)} other processes were still running when the notebook ended "
                               "(forked by the notebook): all were killed")

    def _others(self) -> list[int]:
        """Processes of the sandbox other than its init and the kernel (the init's first child)."""
        if self.process is None or self.process.poll() is not None:
            return []
        init = [pid for pid in _pids() if _ppid(pid) == self.process.pid]
        running = set(self.survivors()) - set(init)
        children = sorted((int(_stat_fields(pid)[19]), pid) for pid in running
                          if init and _ppid(pid) == init[0] and len(_stat_fields(pid)) > 19)
        kernel = children[0][1] if children else -1
        return sorted(pid for pid in running if pid != kernel)

    def exit_description(self) -> str:
        """How the kernel ended, in words ('' while it runs or after a normal shutdown)."""
        if self.process is None or self.process.returncode is None:
            return ""
        code = self.process.returncode
        if code < 0:  # the outer bwrap was killed by the grader
            return ""
        if code > 128:
            try:
                name = signal.Signals(code - 128).name
            except ValueError:
                name = f"signal {code - 128}"
            why = {"SIGSEGV": "a crash (segmentation fault)", "SIGKILL": "SIGKILL",
                   "SIGXCPU": "the CPU time limit", "SIGXFSZ": "the file size limit",
                   "SIGABRT": "an abort"}.get(name, name)
            return f"the kernel was killed by {why} ({name})"
        return f"the kernel exited with status {code}"

    def log_tail(self, chars: int = 2000) -> str:
        """The last meaningful line the kernel wrote on its own stderr (a crash message), or ''."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(max(0, self.log_path.stat().st_size - chars))
                lines = handle.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        lines = [line.strip() for line in lines if line.strip() and not line.startswith("Fontconfig")]
        return lines[-1] if lines else ""

    def describe(self) -> dict:
        return {"uid": self.uid, "limits": asdict(self.limits), "read_only": self.read_only_paths()}


def _kill_until_gone(listed, seconds: float = 5.0, pause: float = 0.05) -> list[int]:
    """SIGKILL every pid ``listed()`` gives, again and again, until it gives none or ``seconds`` pass; what is left."""
    deadline = time.monotonic() + seconds
    while (left := listed()) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(pause)
    return listed()


def _empty_quietly(folder: Path) -> None:
    """Remove what ``folder`` holds, without following a link and without raising (what cannot be removed stays,
    for the caller to see through the file system's own count)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except (OSError, RecursionError):
            pass


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name: state, ppid, ..."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _state(pid: int) -> str:
    fields = _stat_fields(pid)
    return fields[0] if fields else ""


def _ppid(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else -1
