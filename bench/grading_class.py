"""3. A class of synthetic students x every lesson: sequential grading vs ``grade_many`` on 2 workers.

Each student's notebook is one of the demo samples (perfect, untouched, typical mistakes) in turn. The release
and canaries are graded once into a base folder; each run grades the students into its own copy of it, so both
runs do the same work from the same state. Sequential is ``grade_one`` in a loop, as ``grade_class.grade`` does.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path

import nbformat

from autograder.course import notebooks, samples
from autograder.grading import grade_class, pipeline
from autograder.grading import pool as parallel
from autograder.sandbox.launch import SandboxUnavailable, check_available
from bench.common import NOT_AVAILABLE, seconds, table

TARGET = 30 * 60.0  # s for 100 students x all lessons on 2 cores (issue 7)
MAKERS = (samples.perfect, samples.untouched, samples.typical_mistakes)


def make_class(dest: Path, n_students: int, lessons: list[str]) -> list[parallel.Job]:
    jobs = []
    for i in range(n_students):
        student = f"student{i:03d}"
        for j, lesson in enumerate(lessons):
            path = dest / student / lesson / f"{lesson}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(MAKERS[(i + j) % len(MAKERS)](lesson), path)
            jobs.append((student, lesson, path))
    return jobs


def fresh_copy(root: Path, name: str) -> Path:
    """A copy of ``root/base`` (a prepared course) named ``name``: each way of grading starts from the same."""
    work = root / name
    shutil.copytree(root / "base", work)
    return work


def grade_in_turn(root: Path, name: str, jobs: list[parallel.Job], sandbox: bool) -> tuple[Path, list, float]:
    """Grade ``jobs`` one after another in a fresh copy of the course: (its folder, the outcomes, seconds)."""
    work = fresh_copy(root, name)
    grader = pipeline.api(work, sandbox=sandbox)
    started = time.perf_counter()
    outcomes = [pipeline.grade_one(grader, work, None, *job) for job in jobs]
    return work, outcomes, time.perf_counter() - started


def sandboxing() -> tuple[bool, str]:
    """Whether this machine grades in bubblewrap sandboxes, and how the bench's table says so."""
    try:
        check_available()
        return True, "each kernel in its bubblewrap sandbox"
    except SandboxUnavailable:
        return False, "**without** a sandbox (bubblewrap unavailable here)"


def run(quick: bool = False, students: int | None = None, workers: int = 2) -> str:
    n_students = students or (2 if quick else 10)
    # a lesson is graded from its student release: one not released yet cannot be submitted
    released = [lesson for lesson in notebooks.lessons()
                if (pipeline.LESSONS_DIR / lesson / f"{lesson}.ipynb").exists()]
    missing = [lesson for lesson in notebooks.REFERENCE_MODULES if lesson not in released]
    lessons = released
    if not lessons:
        return NOT_AVAILABLE
    sandbox, note = sandboxing()
    logging.getLogger("autograder").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="bench-class-") as tmp:
        root = Path(tmp)
        jobs = make_class(root / "incoming", n_students, lessons)
        started = time.perf_counter()
        pipeline.prepare(root / "base", lessons, sandbox=sandbox)
        prepare_s = time.perf_counter() - started

        work, sequential, sequential_s = grade_in_turn(root, "sequential", jobs, sandbox)

        work = fresh_copy(root, "parallel")
        started = time.perf_counter()
        in_parallel = grade_class.grade_many(jobs, work, None, workers, progress=False, sandbox=sandbox)
        parallel_s = time.perf_counter() - started
    same = [(o.score, o.max_score, o.ok) for o in sequential] == [(o.score, o.max_score, o.ok) for o in in_parallel]
    n = len(jobs)
    scale = 100 * len(lessons) / n  # to a class of 100 students
    rows = []
    for name, wall in [("sequential", sequential_s), (f"grade_many, {workers} workers", parallel_s)]:
        at_100 = wall * scale
        rows.append([name, n, seconds(wall), seconds(wall / n), seconds(at_100) + ("" if scale == 1 else " (est.)"),
                     "yes" if at_100 <= TARGET else "**no**"])
    lines = [table(["grading", "notebooks", "wall", "per notebook", "100 students × all lessons",
                    "≤ 30 min"], rows),
             "",
             f"{n_students} students × {len(lessons)} lessons ({', '.join(lessons)}), {note}; speed-up "
             f"{sequential_s / parallel_s:.2f}× with {workers} workers; "
             f"scores identical: {'yes' if same else '**NO**'}; "
             f"release + {len(lessons)} canaries once before both: {seconds(prepare_s)}. One run each "
             f"(a class is itself an average over its notebooks)."
             + ("" if scale == 1 else " The 100-student column scales the measured wall time linearly "
                                      "(`--students 100` measures it outright, in hours).")
             + (f" Not released yet, so not in the class: {', '.join(missing)} ({NOT_AVAILABLE})." if missing else "")]
    return "\n".join(lines)
