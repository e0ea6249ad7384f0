"""Section ``report``: the class report (autograder/pages/report.py) for a synthetic class of 100 students x 13 lessons.

The class is built, not graded (grading 1,300 notebooks would take hours): a gradebook by nbgrader's own API with
every lesson's graded cells, and for each student and lesson an autograded notebook as the grader leaves it (the
release with the student's code in the exercise cells, a verdict in each graded cell: its error output and its
``course.verdict`` data). Who fails what is drawn from a seeded generator: items of varied difficulty, failures of
every kind, known mistakes by name (the lessons' own, :func:`autograder.course.mutants.of`), some late work, and one
pair
of students who copied each other's code with the names changed. Then ``report.write`` is timed: reading the
gradebook and 1,300 notebooks, statistics, similarity, figures, the page. Median of the repeats.

:func:`synthetic_class` is also what tests/test_report.py builds its pages from (a few students, hostile text).
"""

from __future__ import annotations

import copy
import json
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from bench.common import ROOT, table

TARGET = 30.0  # s for 100 students x 13 lessons on 2 cores
KIND_WEIGHTS = {"not attempted": 3, "raised": 3, "wrong shape or dtype": 2, "wrong values": 6, "leakage": 1,
                "NaN or inf": 1, "policy": 1, "timed out": 1}


def _release(lesson: str) -> dict:
    return json.loads((ROOT / "lessons" / lesson / f"{lesson}.ipynb").read_text())


def _graded(nb: dict) -> list[tuple[str, float]]:
    """(grade id, points) of the release's autograded test cells."""
    found = []
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell["cell_type"] == "code" and meta.get("grade") and not meta.get("solution"):
            found.append((meta["grade_id"], float(meta.get("points", 1))))
    return found


def synthetic_class(work: Path, students: list[str], lessons: list[str], seed: int = 0,
                    verdict_lines: dict[str, str] | None = None, code_extra: dict[str, str] | None = None,
                    copied: tuple[str, str] | None = None) -> None:
    """Write a graded class into ``work`` as ``./course grade`` would leave it: ``gradebook.db``, ``release/``,
    ``autograded/``, ``grades.csv``, ``problems.json``.

    ``verdict_lines``: student -> a text put into each of their failed verdict lines (a student's exception message:
    tests put markup there); ``code_extra``: student -> a line added to each of their exercise cells; ``copied``:
    (a, b): b hands in a's code with every name changed."""
    from nbgrader.api import Gradebook

    # pipeline first: it puts the venv's bin (nbgrader's alembic, which a new gradebook runs) on PATH
    from autograder.course import mutants, notebooks, samples
    from autograder.grading import pipeline
    from autograder.judge import verdicts
    from autograder.pages import report

    assert pipeline.COURSE_ID == report.COURSE_ID

    rng = np.random.default_rng(seed)
    work.mkdir(parents=True, exist_ok=True)
    kinds, weights = list(KIND_WEIGHTS), np.array(list(KIND_WEIGHTS.values()), float)
    due = datetime(2027, 2, 1, 12, tzinfo=UTC)
    attention = []
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}", report.COURSE_ID) as gb:
        for lesson in lessons:
            released = _release(lesson)
            (work / "release" / lesson).mkdir(parents=True, exist_ok=True)
            (work / "release" / lesson / f"{lesson}.ipynb").write_text(json.dumps(released))
            graded = _graded(released)
            gb.update_or_create_assignment(lesson, duedate=due.replace(tzinfo=None))
            gb.add_notebook(lesson, lesson)
            for name, points in graded:
                gb.add_grade_cell(name, lesson, lesson, max_score=points, cell_type="code")
            wrong = {}
            for item, description, replacement in mutants.of(lesson):
                wrong.setdefault(item, []).append((description, samples.mutant_source(next(iter(
                    replacement.values())))))
            difficulty = {name: rng.uniform(0.05, 0.6) for name, _ in graded}
            for student in students:
                gb.update_or_create_student(student)
                late = rng.random() < 0.1
                submission = gb.add_submission(lesson, student, timestamp=(due + timedelta(hours=5 if late else -5))
                                               .replace(tzinfo=None))
                nb = copy.deepcopy(released)
                outcome = {}
                for name, points in graded:
                    failed = rng.random() < difficulty[name]
                    kind = str(rng.choice(kinds, p=weights / weights.sum())) if failed else ""
                    mistake, code = "", None
                    if kind == "wrong values" and wrong.get(name) and rng.random() < 0.7:
                        mistake, code = wrong[name][int(rng.integers(len(wrong[name])))]
                    outcome[name] = (kind, mistake, code, points)
                for cell in nb["cells"]:
                    if isinstance(cell.get("source"), list):
                        cell["source"] = "".join(cell["source"])
                    names = cell.get("metadata", {}).get("course", {}).get("exercise")
                    if names:
                        parts = []
                        for name in names:
                            kind, _, code, _ = outcome.get(name, ("", "", None, 0))
                            parts.append(code if code else notebooks.reference_source(lesson, name, keep_markers=False)
                                         if kind != "not attempted" else cell["source"])
                        cell["source"] = "\n\n".join(parts) + (
                            f"\nscratch_{student}_{int(rng.integers(1 << 30))} = {int(rng.integers(100))}  # mine\n")
                        if code_extra and student in code_extra:
                            cell["source"] += code_extra[student] + "\n"
                    meta = cell.get("metadata", {}).get("nbgrader", {})
                    if cell["cell_type"] == "code" and meta.get("grade_id") in outcome and not meta.get("solution"):
                        kind, mistake, _, _ = outcome[meta["grade_id"]]
                        line = (f"Your values are those of a known mistake: {mistake}." if mistake else
                                f"a synthetic {kind} verdict" if kind else "")
                        if kind and verdict_lines and student in verdict_lines:
                            line = f"{line} {verdict_lines[student]}"
                        cell.setdefault("metadata", {}).setdefault("course", {})[verdicts.VERDICT_KEY] = {
                            "item": meta["grade_id"], "passed": not kind, "kind": kind, "mistake": mistake}
                        cell["outputs"] = ([{"output_type": "error", "ename": verdicts.FAILED_NAME, "evalue": line,
                                             "traceback": [line]}] if kind else
                                           [{"output_type": "stream", "name": "stdout",
                                             "text": f"{verdicts.PASSED_PREFIX}all cases passed\n"}])
                if copied and student == copied[1]:
                    source = work / "autograded" / copied[0] / lesson / f"{lesson}.ipynb"
                    nb = _renamed(json.loads(source.read_text()), student)
                    outcome = _outcomes_of(nb, outcome)
                penalty = 0.0
                for grade in submission.notebooks[0].grades:
                    kind, _, _, points = outcome[grade.name]
                    grade.auto_score = 0.0 if kind else points
                if late:
                    penalty = min(1.0, float(submission.score))
                    submission.late_submission_penalty = penalty
                folder = work / "autograded" / student / lesson
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{lesson}.ipynb").write_text(json.dumps(nb))
                if rng.random() < 0.02:
                    attention.append((student, lesson))
            gb.db.commit()
    with open(work / "grades.csv", "w") as handle:
        handle.write("student,lesson,status\n")
        for student, lesson in attention:
            handle.write(f"{student},{lesson},needs attention\n")
    (work / "problems.json").write_text("[]")


