"""What every benchmark section shares: the machine, medians of interleaved repeats, markdown tables."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_AVAILABLE = "lesson not available"


def machine() -> str:
    """One line: date, cores, CPU model, memory, Python, torch and its threads (numbers depend on all of it)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        memory = f", {pages * size / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        pass
    import torch

    load = ""
    if hasattr(os, "getloadavg"):
        load = f"; load average at start {os.getloadavg()[0]:.1f}"
    return (f"{datetime.date.today().isoformat()}, {os.cpu_count()} cores ({cpu}{memory}), "
            f"Python {platform.python_version()}, torch {torch.__version__} with {torch.get_num_threads()} "
            f"thread(s) (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}){load}")


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def seconds(value: float) -> str:
    """A duration, with the precision it deserves."""
    if value >= 100:
        return f"{value:.0f} s"
    if value >= 1:
        return f"{value:.1f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.2f} ms"
    return f"{value * 1e6:.1f} µs"


def per_call(fn: Callable[[], object], budget: float = 0.05) -> int:
    """How many calls of ``fn`` take about ``budget`` seconds (at least one): one timing sample."""
    fn()  # warm-up: first calls allocate and pick kernels
    started, n = time.perf_counter(), 0
    while time.perf_counter() - started < budget:
        fn()
        n += 1
    return max(n, 1)


def side_by_side(fns: dict[str, Callable[[], object]], repeats: int, budget: float = 0.05,
                 number: int | None = None, clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median seconds per call of each function, sampled in turn (A, B, A, B, ...): a busy machine slows both.

    Each sample runs a function ``number`` times (default: as often as fits in ``budget`` seconds, after a
    warm-up call); give ``number=1`` for slow calls that were already warmed up. ``clock=time.process_time``
    counts this process's CPU time instead: on a shared, overloaded machine it measures the work, not the wait.
    """
    numbers = {name: number or per_call(fn, budget) for name, fn in fns.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            started = clock()
            for _ in range(numbers[name]):
                fn()
            samples[name].append((clock() - started) / numbers[name])
    return {name: statistics.median(values) for name, values in samples.items()}
