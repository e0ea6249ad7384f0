"""What a sandbox's control group costs, and what it buys: a classmate graded beside a hostile notebook.

Part of ``./course bench --sections grading`` (:func:`report`, called by ``bench/grading_overhead.py``).

- **Cost**: making and removing one sandbox's group (``autograder.sandbox.cgroups``), and ``python -c pass`` started in
a
  sandbox with its group and in one without (the group is joined by a ``sh`` that then execs bwrap).
- **What it buys**: the classmate's notebook (the lesson's reference solutions) is autograded alone, then while a
  hostile sandbox runs beside it, as another grading worker's would (the same limits, its worker's half of the
  cores, a memory limit of :data:`HOSTILE_MEMORY`): SysV shared memory no process holds, to 15/16 of that limit,
  then forty busy processes, each in a session of its own, while more is filled until the sandbox is stopped at
  its memory limit; it is started again at once, for as long as the classmate is graded. The same with the
  hostile sandbox's group removed (what main gave: rlimits only). Rounds interleave the variants; medians. The
  target: full marks and at least 80 % of the classmate's unloaded speed.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from autograder.grading import grade_class
from autograder.sandbox import cgroups
from autograder.sandbox import launch as sandbox

ROOT = Path(__file__).resolve().parent.parent

HOSTILE_MEMORY = 1 << 30  # the hostile sandbox's memory limit in this bench (the default is 4 GiB)
# SysV segments filled to 15/16 of the sandbox's memory limit, then forty busy processes in sessions of their own, while
# more segments are filled until the group's memory limit stops the sandbox (the filling goes first: the burners
# would starve it of its sandbox's CPU).
HOSTILE = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
def fill(megabytes):
    key = libc.shmget(0, megabytes << 20, 0o1600)
    address = libc.shmat(key, None, 0)
    ctypes.memset(address, 1, megabytes << 20)
    libc.shmdt(ctypes.c_void_p(address))
for _ in range(int(sys.argv[1]) // 32):
    fill(32)
for _ in range(40):
    if os.fork() == 0:
        os.setsid()
        while True:
            pass
for _ in range(int(sys.argv[1]) // 32):  # at most twice the limit in all: without a group nothing else stops it
    time.sleep(0.2)
    fill(32)
time.sleep(600)
"""


class Hostile:
    """A hostile sandbox run by a grading process of its own, as another worker's is (its own sandbox uid: a
    sandbox's end kills every process of its uid), started again each time it is stopped, until the block ends."""

    def __init__(self, folder: Path, grouped: bool):
        self.argv = [sys.executable, "-m", "bench.hostile_neighbour", str(folder), str(int(grouped))]
        self.starts = self.memory_stops = 0

    def __enter__(self) -> Hostile:
        self.process = subprocess.Popen(self.argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        start_new_session=True)
        time.sleep(2.0)  # its memory is filled and its burners run before the classmate's grading starts
        return self

    def __exit__(self, *exc) -> None:
        try:
            out, _ = self.process.communicate(input="", timeout=60)
            self.starts, self.memory_stops = map(int, out.split()[-2:])
        except (subprocess.TimeoutExpired, ValueError):  # starved past a minute: it and its sandbox go (bwrap dies
            os.killpg(self.process.pid, signal.SIGKILL)  # with its parent), its counts unknown
            self.process.wait()
            self.starts = self.memory_stops = -1


def worker_limits() -> sandbox.Limits:
    """The hostile sandbox's limits: a grading worker's of two (half the cores), :data:`HOSTILE_MEMORY`."""
    return grade_class.worker_limits(replace(sandbox.Limits(), sandbox_memory_bytes=HOSTILE_MEMORY), workers=2)


