"""The student's kernel runs inside a bubblewrap sandbox: what it may see, write and use, and how it is stopped.

One :class:`Sandbox` per graded notebook, or, grading as root, one :class:`WarmSandbox` per student: the same
bwrap sandbox, whose first process is a root *zygote* that imported the lessons' libraries once and forks each of
the student's notebooks a kernel (see that class for what is reset between two notebooks).
:class:`SandboxedKernelManager` is jupyter_client's kernel manager with one change: the kernel command is wrapped
in ``bwrap`` (see :meth:`Sandbox.command`), or the kernel is the zygote's fork. nbclient, nbgrader and the kernel
itself are unchanged; ``TrustedExecute`` builds the sandbox and hands its kernel manager to nbclient.

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
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from queue import Empty

import zmq
import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from traitlets import Any, Int, Type, default
from zmq.utils.monitor import parse_monitor_message

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


# Messages from the kernel that may wait in one of the grader's sockets: what the grader holds unread is at most
# this many frames of at most cell_output_bytes (more wait in the kernel, whose sends then block or are dropped).
QUEUED_MESSAGES = 32
# The relay's memory for messages on their way (see KernelRelay): this many of cell_output_bytes, and 64 MB.
RELAY_MESSAGES = 16


def capped_context(message_bytes: int) -> zmq.asyncio.Context:
    """A ZMQ context whose sockets refuse any frame over ``message_bytes``: libzmq reads a frame's length before
    its body and closes the connection instead of allocating it (``ZMQ_MAXMSGSIZE``), so no single frame the
    kernel sends is ever allocated in the grader; at most :data:`QUEUED_MESSAGES` messages wait unread
    (``ZMQ_RCVHWM``). Every socket the grader connects to a kernel comes from such a context. Not bounded here:
    the number of frames of one message (libzmq receives a message's frames whole, past its high-water mark); the
    kernel's sockets are reached through a :class:`KernelRelay` for that."""
    context = zmq.asyncio.Context()
    context.setsockopt(zmq.MAXMSGSIZE, message_bytes)
    context.setsockopt(zmq.RCVHWM, QUEUED_MESSAGES)
    return context


class ConnectionDropped(ConnectionError):
    """libzmq closed a connection to the kernel: a frame over the size cap (see :func:`capped_context`) or the
    kernel's end. The channel has reconnected; what the kernel sent meanwhile is lost."""


class CappedChannel(AsyncZMQSocketChannel):
    """jupyter_client's channel that says when its connection was closed, and connects again.

    After a frame over ``ZMQ_MAXMSGSIZE`` libzmq drops the connection for good (a protocol error, no reconnect):
    without this, an IOPub channel would stay silent for the rest of the notebook and each later cell would wait
    for its idle status. The socket's monitor reports the drop; the channel replaces its socket with a new one to
    the same endpoint and raises :class:`ConnectionDropped` once, so that its reader can say what was lost."""

    def __init__(self, socket: zmq.asyncio.Socket, session, loop=None) -> None:
        super().__init__(socket, session)
        self._monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    async def get_msg(self, timeout: float | None = None) -> dict:
        assert self.socket is not None
        poller = zmq.asyncio.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        ready = dict(await poller.poll(None if timeout is None else int(timeout * 1000)))
        if self._monitor in ready:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            self._reconnect(event["endpoint"].decode())
            raise ConnectionDropped(f"the kernel's connection {event['endpoint'].decode()} was closed")
        if self.socket in ready:
            return await self._recv()
        raise Empty

    def _reconnect(self, endpoint: str) -> None:
        old, kind, identity = self.socket, self.socket.type, self.socket.get(zmq.ROUTING_ID)
        old.disable_monitor()
        self._monitor.close(linger=0)
        old.close(linger=0)
        self.socket = old.context.socket(kind)
        self.socket.linger = 1000
        if identity:
            self.socket.set(zmq.ROUTING_ID, identity)
        if kind == zmq.SUB:
            self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._monitor = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.socket.connect(endpoint)

    def close(self) -> None:
        if self.socket is not None:
            self._monitor.close(linger=0)
        super().close()

    stop = close


# The relay (see KernelRelay), run as `python -c _RELAY KERNEL_IP RELAY_IP PORTS FRAME_BYTES SPARE_BYTES`: for each
# channel a socket bound for the grader (front) and one connected to the kernel (back), and messages copied between
# them; it queues what the grader has not read yet (libzmq's default 1000 messages a socket, within its memory). A
# back connection libzmq closes (a frame over FRAME_BYTES, or no memory left for a message) is opened again, and the
# front one with it, so that the grader sees its own connection close. End of stdin ends it.
_RELAY = r"""
import json, resource, sys, zmq
kernel, outer, ports = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
frame_bytes, spare = int(sys.argv[4]), int(sys.argv[5])
context = zmq.Context()
kinds = {channel: (zmq.XPUB, zmq.XSUB) if channel == "iopub" else (zmq.ROUTER, zmq.DEALER) for channel in ports}


def back(channel):
    sock = context.socket(kinds[channel][1])
    sock.setsockopt(zmq.MAXMSGSIZE, frame_bytes)
    sock.setsockopt(zmq.RECONNECT_IVL, 10)
    sock.linger = 0
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.connect(f"ipc://{kernel}-{ports[channel]}")
    return sock, monitor


def front(channel):
    sock = context.socket(kinds[channel][0])
    sock.linger = 0
    sock.bind(f"ipc://{outer}-{ports[channel]}")
    return sock


def watch():
    poller, owner = zmq.Poller(), {}
    poller.register(sys.stdin, zmq.POLLIN)
    for channel, socks in links.items():
        for sock in socks:
            poller.register(sock, zmq.POLLIN)
            owner[sock] = channel
    return poller, owner


links = {channel: [front(channel), *back(channel)] for channel in ports}
poller, owner = watch()
with open("/proc/self/status") as status:
    mapped = next(int(line.split()[1]) << 10 for line in status if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (mapped + spare, mapped + spare))
print("ready", flush=True)
while True:
    for sock, _ in poller.poll():
        if sock is sys.stdin:
            sys.exit(0)
        channel = owner[sock]
        outer_sock, inner_sock, monitor = links[channel]
        if sock is monitor:
            for old in (monitor, inner_sock, outer_sock):
                old.close()
            links[channel] = [front(channel), *back(channel)]
            poller, owner = watch()
            break  # the events left were polled on closed sockets
        target = inner_sock if sock is outer_sock else outer_sock
        frames = sock.recv_multipart(copy=False)
        try:
            target.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # no peer yet, or a full queue: dropped, as a PUB socket does
            pass
"""


class KernelRelay:
    """A process between one kernel's sockets and the grader's, whose memory is capped.

    libzmq caps a frame (``ZMQ_MAXMSGSIZE``), not the number of frames of one message, and receives all of them
    before its reader sees the first: a kernel sending one message of many capped frames would have it received
    whole into the memory of whatever connects to it. The grader connects only to this relay. There, such a
    message runs out of its ``spare`` bytes of address space: libzmq closes the kernel's connection (the relay
    opens it again, and the grader sees its own close: see :class:`CappedChannel`) or aborts the relay (the
    grader's client then finds the kernel gone). What fits is passed on as it came."""

    def __init__(self, kernel_ip: str, ports: dict[str, int], frame_bytes: int, spare: int):
        self.folder = tempfile.mkdtemp(prefix="relay-")  # the grader's own: the kernel never sees it
        self.ip = os.path.join(self.folder, "r")
        self.spare = spare
        env = {**os.environ, "MALLOC_ARENA_MAX": "1"}  # one malloc arena: its address space is what it uses
        self.process = subprocess.Popen(
            [sys.executable, "-c", _RELAY, kernel_ip, self.ip, json.dumps(ports), str(frame_bytes), str(spare)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.stopped = False

    def wait_ready(self, timeout: float = 30.0) -> None:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready or self.process.stdout.readline().strip() != b"ready":
            self.stop()
            raise RuntimeError("the relay between the kernel and the grader did not start")

    def alive(self) -> bool:
        return self.process.poll() is None

    def died(self) -> bool:
        """Whether it ended by itself (aborted by libzmq: a message over its memory), not by :meth:`stop`."""
        return not self.stopped and not self.alive()

    def stop(self) -> None:
        self.stopped = True
        if self.alive():
            self.process.kill()
        self.process.wait()
        self.process.stdin.close()
        self.process.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class ReadyClient(AsyncKernelClient):
    """jupyter_client's client, but ready as soon as the kernel has answered ``kernel_info`` on both channels.

    jupyter_client then waits for 0.2 s of IOPub silence ("flush"): a fixed 0.2 s per graded notebook. Nothing
    needs that flush: nbclient reads only the IOPub messages whose parent is the request it sent, so what
    ``kernel_info`` leaves there (its status messages) is skipped when a cell runs. The loop is jupyter_client
    8's ``_async_wait_for_ready`` (a client made by its kernel manager) without that last flush: recheck it when
    jupyter_client changes (tests/test_ready_client.py)."""

    message_bytes = Int(0, help="the largest frame accepted from the kernel (see capped_context); 0: no cap")
    relay = Any(None, help="the KernelRelay its sockets connect to, if any: the kernel is gone when it is")
    shell_channel_class = Type(CappedChannel)
    iopub_channel_class = Type(CappedChannel)

    @default("context")
    def _context_default(self) -> zmq.asyncio.Context:
        if not self.message_bytes:
            return super()._context_default()
        self._created_context = True
        return capped_context(self.message_bytes)

    async def _async_is_alive(self) -> bool:
        return (self.relay is None or self.relay.alive()) and await super()._async_is_alive()

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
        while True:
            self.kernel_info()
            try:
                msg = await self.shell_channel.get_msg(timeout=1)
            except Empty:
                pass
            else:
                if msg["msg_type"] == "kernel_info_reply":
                    try:  # IOPub connected: the reply's status messages reach it
                        await self.iopub_channel.get_msg(timeout=0.2)
                    except Empty:
                        pass
                    else:
                        self._handle_kernel_info_reply(msg)
                        return
            if not await self._async_is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout} seconds")


class SandboxedKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager, launching the kernel inside a :class:`Sandbox` over ipc sockets."""

    box = Any(help="the Sandbox of this notebook")
    relay = Any(None, help="the KernelRelay between the kernel and the grader, while the kernel runs")

    def __init__(self, box: Sandbox, **kwargs):
        super().__init__(**kwargs)
        self.box = box
        self.client_factory = ReadyClient
        self.transport = "ipc"
        self.ip = str(box.kernel_dir / "k")  # ipc endpoints are <ip>-<port>
        self.connection_file = str(box.kernel_dir / "kernel.json")
        # Always this environment's Python kernel, whatever the notebook's metadata names; interrupt by message
        # (the kernel signals itself), since the sandbox's own processes must never receive a SIGINT.
        self._kernel_spec = KernelSpec(
            argv=[sys.executable, "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="Python 3 (sandboxed)", language="python", interrupt_mode="message", metadata={})

    @default("context")
    def _context_default(self) -> zmq.asyncio.Context:  # its control socket, connected to the kernel too
        self._created_context = True
        return capped_context(self.box.limits.cell_output_bytes)

    def client(self, **kwargs) -> ReadyClient:
        relay = {"ip": self.relay.ip, "relay": self.relay} if self.relay is not None else {}
        return super().client(message_bytes=self.box.limits.cell_output_bytes, **relay, **kwargs)

    def _make_url(self, channel: str) -> str:  # the manager's own control socket goes through the relay too
        return f"ipc://{self.relay.ip if self.relay is not None else self.ip}-{getattr(self, f'{channel}_port')}"

    def _start_relay(self) -> None:
        ports = {channel: getattr(self, f"{channel}_port") for channel in ("shell", "iopub", "stdin", "control", "hb")}
        limit = self.box.limits.cell_output_bytes
        self.relay = KernelRelay(self.ip, ports, limit, RELAY_MESSAGES * limit + (64 << 20))

    async def shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        self.box.note_others()  # before the kill: what else was still running in the sandbox
        self._note_relay()  # and before it: a relay that ends as its kernel goes did not end on what it was sent
        try:
            await super().shutdown_kernel(now=now, restart=restart)
        finally:
            self._stop_relay(noted=True)

    async def cleanup_resources(self, restart: bool = False) -> None:  # nbclient's end for a kernel that died
        try:
            await super().cleanup_resources(restart=restart)
        finally:
            self._stop_relay()

    def _note_relay(self) -> None:
        """Say so when the relay ended by itself while its kernel ran: a message over its memory."""
        if self.relay is not None and self.relay.died():
            self.box.events.append(f"the kernel sent more than {self.relay.spare / 2**20:g} MB at once (one message "
                                   "of many parts, or many messages left unread): its connection was closed")

    def _stop_relay(self, noted: bool = False) -> None:
        if self.relay is None:
            return
        if not noted:
            self._note_relay()
        self.relay.stop()
        self.relay = None

    def write_connection_file(self, **kwargs) -> None:
        super().write_connection_file(**kwargs)
        self.box.give(self.connection_file)

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return self.box.command(super().format_kernel_cmd(extra_arguments))

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        self._start_relay()  # it starts while the kernel does
        try:
            await self._launch_in_box(kernel_cmd, **kw)
            self.relay.wait_ready()
        except BaseException:
            self._stop_relay()
            raise

    async def _launch_in_box(self, kernel_cmd: list[str], **kw) -> None:
        if isinstance(self.box, WarmSandbox):  # the student's zygote forks the kernel (no command is run)
            process = self.box.fork_kernel(self.connection_file)
            self.provisioner.process, self.provisioner.pid, self.provisioner.pgid = process, process.pid, None
            self._reconcile_connection_info(self.provisioner.connection_info)
            self.box.started(process)
            return
        kw["env"] = self.box.outer_env()
        kw["cwd"] = str(self.box.scratch)
        kw["stdout"] = subprocess.DEVNULL
        with open(self.box.log_path, "ab") as log:  # the kernel's own stderr (crash messages), size-capped
            kw["stderr"] = log
            await super()._async_launch_kernel(kernel_cmd, **kw)
        self.box.started(self.provisioner.process)


# -- warm sandboxes: one per student, a pre-imported zygote forks each notebook's kernel --------------------------
# What every lesson's kernel imports: done once per student's sandbox instead of once per notebook (torch alone is
# about 1.3 s of every graded notebook). Importing is all the zygote does: no student code, no random draw, no
# torch operation (an OpenMP pool would not survive the fork), no thread, no ZMQ context.
# (ipykernel.debugger: debugpy, which every kernel imports as it starts, 0.15 s)
PREIMPORT = ("ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.debugger", "IPython", "numpy", "einops",
             "matplotlib", "matplotlib.pyplot", "decoder_course", "decoder_course.harvest", "decoder_course.checks",
             "decoder_course.plots", "decoder_course.data")
# torch, imported by the zygote just before it forks the first of the student's notebooks that imports it: a NumPy
# lesson's kernel neither waits for it nor maps it (its RLIMIT_AS is then what a cold kernel's is).
PREIMPORT_TORCH = ("torch", "torch.nn", "torch.nn.functional", "decoder_course.twins")

# The zygote: the kernel command of a warm sandbox (run by _LAUNCHER, so with its rlimits and uid). It reads one
# command per line on stdin: "clean" empties /tmp, /dev/shm and $HOME (what the previous notebook left) and answers
# "clean"; "fork TORCH CONNECTION_FILE" forks, and the child becomes an IPython kernel in a session of its own,
# stdin and stdout on /dev/null; the zygote answers "forked PID" and, when a kernel ends, "exit PID STATUS". End of
# stdin ends it.
_ZYGOTE = syscall_profile.LOADER + r"""
import ctypes, importlib, os, resource, select, shutil, sys
os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")  # as ipykernel sets it
def preimport(names):
    for name in names.split(","):
        try:
            importlib.import_module(name)
        except Exception:
            pass

preimport(sys.argv[1])
later = sys.argv[4]  # torch and what needs it: see fork
uid, memory = int(sys.argv[2]), int(sys.argv[3])  # the kernels' uid and RLIMIT_AS beyond the libraries
kernel_profile = sys.argv[5]  # the syscall profile each kernel loads on top of the zygote's
with open("/proc/self/mountinfo") as handle:  # what bwrap bound (kernel sockets, font list): never emptied
    mounts = [line.split()[4] for line in handle]

def empty(top):
    for entry in os.listdir(top):
        path = os.path.join(top, entry)
        if path in mounts:
            continue
        if any(m.startswith(path + "/") for m in mounts):
            if os.path.isdir(path) and not os.path.islink(path):
                empty(path)
            continue
        try:  # nothing of the notebook runs any more: no link can be swapped in under this
            if os.path.isdir(path) and not os.path.islink(path):
                for root, dirs, _ in os.walk(path):
                    for d in dirs:
                        if not os.path.islink(os.path.join(root, d)):
                            os.chmod(os.path.join(root, d), 0o700)
                os.chmod(path, 0o700)
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError:
            pass

def say(text):
    os.write(1, (text + "\n").encode())

say("ready")
pending = b""
while True:
    ready, _, _ = select.select([0], [], [], 0.1)
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        say(f"exit {pid} {status}")
    if not ready:
        continue
    data = os.read(0, 4096)
    if not data:
        os._exit(0)
    pending += data
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        words = line.decode("utf-8", "replace").split(" ", 2)
        if words == ["clean"]:  # what the last notebook left: the grader then asks the kernel what is left
            for top in ("/tmp", "/dev/shm", os.environ["HOME"]):
                try:
                    empty(top)
                except BaseException:  # a tree too deep to walk: the grader sees it left, and retires us
                    pass
            say("clean")
            continue
        if words[0] != "fork" or len(words) != 3:
            continue
        if words[1] == "1" and later:  # this notebook uses torch: import it before the fork
            preimport(later)
            later = ""
        words = [words[0], words[2]]
        pid = os.fork()
        if pid == 0:
            try:
                # the address space the libraries take (a cold kernel maps them as it imports them), plus the limit
                with open("/proc/self/status") as handle:
                    mapped = next(int(l.split()[1]) for l in handle if l.startswith("VmSize:")) * 1024
                resource.setrlimit(resource.RLIMIT_AS, (mapped + memory, mapped + memory))
                libc = ctypes.CDLL(None, use_errno=True)
                # this notebook's own SysV IPC and POSIX message queues, gone with its last process (root only)
                if libc.unshare(0x08000000) != 0:  # CLONE_NEWIPC
                    raise OSError(ctypes.get_errno(), "a fresh IPC namespace for the kernel was refused")
                if os.getuid() == 0:  # the uid of a cold kernel: from here on no process of the notebook is root
                    os.setgroups([])
                    os.setresgid(uid, uid, uid)
                    os.setresuid(uid, uid, uid)
                    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE, as after an exec
                refused = load_seccomp(kernel_profile)  # on top of the zygote's: unshare is refused from here on
                if refused:
                    raise OSError(f"sandbox: {refused}: nothing runs without it")
                os.setsid()
                null = os.open("/dev/null", os.O_RDWR)
                os.dup2(null, 0)
                os.dup2(null, 1)
                os.close(null)
                os.chdir(os.environ["HOME"])
                sys.argv = ["ipykernel_launcher", "-f", words[1]]
                from ipykernel import kernelapp
                kernelapp.launch_new_instance()
            except BaseException:
                import traceback
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        say(f"forked {pid}")
"""


def _ns_pid(pid: int) -> int:
    """A process's pid in its own (innermost) pid namespace, or -1."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return -1


class ForkedKernel:
    """The ``subprocess.Popen`` that jupyter_client's provisioner holds for a kernel forked by a zygote: poll,
    wait, signal and kill the kernel by its host pid; its exit status comes from the zygote."""

    stdin = stdout = stderr = None

    def __init__(self, box: WarmSandbox, pid: int, ns_pid: int):
        self.box, self.pid, self.ns_pid = box, pid, ns_pid
        self.returncode: int | None = None
        self._killed = False

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        status = self.box.exits.get(self.ns_pid)
        if status is not None:
            code = os.waitstatus_to_exitcode(status)
            # the convention of the outer bwrap that a cold kernel has: 128 + signal when the kernel was killed
            self.returncode = -9 if self._killed else (128 - code if code < 0 else code)
        elif not self.box.alive():
            self.returncode = -9
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("kernel", timeout)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, signum: int) -> None:
        if signum == signal.SIGKILL:
            self._killed = True
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


@dataclass(eq=False)
class WarmSandbox(Sandbox):
    """One student's sandbox, kept between that student's notebooks: bwrap runs a zygote (:data:`_ZYGOTE`) that
    has imported :data:`PREIMPORT` once and forks each notebook's kernel.

    Between two notebooks every process but the sandbox's init and the zygote is killed (and checked gone), the
    host folders bound inside (kernel sockets, cases, outputs) are emptied and the zygote empties ``/tmp``,
    ``/dev/shm`` and ``$HOME``, so a notebook starts from what a cold sandbox gives it, and the next notebook's
    cases are written only once nothing of the previous one runs. Another student never gets this sandbox
    (:func:`warm_sandbox` keys it by student); a notebook that hit a limit, or left a process that would not
    die, retires it, and the student's next notebook gets a fresh one.
    """

    student: str = ""
    outer: subprocess.Popen | None = None  # bwrap, for the sandbox's whole life
    exits: dict[int, int] = field(default_factory=dict)  # zygote pid -> wait status, as the zygote reported
    zygote: int = -1  # host pids
    init: int = -1
    retired: bool = False
    ready: bool = False  # the zygote has imported what it preimports (:meth:`wait_ready`)
    notebooks: int = 0
    _limit_hit: bool = False
    wants_torch: bool = True
    fresh: dict[str, int] = field(default_factory=dict)  # the capped file systems' use before any notebook
    _lines: list[str] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    __eq__ = object.__eq__  # one sandbox is itself only (kept in a set until retired)
    __hash__ = object.__hash__

    # -- life ------------------------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> None:
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start bwrap and its zygote, without waiting for the zygote's imports (:meth:`wait_ready`)."""
        self.prepare()
        self.seal()
        argv = [sys.executable, "-s", "-Xfrozen_modules=off", "-c", _ZYGOTE, ",".join(PREIMPORT), str(self.uid),
                str(self.limits.memory_bytes), ",".join(PREIMPORT_TORCH), seccomp_program("kernel").hex()]
        with open(self.log_path, "ab") as log:
            self.outer = subprocess.Popen(self.command(argv, zygote=True), env=self.outer_env(),
                                          cwd=str(self.scratch),
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until the zygote has imported :data:`PREIMPORT` and find its processes; retire the sandbox and
        raise :class:`SandboxUnavailable` if it never gets there."""
        if self.ready:
            return
        if not self._expect(lambda line: line == "ready", timeout):
            self.retire()
            raise SandboxUnavailable(f"the grading sandbox's kernel did not start: {self.log_tail() or 'no message'}")
        for pid in _pids():
            if _ppid(pid) == self.outer.pid:
                self.init = pid
        self.zygote = next((pid for pid in _pids() if _ppid(pid) == self.init), -1)
        try:
            self.pid_ns = os.readlink(f"/proc/{self.zygote}/ns/pid")
        except OSError as exc:
            self.retire()
            raise SandboxUnavailable("the grading sandbox's kernel could not be found") from exc
        if not self._emptied():
            self.retire()
            raise SandboxUnavailable("the grading sandbox's zygote did not answer")
        self.fresh = self._usage()  # what a notebook finds: the state every later one must find too
        self.ready = True

    def _usage(self) -> dict[str, int]:
        """Bytes and inodes used on the capped file systems a notebook writes (not the log, emptied anyway)."""
        found = {}
        for what, (folder, _, _) in self.capped().items():
            if folder != self.log_path.parent and (used := usage(folder)) is not None:
                found[f"{what} bytes"], found[f"{what} inodes"] = used.used_bytes, used.used_inodes
        return found

    def _emptied(self) -> bool:
        """Empty what the last notebook may have written (kernel sockets, outputs: here; $HOME, /tmp, /dev/shm:
        the zygote, which knows what bwrap mounted there). Best effort: whatever is left, the kernel's count
        shows (:meth:`finish_notebook`)."""
        for folder in (self.kernel_dir, self.harvest / "outputs", self.harvest / "cases"):
            _empty_quietly(folder)
        if self.outer is None or self.outer.stdin is None or not self.alive():
            return False
        try:
            self.outer.stdin.write(b"clean\n")
            self.outer.stdin.flush()
        except OSError:
            return False
        return self._expect(lambda line: line == "clean", 30.0) is not None

    def _read(self) -> None:
        """The zygote's reports: bounded lines, anything else dropped (a kernel could write to this pipe too)."""
        assert self.outer is not None and self.outer.stdout is not None
        for raw in iter(lambda: self.outer.stdout.readline(200), b""):
            line = raw.decode("ascii", "replace").strip()
            words = line.split()
            with self._cond:
                if len(words) == 3 and words[0] == "exit" and words[1].isdigit() and words[2].isdigit():
                    self.exits[int(words[1])] = int(words[2])
                elif line in ("ready", "clean") or (len(words) == 2 and words[0] == "forked"
                                                    and words[1].isdigit()):
                    self._lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _expect(self, want, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self._lines:
                    if want(line):
                        self._lines.remove(line)
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or not self.alive():
                    return None
                self._cond.wait(min(left, 0.5))

    def alive(self) -> bool:
        return not self.retired and self.outer is not None and self.outer.poll() is None

    def retire(self) -> None:
        """Stop the whole sandbox (bwrap takes its pid namespace down) and remove its scratch folder."""
        self.retired = True
        self._stop.set()
        if self.outer is not None:
            try:
                self.outer.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
            if self.outer.poll() is None:
                self.outer.kill()
            try:
                self.outer.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        _kill_until_gone(self._all)
        self.release()
        shutil.rmtree(self.scratch, ignore_errors=True)

    # -- one notebook ----------------------------------------------------------------------------------------
    def next_notebook(self, wants_torch: bool = True) -> None:
        """Make the sandbox ready for the student's next notebook: the per-notebook state as a new sandbox has
        it, the bound host folders empty (nothing of the previous notebook runs any more: :meth:`kill`).
        ``wants_torch``: the notebook uses torch, so its kernel is forked once the zygote has imported it."""
        self.notebooks += 1
        self.wants_torch = wants_torch
        self.events, self.process, self._watchdog, self._limit_hit = [], None, None, False
        self.slowdown, self.deadline_hit = 1.0, False
        self._stop, self._noted_others = threading.Event(), False
        self.memory_hit, self._oom_seen = False, self.cgroup.oom_kills() if self.cgroup else 0
        with open(self.log_path, "wb"):
            pass  # the previous notebook's kernel messages are not this one's
        self.seal()

    def fork_kernel(self, connection_file: str, timeout: float = 60.0) -> ForkedKernel:
        """Ask the zygote for this notebook's kernel; the provisioner's process for it."""
        assert self.outer is not None and self.outer.stdin is not None
        if not self.alive():
            raise RuntimeError("the student's grading sandbox stopped before this notebook's kernel could start")
        self.outer.stdin.write(f"fork {int(self.wants_torch)} {connection_file}\n".encode())
        self.outer.stdin.flush()
        line = self._expect(lambda line: line.startswith("forked "), timeout)
        if line is None:
            raise RuntimeError(f"the grading sandbox did not start this notebook's kernel: "
                               f"{self.log_tail() or 'no message'}")
        ns_pid = int(line.split()[1])
        host = next((pid for pid in _pids() if _ppid(pid) == self.zygote and _ns_pid(pid) == ns_pid), -1)
        if host < 0:
            raise RuntimeError("the grading sandbox's kernel ended as it started")
        return ForkedKernel(self, host, ns_pid)

    def _all(self) -> list[int]:
        """Every live process of the sandbox, init and zygote included."""
        return Sandbox.survivors(self) if self.pid_ns or self.root_mode else []

    def survivors(self) -> list[int]:
        """Processes of the notebook still running: the sandbox's, but for its init and zygote."""
        return [pid for pid in self._all() if pid not in (self.init, self.zygote)]

    def kill(self) -> None:
        """Stop everything the notebook started (the sandbox and its zygote stay for the student's next one)."""
        self._stop.set()
        self.note_others()
        if self.process is not None:
            self.process.kill()
        if left := _kill_until_gone(self.survivors, pause=0.02):
            self.events.append(f"processes of the sandbox survived the kill: {left}")
        if self.process is not None:
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        self.note_memory()
        self.note_full()

    def _kill_for(self, why: str) -> None:
        self._limit_hit = True
        super()._kill_for(why)

    def finish_notebook(self) -> None:
        """After :meth:`kill`: keep the sandbox for the student's next notebook, unless the notebook hit a limit
        (the deadline, the sandbox's memory), left a process that would not die, left anything on the capped file
        systems that emptying them did not take away (as the kernel counts: a tree too deep or too odd to walk), or the
        sandbox itself stopped. Retiring costs the next notebook a fresh sandbox, never a grade."""
        if self._limit_hit or self.memory_hit or not self.alive() or self.survivors() or not self._emptied() \
                or self._usage() != self.fresh:
            self.retire()

    def _others(self) -> list[int]:
        if self.process is None or not self.alive():
            return []
        return sorted(pid for pid in self.survivors() if pid != self.process.pid)


def warm_possible() -> bool:
    """Warm sandboxes need grading as root: the zygote stays root, so that no kernel (the sandbox uid) can
    signal it, trace it or write to its pipes. Without root every process of a sandbox has one uid, and each
    notebook gets a cold sandbox."""
    return os.geteuid() == 0


_WARM = threading.local()  # this thread's warm sandbox (a Dask worker grades in several threads)
_ALL_WARM: set[WarmSandbox] = set()
_ALL_LOCK = threading.Lock()


def warm_sandbox(student: str, limits: Limits, wants_torch: bool = True) -> WarmSandbox:
    """This thread's sandbox for ``student``'s next notebook: the one kept from their previous notebook (or
    launched by :func:`prestart_warm`), or a new one (the previous student's, if any, is retired first: no two
    students ever share a sandbox)."""
    box = _kept(student, limits) or _launched(student, limits)
    try:
        box.wait_ready()
    except BaseException:
        retire_warm()
        raise
    box.next_notebook(wants_torch)
    return box


def prestart_warm(student: str, limits: Limits) -> None:
    """Launch this thread's sandbox for ``student`` now, unless it runs already, without waiting for its zygote:
    its imports then overlap whatever the grader does before the notebook's kernel is asked for (nbgrader's
    bookkeeping, the hidden cases). :func:`warm_sandbox` takes it up; a launch that fails leaves that to it."""
    if not warm_possible() or _kept(student, limits) is not None:
        return
    try:
        _launched(student, limits)
    except (SandboxUnavailable, OSError):
        retire_warm()


def _kept(student: str, limits: Limits) -> WarmSandbox | None:
    """This thread's sandbox if it is ``student``'s, with these limits, and alive; otherwise it is retired."""
    box: WarmSandbox | None = getattr(_WARM, "box", None)
    if box is not None and (box.student != student or box.limits != limits or not box.alive()
                            or box.uid_lease is None or box.uid_lease.pid != os.getpid()):
        retire_warm()
        box = None
    return box


def _launched(student: str, limits: Limits) -> WarmSandbox:
    """A new sandbox for ``student``, launched (:meth:`WarmSandbox.launch`) and kept as this thread's."""
    box = WarmSandbox(Path(tempfile.mkdtemp(prefix="sandbox-")), limits, student=student)
    with _ALL_LOCK:
        _ALL_WARM.add(box)
    try:
        box.launch()
    except BaseException:
        with _ALL_LOCK:
            _ALL_WARM.discard(box)
        box.retire()
        raise
    _WARM.box = box
    return box


def retire_warm() -> None:
    """Retire this thread's warm sandbox, if any."""
    box = getattr(_WARM, "box", None)
    _WARM.box = None
    if box is not None:
        box.retire()
        with _ALL_LOCK:
            _ALL_WARM.discard(box)


@atexit.register
def retire_all() -> None:
    """Retire every warm sandbox of this process (at exit, and when a pool worker ends)."""
    with _ALL_LOCK:
        boxes = list(_ALL_WARM)
        _ALL_WARM.clear()
    for box in boxes:
        box.retire()
    unmount_all()  # and any cold sandbox's file systems that an interrupted run left mounted
