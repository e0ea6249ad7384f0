"""What grading one notebook costs with our trusted verdicts and sandbox, next to plain `nbgrader autograde`.

    .venv/bin/python bench/grading_overhead.py [--lesson 01-masks] [--repeats 5]

The same submission (the lesson's reference solutions typed into the release) is autograded by

- **plain nbgrader**: nbgrader 0.9.6's defaults (``Execute``: the notebook, hidden cells included, runs in an
  ordinary kernel; our hidden cells only collect, which does nothing outside a grading run);
- **trusted, no sandbox**: our pipeline with ``--no-sandbox`` (cases written, outputs harvested, verdicts made
  outside the kernel, metadata restored);
- **trusted + sandbox**, twice: our pipeline as it grades (the kernel in bubblewrap), for a student's **first**
  notebook (grading as root, the student's warm sandbox starts: its zygote imports torch and the rest once) and
  for a student's **next** one (the warm sandbox's zygote forks the kernel; see
  ``autograder.sandbox.warm.WarmSandbox``);
  without root both are cold sandboxes;

each in its own work folder, side by side: every round runs the three in a rotated order, and the table gives
medians (and the spread) over the rounds. Feedback is timed apart. Then, as root, what a sandbox's control group
costs and a classmate's notebook graded beside a hostile one (``bench/hostile_neighbour.py``). Prints markdown.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import nbformat  # noqa: E402
from nbgrader.api import Gradebook  # noqa: E402
from nbgrader.apps import NbGraderAPI  # noqa: E402
from nbgrader.coursedir import CourseDirectory  # noqa: E402

from autograder.course import notebooks, samples  # noqa: E402
from autograder.grading import pipeline  # noqa: E402
from autograder.sandbox import launch as sandbox  # noqa: E402
from autograder.sandbox import warm  # noqa: E402
from bench import hostile_neighbour  # noqa: E402

STUDENT = "bench"
FIRST = "trusted verdicts + sandbox, a student's first notebook"
NEXT = "trusted verdicts + sandbox, a student's next notebook"


def plain_api(work: Path) -> NbGraderAPI:
    """nbgrader with its default autograde steps; only the folders are ours."""
    config = pipeline.nbgrader_config(work)
    del config.Autograde["autograde_preprocessors"], config.Autograde["sanitize_preprocessors"]
    del config["TrustedExecute"]
    config.GenerateFeedback.preprocessors = ["nbgrader.preprocessors.GetGrades",
                                             "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor"]
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


def setup(work: Path, grader: NbGraderAPI, lesson: str, submission) -> None:
    result = grader.generate_assignment(lesson, force=True, create=True)
    assert result["success"], result["log"]
    path = work / "submitted" / STUDENT / lesson / f"{lesson}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(submission, path)


def timed(fn) -> float:
    started = time.perf_counter()
    result = fn()
    assert result is None or result.get("success", True), result.get("log", "")[-2000:]
    return time.perf_counter() - started


def startup(repeats: int) -> tuple[float, float]:
    """Median seconds to run `python -c pass` directly and inside the sandbox."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        box = sandbox.Sandbox(Path(tmp) / "box", sandbox.Limits())
        box.prepare()
        box.seal()
        plain, boxed = [], []
        try:
            for _ in range(repeats):
                plain.append(timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True) and None))
                boxed.append(timed(lambda: subprocess.run(box.command([sys.executable, "-c", "pass"]),
                                                          env=box.outer_env(), cwd=box.scratch, check=True) and None))
        finally:
            box.release()
    return statistics.median(plain), statistics.median(boxed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lesson", default="01-masks")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    pipeline.quiet_nbgrader(False)
    notebooks.build_all()
    submission = samples.perfect(args.lesson)
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        work = {"plain nbgrader autograde": Path(tmp) / "plain",
                "trusted verdicts, no sandbox": Path(tmp) / "trusted",
                FIRST: Path(tmp) / "sandboxed-first",
                NEXT: Path(tmp) / "sandboxed-next"}
        names = list(work)
        variants = {names[0]: plain_api(work[names[0]]), names[1]: pipeline.api(work[names[1]], sandbox=False),
                    FIRST: pipeline.api(work[FIRST], sandbox=True), NEXT: pipeline.api(work[NEXT], sandbox=True)}
        for name, grader in variants.items():
            setup(work[name], grader, args.lesson, submission)
        grade: dict[str, list[float]] = {name: [] for name in names}
        feedback: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(args.repeats + 1):  # round 0 warms caches and is not counted
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                grader = variants[name]
                if name == FIRST:
                    warm.retire_warm()  # not timed: the student's sandbox starts in the autograde below
                g = timed(lambda grader=grader: grader.autograde(args.lesson, STUDENT, force=True, create=True))
                f = timed(lambda grader=grader: grader.generate_feedback(args.lesson, STUDENT, force=True))
                if round_:
                    grade[name].append(g)
                    feedback[name].append(f)
        warm.retire_warm()
        scores = {}
        for name, grader in variants.items():
            with Gradebook(grader.coursedir.db_url, pipeline.COURSE_ID) as gb:
                sub = gb.find_submission(args.lesson, STUDENT)
                scores[name] = f"{sub.score:g}/{sub.max_score:g}"

        def classmate() -> str:  # a student's next notebook, as above: graded, then its score
            assert variants[NEXT].autograde(args.lesson, STUDENT, force=True, create=True)["success"]
            with Gradebook(variants[NEXT].coursedir.db_url, pipeline.COURSE_ID) as gb:
                sub = gb.find_submission(args.lesson, STUDENT)
                return f"{sub.score:g}/{sub.max_score:g}"

        beside = hostile_neighbour.report(classmate, args.lesson, args.repeats)
        warm.retire_warm()
    plain_start, boxed_start = startup(max(5, args.repeats))
    base = statistics.median(grade[names[0]])
    print(f"### Grading one `{args.lesson}` notebook ({args.repeats} rounds, medians; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})\n")
    print("| variant | autograde (s) | spread (s) | overhead vs plain | feedback (s) | score |")
    print("|---|---|---|---|---|---|")
    for name in names:
        med = statistics.median(grade[name])
        spread = f"{min(grade[name]):.2f}–{max(grade[name]):.2f}"
        over = "—" if name == names[0] else f"{med - base:+.2f} s ({(med / base - 1) * 100:+.0f} %)"
        print(f"| {name} | {med:.2f} | {spread} | {over} | {statistics.median(feedback[name]):.2f} | "
              f"{scores[name]} |")
    first, nxt = statistics.median(grade[FIRST]), statistics.median(grade[NEXT])
    mean13 = (first + 12 * nxt) / 13
    print(f"\nTarget ≤ 1.0× plain nbgrader with the sandbox on: a student's next notebook {nxt / base:.2f}× "
          f"({'yes' if nxt <= base else '**no**'}), first notebook {first / base:.2f}× "
          f"({'yes' if first <= base else '**no**'}); over a student's 13 lessons (1 first, 12 next) "
          f"{mean13 / base:.2f}× ({'yes' if mean13 <= base else '**no**'}).")
    print(f"\nSandbox start-up alone: `python -c pass` {plain_start * 1000:.0f} ms directly, "
          f"{boxed_start * 1000:.0f} ms inside bubblewrap ({(boxed_start - plain_start) * 1000:+.0f} ms).")
    print(beside)


if __name__ == "__main__":
    main()