def _renamed(nb: dict, student: str) -> dict:
    """``nb`` with every exercise cell's names changed (a copy made to look like one's own)."""
    import re

    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("course", {}).get("exercise"):
            cell["source"] = re.sub(r"\b([a-z])([a-z_]*)\b", lambda m: m[0] if m[0] in _KEEP else f"my_{m[0]}",
                                    cell["source"]).replace("  # mine", f"  # {student}'s own")
    return nb


_KEEP = {"def", "return", "for", "in", "if", "else", "elif", "not", "and", "or", "is", "None", "import", "from",
         "as", "class", "self", "lambda", "with", "while", "raise", "np", "torch", "nn", "super", "range", "len"}


def _outcomes_of(nb: dict, outcome: dict) -> dict:
    """The outcome of a copied notebook: its verdicts (the original's)."""
    from autograder.judge import verdicts

    found = dict(outcome)
    for cell in nb["cells"]:
        verdict = cell.get("metadata", {}).get("course", {}).get(verdicts.VERDICT_KEY)
        if verdict:
            _, _, code, points = found[verdict["item"]]
            found[verdict["item"]] = (verdict["kind"], verdict["mistake"], code, points)
    return found


def run(quick: bool = False, repeats: int = 3) -> str:
    from autograder.course import notebooks
    from autograder.pages import report

    lessons = notebooks.lessons()
    students = [f"s{i:03d}" for i in range(10 if quick else 100)]
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        work = Path(tmp) / "class"
        started = time.perf_counter()
        synthetic_class(work, students, lessons, copied=(students[0], students[1]))
        built = time.perf_counter() - started
        times = []
        for _ in range(1 if quick else repeats):
            shutil.rmtree(work / "report", ignore_errors=True)
            started = time.perf_counter()
            report.write(work)
            times.append(time.perf_counter() - started)
        pairs = (work / "report" / "similarity.csv").read_text().splitlines()
        top = pairs[1].split(",")[:3] if len(pairs) > 1 else ["none"]
    median = statistics.median(times)
    return table(["class", "report (median)", "range", "runs", f"≤ {TARGET:.0f} s", "top pair", "class built in"],
                 [[f"{len(students)} students × {len(lessons)} lessons", f"{median:.1f} s",
                   f"{min(times):.1f} – {max(times):.1f} s", len(times), "yes" if median <= TARGET else "**no**",
                   " ".join(top), f"{built:.0f} s"]])