def hostile_worker(folder: Path, grouped: bool) -> tuple[int, int]:
    """The other worker: the hostile sandbox again and again until stdin ends; how many starts and memory stops."""
    limits = worker_limits()
    stopped = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stopped.set()), daemon=True).start()
    starts = memory_stops = 0
    while not stopped.is_set():
        box = sandbox.Sandbox(folder / f"box{starts}", limits)
        starts += 1
        box.prepare()
        box.seal()
        if not grouped:
            box.leave_cgroup()  # what main gave: each process its rlimits, nothing for the sandbox as a whole
        try:
            first_fill = str(HOSTILE_MEMORY * 15 // 16 >> 20)  # MB, before the burners start
            process = subprocess.Popen(box.command([sys.executable, "-c", HOSTILE, first_fill]), env=box.outer_env(),
                                       cwd=box.scratch, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            box.started(process)
            while process.poll() is None and not stopped.wait(0.1):
                pass
            box.kill()
            memory_stops += box.memory_hit
        finally:
            box.release()
    return starts, memory_stops


def _group_cost(repeats: int) -> float:
    """Median seconds to make one sandbox's group (its limits written) and remove it."""
    limits = sandbox.Limits()
    took = []
    for _ in range(repeats):
        started = time.perf_counter()
        group = cgroups.for_sandbox(limits.sandbox_memory_bytes, limits.processes + sandbox.PIDS_SPARE, 1.0)
        if group is None:
            return float("nan")
        group.remove()
        took.append(time.perf_counter() - started)
    return statistics.median(took)


def _startup(repeats: int) -> tuple[float, float]:
    """Median seconds of `python -c pass` in a sandbox with its group, and in one without."""
    with tempfile.TemporaryDirectory(prefix="bench-cgroup-") as tmp:
        boxes = [sandbox.Sandbox(Path(tmp) / name, sandbox.Limits()) for name in ("grouped", "plain")]
        for box in boxes:
            box.prepare()
            box.seal()
        boxes[1].leave_cgroup()
        took: list[list[float]] = [[], []]
        try:
            for _ in range(repeats):
                for box, times in zip(boxes, took, strict=True):
                    started = time.perf_counter()
                    subprocess.run(box.command([sys.executable, "-c", "pass"]), env=box.outer_env(),
                                   cwd=box.scratch, check=True)
                    times.append(time.perf_counter() - started)
        finally:
            for box in boxes:
                box.release()
    return statistics.median(took[0]), statistics.median(took[1])


def report(grade, lesson: str, repeats: int) -> str:
    """The markdown: ``grade()`` autogrades the classmate's notebook and returns its score as "score/max"."""
    if cgroups.hierarchy() is None:
        return ("\nA control group per sandbox: not measured (no group can be made here: grading as root, with a "
                "cgroup hierarchy, makes one).")
    worker = worker_limits()
    variants = ("alone", "beside a hostile notebook (its own group)", "beside a hostile notebook, no group (main)")
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    scores: dict[str, set[str]] = {name: set() for name in variants}
    hostile_runs: dict[str, list[int]] = {name: [0, 0] for name in variants}
    grade()  # warm-up: caches, the student's first sandbox
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        for round_ in range(repeats):
            order = variants[round_ % 3:] + variants[:round_ % 3]
            for name in order:
                if name == "alone":
                    started = time.perf_counter()
                    scores[name].add(grade())
                    seconds[name].append(time.perf_counter() - started)
                    continue
                with Hostile(Path(tmp) / f"{round_}-{len(name)}", "no group" not in name) as hostile:
                    started = time.perf_counter()
                    scores[name].add(grade())
                    seconds[name].append(time.perf_counter() - started)
                hostile_runs[name] = [-1, -1] if min(hostile_runs[name] + [hostile.starts]) < 0 else [
                    hostile_runs[name][0] + hostile.starts, hostile_runs[name][1] + hostile.memory_stops]
    alone = statistics.median(seconds["alone"])
    rows = []
    for name in variants:
        med = statistics.median(seconds[name])
        speed = alone / med
        hostile = "—" if name == "alone" else (f"{hostile_runs[name][0]} starts, {hostile_runs[name][1]} memory stops"
                                               if min(hostile_runs[name]) >= 0 else "a worker did not answer in 60 s")
        rows.append(f"| {name} | {med:.2f} | {speed * 100:.0f} % | {', '.join(sorted(scores[name]))} | {hostile} |")
    beside = alone / statistics.median(seconds[variants[1]])
    full = all(score.split("/")[0] == score.split("/")[1] for score in scores[variants[1]])
    group_s = _group_cost(max(5, repeats))
    with_group, without = _startup(max(5, repeats))
    return "\n".join([
        f"\n**A classmate's `{lesson}` graded beside a hostile notebook** ({repeats} rounds, medians; the hostile "
        f"sandbox: SysV shared memory up to its {HOSTILE_MEMORY >> 20} MB limit and 40 busy sessions, a grading "
        f"worker's limits: {worker.cpus:g} of the cores)\n",
        "| classmate's notebook | autograde (s) | speed vs alone | score | hostile sandbox |",
        "|---|---|---|---|---|",
        *rows,
        f"\nTarget: full marks and ≥ 80 % of the unloaded speed beside a hostile notebook: {beside * 100:.0f} % "
        f"({'yes' if beside >= 0.8 and full else '**no**'}).",
        f"\nA control group per sandbox costs {group_s * 1000:.1f} ms to make (limits written) and remove; "
        f"`python -c pass` in a sandbox: {with_group * 1000:.0f} ms with its group, {without * 1000:.0f} ms without "
        f"({(with_group - without) * 1000:+.0f} ms).",
    ])


if __name__ == "__main__":  # the hostile worker (see Hostile): FOLDER GROUPED (1 or 0)
    print(*hostile_worker(Path(sys.argv[1]), sys.argv[2] == "1"))
