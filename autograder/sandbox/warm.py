"""Warm sandboxes: one per student, grading as root. bwrap runs a root *zygote* (:mod:`autograder.sandbox.zygote`)
that imported the lessons' libraries once and forks each of the student's notebooks a kernel, so that no notebook
pays for importing torch; between notebooks the sandbox is emptied and checked clean, or retired.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from autograder.sandbox import syscall_profile
from autograder.sandbox.launch import (
    Limits,
    Sandbox,
    SandboxUnavailable,
    _empty_quietly,
    _kill_until_gone,
    _pids,
    _ppid,
    seccomp_program,
    unmount_all,
    usage,
)

# The zygote's program (autograder/sandbox/zygote.py), run by the launcher after the syscall profile's loader.
ZYGOTE = syscall_profile.LOADER + Path(__file__).with_name("zygote.py").read_text()

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
    """One student's sandbox, kept between that student's notebooks: bwrap runs a zygote (:data:`ZYGOTE`) that
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
        argv = [sys.executable, "-s", "-Xfrozen_modules=off", "-c", ZYGOTE, ",".join(PREIMPORT), str(self.uid),
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
