"""1. Each solution notebook, top to bottom in a fresh kernel, as a student's "Restart and Run All"."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from autograder.course import notebooks
from bench.common import NOT_AVAILABLE, seconds, table

TARGET = 60.0  # s per lesson (issue 7); lesson 07 trains inside that too
ALL_LESSONS = list(notebooks.REFERENCE_MODULES)


def run_once(lesson: str) -> float:
    """Seconds to execute the lesson's solution notebook in a new kernel (start-up included)."""
    nb = nbformat.read(notebooks.solution_path(lesson), as_version=4)
    with tempfile.TemporaryDirectory(prefix=f"bench-{lesson}-") as cwd:
        # ipc sockets in the scratch folder, as a graded kernel's: a kernel on TCP warns, once per notebook, that
        # it runs unencrypted, which would flood the bench's output
        km = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(cwd) / "kernel"))
        client = NotebookClient(nb, km=km, timeout=600, kernel_name="python3", resources={"metadata": {"path": cwd}})
        started = time.perf_counter()
        try:
            client.execute()
            return time.perf_counter() - started
        finally:
            if km.has_kernel:  # a kernel manager handed in is the caller's to stop
                km.shutdown_kernel(now=True)


def run(quick: bool = False, repeats: int = 3) -> str:
    built = set(notebooks.lessons())
    rows = []
    for lesson in ALL_LESSONS:
        if lesson not in built or not notebooks.solution_path(lesson).exists():
            rows.append([lesson, NOT_AVAILABLE, "", "", ""])
            continue
        times = [run_once(lesson) for _ in range(1 if quick else repeats)]
        median = statistics.median(times)
        spread = f"{seconds(min(times))} – {seconds(max(times))}" if len(times) > 1 else "—"
        rows.append([lesson, seconds(median), spread, len(times),
                     "yes" if median <= TARGET else "**no**"])
    return table(["lesson", "median", "range", "runs", f"≤ {TARGET:.0f} s"], rows)
