"""The instructor pipeline: release, canary, autograde, feedback, export, all through nbgrader.

Everything the pipeline writes goes into a work folder (default ``.grading/``, never committed): nbgrader's
``submitted/``, ``autograded/`` and ``feedback/`` trees, the gradebook (SQLite by default, any SQLAlchemy URL with
``--db-url``), the grading secret, the grade CSV and a log. The instructor's submissions folder is only read.

Every student's kernel runs in a bubblewrap sandbox (:mod:`autograder.sandbox`) under :class:`Limits`; grading
refuses to start without one unless ``sandbox=False`` (``--no-sandbox``) says so. A submission is checked before
nbgrader sees it (size, JSON, notebook structure): a bad one is reported with a message and the run goes on.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
from nbconvert.preprocessors import ClearMetadataPreprocessor
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.apps import NbGraderAPI
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import (
    AssignLatePenalties,
    CheckCellMetadata,
    ClearOutput,
    DeduplicateIds,
    IgnorePattern,
    LimitOutput,
    OverwriteCells,
    OverwriteKernelspec,
    SaveAutoGrades,
)
from sqlalchemy.exc import SAWarning
from traitlets.config import Config

from autograder import nbgrader_plugins, notebooks
from autograder.nbgrader_plugins import RestoreGradingMetadata, StripHiddenTests, TrustedExecute
from autograder.sandbox import Limits, SandboxUnavailable, check_available

__all__ = ["CANARY", "Limits", "Outcome", "SandboxUnavailable", "api", "collect_submissions", "grade", "grade_one",
           "nbgrader_config", "release", "score_table"]

ROOT = notebooks.ROOT
LESSONS_DIR = ROOT / "lessons"
COURSE_ID = "decoder-course"
CANARY = "canary"
STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

log = logging.getLogger("autograder")

# nbgrader 0.9.6's gradebook code triggers SQLAlchemy 2.x autoflush notices on every autograde; scores are
# unaffected (tests/test_pipeline.py reads them back), so keep them out of the instructor's terminal.
warnings.filterwarnings("ignore", category=SAWarning)

# nbgrader runs the `alembic` and `jupyter` executables of its environment: make sure they are found even when
# this interpreter was started by its full path (e.g. .venv/bin/python) with an unrelated PATH.
_BIN = str(Path(sys.executable).parent)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")


def nbgrader_config(work: Path, db_url: str | None = None, release_dir: Path | None = None,
                    verbose: bool = False, sandbox: bool = True, limits: Limits | None = None) -> Config:
    """nbgrader's configuration for this course, with our trusted execution in place of ``Execute``."""
    limits = limits or Limits()
    c = Config()
    c.CourseDirectory.root = str(ROOT)
    c.CourseDirectory.course_id = COURSE_ID
    c.CourseDirectory.source_directory = "solutions"
    c.CourseDirectory.release_directory = str(release_dir or work / "release")
    c.CourseDirectory.submitted_directory = str(work / "submitted")
    c.CourseDirectory.autograded_directory = str(work / "autograded")
    c.CourseDirectory.feedback_directory = str(work / "feedback")
    c.CourseDirectory.db_url = db_url or f"sqlite:///{work / 'gradebook.db'}"
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "*.py"]
    c.Application.log_level = "INFO" if verbose else "WARN"
    c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
    # The instructor's grading metadata first: an edited, forged or duplicated cell must not abort the notebook.
    c.Autograde.sanitize_preprocessors = [
        ClearOutput, RestoreGradingMetadata, DeduplicateIds, OverwriteKernelspec, OverwriteCells, CheckCellMetadata,
    ]
    c.Autograde.autograde_preprocessors = [
        TrustedExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
        AssignLatePenalties, CheckCellMetadata,
    ]
    c.Autograde.create_student = True
    # A deleted test cell comes back (the instructor's copy, its first line a comment) and is graded as usual.
    c.OverwriteCells.add_missing_cells = True
    (work / "exchange").mkdir(parents=True, exist_ok=True)
    c.Exchange.root = str(work / "exchange")  # unused by this pipeline; keeps nbgrader off /usr/local/share
    c.TrustedExecute.timeout = limits.cell_timeout
    c.TrustedExecute.iopub_timeout = limits.interrupt_grace
    c.TrustedExecute.sandbox = sandbox
    c.TrustedExecute.limits = asdict(limits)
    c.TrustedExecute.secret_file = str(work / "secret")
    c.GenerateFeedback.preprocessors = [
        "nbgrader.preprocessors.GetGrades", StripHiddenTests, "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    ]
    return c


def api(work: Path, db_url: str | None = None, release_dir: Path | None = None,
        verbose: bool = False, sandbox: bool = True, limits: Limits | None = None) -> NbGraderAPI:
    config = nbgrader_config(work, db_url, release_dir, verbose, sandbox, limits)
    coursedir = CourseDirectory(config=config)
    return NbGraderAPI(coursedir=coursedir, config=config)


def quiet_nbgrader(verbose: bool) -> None:
    """nbgrader logs every file it writes; keep that in its result logs unless asked (-v)."""
    for name in ("NbGraderAPI", "traitlets", "nbgrader"):
        logging.getLogger(name).propagate = verbose


# -- release -----------------------------------------------------------------------------------------------------
def release(lessons: list[str] | None = None, out: Path = LESSONS_DIR, work: Path | None = None) -> list[str]:
    """Build the solution notebooks, then the student release with ``nbgrader generate_assignment``."""
    notebooks.build_all()
    lessons = lessons or notebooks.lessons()
    with tempfile.TemporaryDirectory(prefix="release-") as tmp:
        work = work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        grader = api(work, release_dir=out)
        for lesson in lessons:
            result = grader.generate_assignment(lesson, force=True, create=True)
            if not result["success"]:
                raise RuntimeError(f"generate_assignment failed for {lesson}:\n{result['log']}")
    return lessons


# -- collecting submissions --------------------------------------------------------------------------------------
@dataclass
class Collected:
    """Submissions found, and what could not be taken (with why)."""

    found: dict[str, dict[str, Path]] = field(default_factory=dict)  # student -> lesson -> notebook path
    problems: list[str] = field(default_factory=list)


def collect_submissions(source: Path, lessons: list[str], scratch: Path) -> Collected:
    """Read an nbgrader-layout folder (``student/lesson/*.ipynb``) or an LMS zip export.

    In a zip, entries may be ``student/lesson/name.ipynb`` or flat ``student_anything_<lesson>.ipynb`` (the lesson
    id must appear in the file name).
    """
    out = Collected()
    if source.is_file() and zipfile.is_zipfile(source):
        unpacked = scratch / "unzipped"
        with zipfile.ZipFile(source) as archive:
            for info in archive.infolist():
                name = Path(info.filename)
                if info.is_dir() or name.is_absolute() or ".." in name.parts or name.suffix != ".ipynb":
                    continue
                target = unpacked / name
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        source = unpacked
    if not source.is_dir():
        out.problems.append(f"{source}: not a folder or a zip file")
        return out
    for path in sorted(source.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        rel = path.relative_to(source).parts
        if len(rel) >= 3:
            student, lesson = rel[-3], rel[-2]
            if lesson not in lessons:  # a renamed lesson folder: the lesson id may still be in the file name
                lesson = next((lid for lid in lessons if lid in path.name), lesson)
        else:
            lesson = next((lid for lid in lessons if lid in path.name), "")
            student = path.name.split("_", 1)[0] if "_" in path.name else ""
        if lesson not in lessons:
            out.problems.append(f"{path}: no known lesson in its path; expected one of {', '.join(lessons)}")
            continue
        if not STUDENT_ID.match(student) or student == CANARY:
            out.problems.append(f"{path}: student id {student!r} is not usable (letters, digits, . _ -)")
            continue
        previous = out.found.setdefault(student, {}).get(lesson)
        if previous is not None:
            out.problems.append(f"{path}: a second notebook for {student}/{lesson}; kept {previous.name}")
            continue
        out.found[student][lesson] = path
    for folder in sorted(p for p in source.iterdir() if p.is_dir() and STUDENT_ID.match(p.name)):
        if folder.name not in out.found and not any(folder.rglob("*.ipynb")):
            out.problems.append(f"{folder}: no notebook in this student's folder")
    for student, found in sorted(out.found.items()):
        missing = [lesson for lesson in lessons if lesson not in found]
        if missing:
            out.problems.append(f"{student}: no notebook for {', '.join(missing)} (nothing to grade there)")
    return out


# -- grading -----------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    student: str
    lesson: str
    score: float
    max_score: float
    ok: bool = True
    message: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what happened while grading it (timeouts, kills, repairs)


class BadSubmission(Exception):
    """A submitted file that cannot be graded; the message says why and what to do."""


def read_submission(notebook: Path, max_bytes: int) -> nbformat.NotebookNode:
    """Read a submitted notebook, refusing what nbgrader would choke on, with a message a student understands."""
    try:
        size = notebook.stat().st_size
    except OSError as exc:
        raise BadSubmission(f"the notebook cannot be read ({exc.strerror})") from exc
    if size > max_bytes:
        raise BadSubmission(
            f"the notebook is {size / 2**20:.1f} MB, over the {max_bytes / 2**20:.0f} MB limit: clear its outputs "
            "(Kernel > Restart Kernel and Clear Outputs), save, and submit again")
    raw = notebook.read_bytes()
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadSubmission("the file is not a notebook: it is not UTF-8 text") from exc
    except json.JSONDecodeError as exc:
        raise BadSubmission(
            f"the file is not a notebook: invalid JSON at line {exc.lineno}, column {exc.colno} ({exc.msg}); it "
            "was probably cut off or edited outside Jupyter") from exc
    if not isinstance(data, dict) or "cells" not in data:
        raise BadSubmission("the file is JSON but not a notebook (it has no cells)")
    try:
        nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
        nbformat.validate(nb)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise BadSubmission(f"the notebook's structure is invalid ({first}); open it in Jupyter, save it, "
                            "and submit again") from exc
    return nb


def _place(work: Path, student: str, lesson: str, notebook: Path, max_bytes: int | None = None) -> None:
    """Check a notebook, then write it into nbgrader's submitted tree under the name nbgrader expects."""
    nb = read_submission(notebook, max_bytes or Limits().notebook_bytes)
    dest = work / "submitted" / student / lesson
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    nbformat.write(nb, dest / f"{lesson}.ipynb")


def _score(work: Path, db_url: str | None, lesson: str, student: str) -> tuple[float, float]:
    with Gradebook(db_url or f"sqlite:///{work / 'gradebook.db'}", COURSE_ID) as gb:
        submission = gb.find_submission(lesson, student)
        return float(submission.score), float(submission.max_score)


def grade_one(grader: NbGraderAPI, work: Path, db_url: str | None, student: str, lesson: str,
              notebook: Path) -> Outcome:
    """Autograde one notebook and write its feedback; a failure is reported, never raised."""
    started = time.perf_counter()
    nbgrader_plugins.NOTES.pop((lesson, student), None)
    outcome = _grade_one(grader, work, db_url, student, lesson, notebook)
    outcome.notes = nbgrader_plugins.NOTES.pop((lesson, student), [])
    outcome.seconds = time.perf_counter() - started
    return outcome


def _grade_one(grader: NbGraderAPI, work: Path, db_url: str | None, student: str, lesson: str,
               notebook: Path) -> Outcome:
    try:
        max_bytes = grader.config.TrustedExecute.limits.get("notebook_bytes")
        _place(work, student, lesson, notebook, max_bytes)
        result = grader.autograde(lesson, student, force=True, create=True)
        if not result["success"]:
            return Outcome(student, lesson, 0.0, 0.0, ok=False, message=_last_error(result["log"]))
        grader.generate_feedback(lesson, student, force=True)
        score, max_score = _score(work, db_url, lesson, student)
        return Outcome(student, lesson, score, max_score)
    except BadSubmission as exc:
        log.warning("%s %s: not graded: %s", student, lesson, exc)
        return Outcome(student, lesson, 0.0, 0.0, ok=False, message=str(exc))
    except MissingEntry as exc:
        return Outcome(student, lesson, 0.0, 0.0, ok=False, message=f"gradebook entry missing: {exc}")
    except Exception as exc:  # one notebook's trouble is reported and the run goes on
        return Outcome(student, lesson, 0.0, 0.0, ok=False, message=f"{type(exc).__name__}: {exc}")


def _last_error(text: str) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    errors = [line for line in lines if "ERROR" in line or "Error" in line]
    return (errors or lines or ["unknown error"])[-1][:500]


def run_canary(grader: NbGraderAPI, work: Path, db_url: str | None, lesson: str) -> Outcome:
    """Grade the solution notebook as a student: anything short of full marks stops the pipeline."""
    outcome = grade_one(grader, work, db_url, CANARY, lesson, notebooks.solution_path(lesson))
    if not outcome.ok or outcome.score != outcome.max_score or outcome.max_score == 0:
        raise SystemExit(
            f"canary failed for {lesson}: the reference solutions scored {outcome.score}/{outcome.max_score}"
            f"{' (' + outcome.message + ')' if outcome.message else ''}. Fix the checks before grading students."
        )
    return outcome


def grade(submissions: Path, work: Path, lessons: list[str] | None = None, db_url: str | None = None,
          verbose: bool = False, sandbox: bool = True, limits: Limits | None = None, workers: int = 1,
          progress: bool = False) -> list[Outcome]:
    """Canary first, then every student (``workers`` at a time, see :mod:`autograder.parallel`), feedback, CSV.

    Each kernel runs in a sandbox under ``limits``; without bubblewrap this raises :class:`SandboxUnavailable`
    unless ``sandbox=False`` (unsafe: student code then runs with the grader's rights).
    """
    quiet_nbgrader(verbose)
    if sandbox:
        check_available()
    else:
        log.warning("grading WITHOUT a sandbox (--no-sandbox): student code can read the solutions and the "
                    "gradebook, and harm this machine")
    work.mkdir(parents=True, exist_ok=True)
    lessons = lessons or notebooks.lessons()
    notebooks.build_all()
    grader = api(work, db_url, verbose=verbose, sandbox=sandbox, limits=limits)
    for lesson in lessons:
        result = grader.generate_assignment(lesson, force=True, create=True)
        if not result["success"]:
            raise SystemExit(f"generate_assignment failed for {lesson}:\n{result['log']}")
    with tempfile.TemporaryDirectory(prefix="collect-") as tmp:
        collected = collect_submissions(submissions, lessons, Path(tmp))
        for problem in collected.problems:
            log.warning("skipped: %s", problem)
        outcomes = [run_canary(grader, work, db_url, lesson) for lesson in lessons]
        jobs = [(student, lesson, collected.found[student][lesson])
                for student in sorted(collected.found) for lesson in lessons if lesson in collected.found[student]]
        if workers > 1:
            from autograder.parallel import grade_many  # processes: TrustedExecute's state is per process

            outcomes += grade_many(jobs, work, db_url, workers, progress, verbose=verbose, sandbox=sandbox,
                                   limits=limits)
        else:
            for student, lesson, notebook in jobs:
                outcome = grade_one(grader, work, db_url, student, lesson, notebook)
                log.info("%s %s: %s/%s", student, lesson, outcome.score, outcome.max_score)
                outcomes.append(outcome)
    write_csv(work / "grades.csv", outcomes)
    (work / "problems.json").write_text(json.dumps(collected.problems, indent=2))
    return outcomes


def write_csv(path: Path, outcomes: list[Outcome]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "lesson", "score", "max_score", "status", "message"])
        for o in outcomes:
            if o.student == CANARY:
                continue
            writer.writerow([o.student, o.lesson, o.score, o.max_score, "ok" if o.ok else "needs attention",
                             "; ".join(filter(None, [o.message, *o.notes]))])


def score_table(outcomes: list[Outcome]) -> str:
    """A markdown table: one row per student, one column per lesson."""
    lessons = sorted({o.lesson for o in outcomes})
    students = sorted({o.student for o in outcomes}, key=lambda s: (s != CANARY, s))
    cell = {(o.student, o.lesson): o for o in outcomes}
    lines = ["| student | " + " | ".join(lessons) + " |", "|---|" + "---|" * len(lessons)]
    for student in students:
        row = []
        for lesson in lessons:
            o = cell.get((student, lesson))
            row.append("" if o is None else (f"{o.score:g}/{o.max_score:g}" if o.ok else "needs attention"))
        lines.append(f"| {student} | " + " | ".join(row) + " |")
    return "\n".join(lines)
