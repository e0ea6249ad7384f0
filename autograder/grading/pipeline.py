"""The instructor pipeline: release, canary, autograde, feedback, export, all through nbgrader.

Everything the pipeline writes goes into a work folder (default ``.grading/``, never committed): nbgrader's
``submitted/``, ``autograded/`` and ``feedback/`` trees, the gradebook (SQLite by default, any SQLAlchemy URL with
``--db-url``), the grading secret, the grade CSV and a log. The instructor's submissions folder is only read.

Every student's kernel runs in a bubblewrap sandbox (:mod:`autograder.sandbox.launch`) under :class:`Limits`; grading
refuses to start without one unless ``sandbox=False`` (``--no-sandbox``) says so. A submission is checked before
nbgrader sees it (size, JSON, notebook structure): a bad one is reported with a message and the run goes on.

With a term (:mod:`autograder.term.schedule`) each lesson has a due date: the gradebook gets it, and each student's
extension, and a late notebook loses points by the term's policy, through nbgrader's own late-penalty step
(:mod:`autograder.term.late`); ``grades.csv`` shows the raw score, the penalty and the final score.
"""

from __future__ import annotations

import csv
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from nbconvert.preprocessors import ClearMetadataPreprocessor
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.apps import NbGraderAPI
from nbgrader.converters import GenerateAssignment
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import (
    CheckCellMetadata,
    ClearOutput,
    ClearSolutions,
    DeduplicateIds,
    IgnorePattern,
    LimitOutput,
    OverwriteCells,
    OverwriteKernelspec,
    SaveAutoGrades,
    SaveCells,
)
from nbgrader.utils import capture_log, temp_attrs
from sqlalchemy.exc import SAWarning
from traitlets.config import Config

from autograder.course import bugs, notebooks
from autograder.grading import access
from autograder.intake import hub_steps
from autograder.intake import submissions as intake
from autograder.intake.submissions import BadSubmission
from autograder.judge import preprocessors as nbgrader_plugins
from autograder.judge.preprocessors import RestoreGradingMetadata, StripHiddenTests, TrustedExecute
from autograder.pages import exporters, gradebook_views
from autograder.sandbox.launch import MAX_SLOWDOWN, Limits, SandboxUnavailable, check_available
from autograder.term import integrity
from autograder.term import schedule as term_module
from autograder.term.integrity import HoldWhileOpen, WithholdOpenAnswers
from autograder.term.late import TermLatePenalties, TermLatePolicy, sync_gradebook
from decoder_course.text import csv_cell, csv_writer, shown

__all__ = ["CANARY", "BadSubmission", "Limits", "Outcome", "SandboxUnavailable", "api",
           "grade_one", "nbgrader_config", "prepare", "release", "score_table", "summary", "tools_config"]

ROOT = notebooks.ROOT
LESSONS_DIR = ROOT / "lessons"
COURSE_ID = "decoder-course"
CANARY = "canary"

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
                    verbose: bool = False, sandbox: bool = True, limits: Limits | None = None,
                    secret_file: Path | None = None, term_file: Path | str | None = None,
                    as_of: datetime | None = None) -> Config:
    """nbgrader's configuration for this course, with our trusted execution in place of ``Execute`` and the
    term's late penalties in place of ``AssignLatePenalties``. ``term_file``: the term
    (:mod:`autograder.term.schedule`);
    None: the default one (``$DECODER_COURSE_TERM``, ``term.toml``) when there; ``""``: none. ``as_of``: the
    moment a release is made (None: now), which decides what of earlier lessons it withholds
    (:mod:`autograder.term.integrity`)."""
    limits = limits or Limits()
    c = Config()
    c.WithholdOpenAnswers.as_of = as_of.isoformat() if as_of else ""
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
    # A find-the-bug cell is released with its bug where the stub would go (autograder.course.bugs.ShowBug).
    # After the gradebook saved each cell (SaveCells), a term's release withholds earlier lessons' answers still open:
    # the gradebook keeps the course's code of those (locked) cells, which grading puts back
    # (autograder.term.integrity).
    steps = []
    for step in GenerateAssignment.preprocessors.make_dynamic_default():
        steps += ([bugs.ShowBug] if step is ClearSolutions else
                  [step, WithholdOpenAnswers] if step is SaveCells else [step])
    c.GenerateAssignment.preprocessors = steps
    # The instructor's grading metadata first: an edited, forged or duplicated cell must not abort the notebook.
    c.Autograde.sanitize_preprocessors = [
        ClearOutput, RestoreGradingMetadata, DeduplicateIds, OverwriteKernelspec, OverwriteCells, CheckCellMetadata,
    ]
    c.Autograde.autograde_preprocessors = [
        TrustedExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
        TermLatePenalties, CheckCellMetadata,
    ]
    # The term's due dates and policy, for every late-penalty step nbgrader runs (ours, and its own class).
    if term_file is not None:
        c.TermFile.file = str(Path(term_file).resolve()) if str(term_file) else ""
    c.AssignLatePenalties.plugin_class = TermLatePolicy
    c.Autograde.create_student = True
    # A deleted test cell comes back (the instructor's copy, its first line a comment) and is graded as usual.
    c.OverwriteCells.add_missing_cells = True
    (work / "exchange").mkdir(parents=True, exist_ok=True)
    c.Exchange.root = str(work / "exchange")  # unused by this pipeline; keeps nbgrader off /usr/local/share
    c.TrustedExecute.timeout = limits.cell_timeout
    c.TrustedExecute.iopub_timeout = limits.interrupt_grace
    c.TrustedExecute.sandbox = sandbox
    c.TrustedExecute.limits = asdict(limits)
    c.TrustedExecute.secret_file = str(secret_file or work / "secret")
    # SafeFeedback last: it sanitises everything the student controls and adds the grader's report and verdicts.
    # HoldWhileOpen first: no page for a lesson whose grading ran answers of a lesson still open
    c.GenerateFeedback.preprocessors = [
        HoldWhileOpen, "nbgrader.preprocessors.GetGrades", StripHiddenTests,
        "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor", "autograder.pages.feedback.SafeFeedback",
    ]
    # nbconvert's HTMLExporter, same template and page, without its BeautifulSoup pass over the whole page.
    c.GenerateFeedback.exporter_class = "autograder.pages.exporters.FeedbackExporter"
    # Its template: nbgrader's page with a language, a <main> landmark and headings in order (the exporter's own
    # section, so formgrader's HTMLExporter keeps its "formgrade" template)
    c.FeedbackExporter.template_name = exporters.PAGE_TEMPLATE
    c.FeedbackExporter.template_file = exporters.PAGE_FILE
    c.FeedbackExporter.extra_template_basedirs = exporters.page_template_dirs()
    return c


def api(work: Path, db_url: str | None = None, release_dir: Path | None = None,
        verbose: bool = False, sandbox: bool = True, limits: Limits | None = None,
        secret_file: Path | None = None, term_file: Path | str | None = None,
        as_of: datetime | None = None) -> NbGraderAPI:
    config = nbgrader_config(work, db_url, release_dir, verbose, sandbox, limits, secret_file, term_file, as_of)
    coursedir = CourseDirectory(config=config)
    return NbGraderAPI(coursedir=coursedir, config=config)


WORK = ROOT / ".grading"  # ./course grade's default work folder, and the one nbgrader_config.py points at


def tools_config(c: Config, work: Path | None = None) -> Config:
    """Configure nbgrader's own tools (the CLI, formgrader, the exchange) for this course: the repository's
    ``nbgrader_config.py`` calls this.

    They work on the tree and gradebook that ``./course grade`` uses (``.grading/``, or ``$DECODER_COURSE_WORK``;
    the gradebook ``$GRADEBOOK_URL`` when set), hand out ``lessons/`` (``release_assignment``), collect only what
    each student's own account submitted, with no link in it
    (:class:`~autograder.intake.exchange.CourseExchangeCollect`,
    which sets the rest apart in ``set_apart/``), and never grade
    without the course's trusted execution and sandbox: ``nbgrader autograde`` and formgrader's Autograde button
    run :class:`~autograder.judge.preprocessors.TrustedExecute` exactly as ``./course grade`` does (same secret, so the
    same hidden cases and the same scores), feedback and formgrader's view of a submission go through the same
    sanitiser within its bound (:class:`~autograder.pages.exporters.BoundedExporter`), and a notebook over the
    size limit stops the run with a message naming ``./course grade`` before a byte of it is parsed. The canary is
    not in this gradebook (it has its own tree), so it is never a student in ``export`` or formgrader's averages. The
    term is
    ``./course grade``'s default one (``$DECODER_COURSE_TERM``, else ``term.toml``): ``nbgrader autograde`` and
    formgrader give the same due dates, extensions and late penalties.
    """
    work = Path(os.environ.get("DECODER_COURSE_WORK") or work or WORK)
    course = nbgrader_config(work, os.environ.get("GRADEBOOK_URL") or None, release_dir=LESSONS_DIR)
    exchange = c.Exchange.root if "root" in c.Exchange else None  # a hub's system-wide config names it
    c.merge(course)
    # a term's release (./course release with a term) is what release_assignment hands out; else the lessons
    c.CourseDirectory.release_directory = str(work / "lessons") if term_module.path() else "lessons"
    c.Exchange.root = os.environ.get("NBGRADER_EXCHANGE_ROOT") or exchange or "/srv/nbgrader/exchange"
    # nbgrader's exchange steps, each saying what it did in one line (collect: CourseExchangeCollect's checks)
    c.ExchangeFactory.collect = hub_steps.SayingCollect
    c.ExchangeFactory.release_assignment = hub_steps.SayingReleaseAssignment
    c.ExchangeFactory.release_feedback = hub_steps.SayingReleaseFeedback
    c.CourseExchangeCollect.set_apart_directory = str(work / "set_apart")
    c.Autograde.pre_convert_hook = refuse_oversized
    c.ExportApp.plugin_class = "autograder.judge.preprocessors.SafeCsvExport"  # the CSV writer; own due dates
    # what their Generate and feedback hand out is recorded beside the term's release (integrity.ledger_from_config)
    c.HandedOutFile.file = str(handed_out_ledger(work))
    _stage_generate_assignment()
    _sanitise_formgrader()
    gradebook_views.install()  # final scores (the late penalty taken), the term's lessons
    return c


class StagedGenerateAssignment(GenerateAssignment):
    """nbgrader's ``generate_assignment`` as ``./course release`` does it, for nbgrader's own tools (formgrader's
    Generate button, ``nbgrader generate_assignment``): the solution notebooks are rebuilt from their sources
    first, and the student version is written into a staging folder beside the release folder and moved into
    place only when every notebook was generated. nbgrader alone would delete ``lessons/<id>`` first, write into
    it, and delete what it wrote on a failure, leaving the lesson missing from the release."""

    _staging: str | None = None

    @property
    def _output_directory(self) -> str:
        return self._staging or self.coursedir.release_directory

    def start(self) -> None:
        notebooks.build_all()
        release = Path(self.coursedir.root) / self.coursedir.release_directory
        term, ledger = term_module.from_config(self), integrity.ledger_from_config(self)
        if term is not None and ledger is not None:
            integrity.handed_out(ledger)  # unreadable: stop before anything is generated
        release.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".generate-", dir=release.parent) as staging:
            self._staging = staging
            try:
                super().start()
            finally:
                self._staging = None
            at = integrity.as_of_moment(self.config.WithholdOpenAnswers.get("as_of", ""))
            problems = integrity.check_release(Path(staging), [self.coursedir.assignment_id], term, at)
            if problems:
                raise ReleaseRefused("this release would hand out graded answers of lessons still open (nothing "
                                     "was released):\n" + "\n".join(problems))
            for folder in sorted(p for p in Path(staging).iterdir() if not p.name.startswith(".")):
                target, old = release / folder.name, Path(staging) / f".{folder.name}.old"
                if target.exists():
                    target.rename(old)
                folder.rename(target)
            if ledger is not None:  # nbgrader's own tools: this release is what students get
                integrity.record_handed_out(ledger, term, [self.coursedir.assignment_id], at)


def _stage_generate_assignment() -> None:
    """Make nbgrader's API (formgrader) and its CLI generate through :class:`StagedGenerateAssignment`."""
    from nbgrader.apps import api as nbgrader_api
    from nbgrader.apps import generateassignmentapp

    nbgrader_api.GenerateAssignment = StagedGenerateAssignment
    generateassignmentapp.GenerateAssignment = StagedGenerateAssignment


def _sanitise_formgrader() -> None:
    """Make formgrader render each submission with :class:`autograder.pages.exporters.FormgradeExporter`: the course's
    sanitiser within its bound, so no student script runs in the instructor's Jupyter session. formgrader builds
    its exporter from this module-level name after reading this configuration, and has no setting for its class."""
    from nbgrader.server_extensions.formgrader import formgrader

    from autograder.pages.exporters import FormgradeExporter

    formgrader.HTMLExporter = FormgradeExporter


def refuse_oversized(assignment: str, student: str, notebooks: list[str]) -> None:
    """nbgrader's pre-convert hook: stop before nbgrader reads a notebook ``./course grade`` would refuse.

    nbgrader ignores ordinary exceptions from a hook, so this exits: the run stops and says why."""
    limit = Limits().notebook_bytes
    for path in notebooks:
        size = os.path.getsize(path)
        if size > limit:
            raise SystemExit(f"{shown(path)} is {size / 2**20:.1f} MB, over the {limit / 2**20:.0f} MB limit: nbgrader "
                             "would read all of it. Grade with ./course grade, which refuses it (the student is told "
                             "why) and grades every other notebook.")


def quiet_nbgrader(verbose: bool) -> None:
    """nbgrader logs every file it writes; keep that in its result logs unless asked (-v)."""
    for name in ("NbGraderAPI", "traitlets", "nbgrader"):
        logging.getLogger(name).propagate = verbose


# -- release -----------------------------------------------------------------------------------------------------
TERM_RELEASE = WORK / "lessons"  # a term's release (nbgrader's release_assignment hands it out): never committed


def handed_out_ledger(work: Path) -> Path:
    """The record of what went out (:mod:`autograder.term.integrity`) of a work folder: beside its term release,
    ``work/lessons``, where ``./course release`` writes by default; feedback pages add to it too."""
    return integrity.ledger_of(work / TERM_RELEASE.name)


class ReleaseRefused(RuntimeError):
    """A release that would hand out a graded answer of a lesson still open; the message names each cell."""


def release(lessons: list[str] | None = None, out: Path | None = None, work: Path | None = None,
            term_file: Path | None = None, as_of: datetime | None = None) -> list[str]:
    """Build the solution notebooks, then the student release with ``nbgrader generate_assignment``.

    Without a term (:func:`autograder.term.schedule.configured`) every lesson goes to ``lessons/``: the self-study
    edition,
    earlier lessons' answers shown as given code. With one, the release made at ``as_of`` (default now) holds the
    lessons released by then (or ``lessons``), goes to ``.grading/lessons`` (or ``out``), shows a stand-in for
    every earlier answer still open (:mod:`autograder.term.integrity`), and is refused (:class:`ReleaseRefused`, naming
    each cell) if any cell still holds a line of one.

    nbgrader writes into a staging folder beside ``out``; only when every lesson succeeded and passed that check
    does each staged lesson replace its folder in ``out`` (a rename, on the same file system). A failure leaves
    ``out`` as it was. A release during a term then records, beside ``out``, the first moment each lesson's answers
    went out (:func:`autograder.term.integrity.record_handed_out`): an extension granted after it comes too late.
    """
    notebooks.build_all()
    term = term_module.configured(term_file)
    at = term_module.as_utc(as_of) if as_of else term_module.now()
    if term is not None and not lessons:
        lessons = term.released_by(at)
        if not lessons:
            raise ReleaseRefused(f"no lesson of the term {term.path} is released by "
                                 f"{term_module.shown_time(at, term.zone)}: "
                                 "name the lessons (--lessons) to release one early")
    lessons = lessons or notebooks.lessons()
    out = Path(out or (TERM_RELEASE if term is not None else LESSONS_DIR))
    if term is not None:
        integrity.handed_out(integrity.ledger_of(out))  # a record that cannot be read stops here, before anything
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="release-") as tmp, \
            tempfile.TemporaryDirectory(prefix=".release-", dir=out.parent) as staging:
        work = work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        grader = api(work, release_dir=Path(staging), term_file=term.path if term else "", as_of=at)
        for lesson in lessons:
            # nbgrader's own class, as its API runs it: this function stages and checks the release itself, whatever
            # class the API was given in this process (tools_config gives it StagedGenerateAssignment)
            with temp_attrs(grader.coursedir, assignment_id=lesson):
                generate = GenerateAssignment(coursedir=grader.coursedir, parent=grader)
                generate.force, generate.create_assignment = True, True
                result = capture_log(generate)
            if not result["success"]:
                raise RuntimeError(f"generate_assignment failed for {lesson} ({out} is unchanged):\n"
                                   f"{result['log']}{result.get('error', '')}")
        for lesson in lessons:
            if not (Path(staging) / lesson).is_dir():
                raise RuntimeError(f"generate_assignment wrote no {lesson} ({out} is unchanged)")
        problems = integrity.check_release(Path(staging), lessons, term, at)
        if problems:
            raise ReleaseRefused(f"this release would hand out graded answers of lessons still open ({out} is "
                                 "unchanged):\n" + "\n".join(problems))
        for lesson in lessons:
            target, old = out / lesson, Path(staging) / f"{lesson}.old"
            if target.exists():
                target.rename(old)
            (Path(staging) / lesson).rename(target)
    integrity.record_handed_out(integrity.ledger_of(out), term, lessons, at)
    return lessons


# -- grading -----------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    student: str
    lesson: str
    score: float  # the final score: the raw score less the late penalty
    max_score: float
    ok: bool = True
    message: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what happened while grading it (timeouts, kills, repairs)
    raw_score: float | None = None  # what the notebook earned (None: the score, no penalty)
    late_penalty: float = 0.0
    submitted: datetime | None = None  # when it was submitted (UTC; the rule: autograder.term.schedule)
    due: datetime | None = None  # the student's due date, extension included (None: no term, or not in it)
    feedback_held: str = ""  # why no feedback page was written yet (autograder.term.integrity.HoldWhileOpen)

    def __post_init__(self):
        if self.raw_score is None:
            self.raw_score = self.score + self.late_penalty

    @property
    def late(self) -> bool:
        return self.late_penalty > 0


def _score(db_url: str, lesson: str, student: str) -> dict:
    """What the gradebook says of one submission: the final score, the raw score and penalty (nbgrader's
    ``SubmittedNotebook.score`` is raw, ``late_submission_penalty`` is taken from it), when, and its due date."""
    with Gradebook(db_url, COURSE_ID) as gb:
        submission = gb.find_submission(lesson, student)
        raw, penalty = float(submission.score), float(submission.late_submission_penalty or 0.0)
        return {"score": raw - penalty, "max_score": float(submission.max_score), "raw_score": raw,
                "late_penalty": penalty,
                "submitted": submission.timestamp and term_module.as_utc(submission.timestamp),
                "due": submission.duedate and term_module.as_utc(submission.duedate)}


def grade_one(grader: NbGraderAPI, work: Path, db_url: str | None, student: str, lesson: str,
              notebook: Path, exchange_files: bool = True) -> Outcome:
    """Check one notebook (:func:`autograder.intake.submissions.place`; ``exchange_files``: it is in nbgrader's layout,
    so the
    exchange's files beside it are taken), autograde it and write its feedback; a failure is reported, never
    raised. Every text that came from the kernel is escaped (:func:`decoder_course.text.shown`)."""
    started = time.perf_counter()
    nbgrader_plugins.NOTES.pop((lesson, student), None)
    outcome = _grade_one(grader, work, db_url, student, lesson, notebook, exchange_files)
    outcome.notes = nbgrader_plugins.NOTES.pop((lesson, student), [])  # escaped by nbgrader_plugins.note
    outcome.message = shown(outcome.message)
    outcome.seconds = time.perf_counter() - started
    return outcome


def _grade_one(grader: NbGraderAPI, work: Path, db_url: str | None, student: str, lesson: str,
               notebook: Path, exchange_files: bool) -> Outcome:
    try:
        max_bytes = grader.config.TrustedExecute.limits.get("notebook_bytes") or Limits().notebook_bytes
        intake.place(work / "submitted", student, lesson, notebook, max_bytes, exchange_files)
        nbgrader_plugins.TrustedExecute.prestart(grader.config, student)  # its zygote imports meanwhile
        result = grader.autograde(lesson, student, force=True, create=True)
        if not result["success"]:
            return Outcome(student, lesson, 0.0, 0.0, ok=False, message=_last_error(result["log"]))
        held = _feedback_held(grader, work, student, lesson)
        if not held:
            grader.generate_feedback(lesson, student, force=True)
        return Outcome(student, lesson, **_score(grader.coursedir.db_url, lesson, student), feedback_held=held)
    except BadSubmission as exc:
        log.warning("%s %s: not graded: %s", student, lesson, shown(exc))
        return Outcome(student, lesson, 0.0, 0.0, ok=False, message=str(exc))
    except MissingEntry as exc:
        return Outcome(student, lesson, 0.0, 0.0, ok=False, message=f"gradebook entry missing: {exc}")
    except Exception as exc:  # one notebook's trouble is reported and the run goes on
        return Outcome(student, lesson, 0.0, 0.0, ok=False, message=f"{type(exc).__name__}: {exc}")


def _feedback_held(grader: NbGraderAPI, work: Path, student: str, lesson: str) -> str:
    """Why ``student``'s feedback for ``lesson`` must wait (:func:`autograder.term.integrity.feedback_held_until`),
    with any page an earlier run wrote removed; "" when it may be written now."""
    term = term_module.from_config(grader)
    until = integrity.feedback_held_until(term, lesson, term_module.now())
    if until is None:
        return ""
    shutil.rmtree(work / "feedback" / student / lesson, ignore_errors=True)
    return f"feedback held until {term_module.shown_time(until, term.zone)}, when every lesson it builds on has closed"


def _last_error(text: str) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    errors = [line for line in lines if "ERROR" in line or "Error" in line]
    return (errors or lines or ["unknown error"])[-1][:500]


# -- the canary --------------------------------------------------------------------------------------------------
def canary_work(work: Path) -> Path:
    """The canary's own nbgrader tree and SQLite gradebook: it is graded like a student, but never one of the
    class (not in the class gradebook, so not in ``nbgrader export``, formgrader's averages or grades.csv), and
    without a term (no due date can cost the reference solutions a point)."""
    return work / "canary"


def canary_api(work: Path, verbose: bool = False, sandbox: bool = True, limits: Limits | None = None) -> NbGraderAPI:
    return api(canary_work(work), None, verbose=verbose, sandbox=sandbox, limits=limits, secret_file=work / "secret",
               term_file="")


def run_canary(grader: NbGraderAPI, work: Path, lesson: str) -> Outcome:
    """Grade the solution notebook as a student (in the canary's tree): anything short of full marks stops."""
    outcome = grade_one(grader, canary_work(work), None, CANARY, lesson, notebooks.solution_path(lesson))
    if not outcome.ok or outcome.score != outcome.max_score or outcome.max_score == 0:
        slow = [note for note in outcome.notes if nbgrader_plugins.TIMED_OUT in note or " deadline" in note]
        advice = ("Fix the checks before grading students." if not slow else
                  f"It ran out of time, not into a wrong answer: {slow[0]}. The limits already stretch with how "
                  f"busy this machine is (up to ×{MAX_SLOWDOWN:g}): grade when it is less busy, or give "
                  "more time (pipeline.Limits: cell_timeout, deadline).")
        raise SystemExit(
            f"canary failed for {lesson}: the reference solutions scored {outcome.score}/{outcome.max_score}"
            f"{' (' + outcome.message + ')' if outcome.message else ''}. {advice}"
        )
    (canary_work(work) / f"{lesson}.passed").write_text(f"{outcome.score:g}/{outcome.max_score:g}\n")
    return outcome


def canary_passed(work: Path, lesson: str) -> bool:
    return (canary_work(work) / f"{lesson}.passed").exists()


def term_file_of(term_file: Path | str | None) -> str:
    """The term file a grading run uses, read and checked before anything is graded (a :class:`~autograder.term.schedule
    .TermError` says what is wrong): ``term_file``, else the default (:func:`autograder.term.schedule.path`), as an
    absolute path; ``""`` when there is none (or ``term_file`` is ``""``)."""
    where = term_module.path(term_file)
    if where is None:
        return ""
    term_module.load(where)
    return str(Path(where).resolve())


def prepare(work: Path, lessons: list[str], db_url: str | None = None, verbose: bool = False, sandbox: bool = True,
            limits: Limits | None = None, term_file: Path | str | None = None) -> tuple[NbGraderAPI, list[Outcome]]:
    """What happens once before any student: the assignments in both gradebooks (with the term's due dates in the
    class's), then each lesson's canary.

    Raises ``SystemExit`` when a canary fails, :class:`SandboxUnavailable` without a sandbox (unless
    ``sandbox=False``), :class:`~autograder.term.schedule.TermError` for a term file that cannot be used."""
    term_file = term_file_of(term_file)
    term = term_module.load(term_file) if term_file else None
    quiet_nbgrader(verbose)
    if sandbox:
        check_available()
    else:
        log.warning("grading WITHOUT a sandbox (--no-sandbox): student code can read the solutions and the "
                    "gradebook, and harm this machine")
    access.private_folder(work)  # the gradebook, the secret, every student's feedback: the instructor's alone
    notebooks.build_all()
    grader = api(work, db_url, verbose=verbose, sandbox=sandbox, limits=limits, term_file=term_file)
    canary = canary_api(work, verbose=verbose, sandbox=sandbox, limits=limits)
    for lesson in lessons:
        for each in (grader, canary):
            result = each.generate_assignment(lesson, force=True, create=True)
            if not result["success"]:
                raise SystemExit(f"generate_assignment failed for {lesson}:\n{shown(result['log'], True)}")
    with Gradebook(grader.coursedir.db_url, COURSE_ID) as gb:
        for lesson in lessons:
            sync_gradebook(gb, term, lesson)
    gradebook = access.sqlite_file(db_url, work)
    if gradebook is not None:
        access.private_file(gradebook)
    return grader, [run_canary(canary, work, lesson) for lesson in lessons]


def check_prepared(work: Path, lessons) -> None:
    """Raise ``RuntimeError`` unless :func:`prepare` made the secret and passed each lesson's canary in ``work``."""
    if not (work / "secret").exists():
        raise RuntimeError(f"no grading secret in {work}: grade the canaries first "
                           "(autograder.grading.pipeline.prepare)")
    for lesson in sorted(lessons):
        if not canary_passed(work, lesson):
            raise RuntimeError(f"lesson {lesson} has no passed canary in {canary_work(work)}: run "
                               "autograder.grading.pipeline.prepare first")


def summary(outcomes) -> str:
    """'graded N, needs attention N, failed N' over students' notebooks (canaries are not counted).

    Each notebook counts once: *graded* got a score with nothing to report; *needs attention* got a score but
    something happened (a cell timed out, the kernel died, grading metadata was repaired: see its notes);
    *failed* got no score (an unreadable file, an nbgrader error; grades.csv marks it "needs attention").
    """
    graded = attention = failed = 0
    for o in outcomes:
        if o.student == CANARY:
            continue
        if not o.ok:
            failed += 1
        elif o.notes:
            attention += 1
        else:
            graded += 1
    return f"graded {graded}, needs attention {attention}, failed {failed}"


# -- reports -----------------------------------------------------------------------------------------------------
def _csv_time(moment: datetime | None) -> str:
    """grades.csv's times: ISO 8601, UTC; empty for none."""
    return "" if moment is None else term_module.as_utc(moment).strftime("%Y-%m-%dT%H:%M:%SZ")


SHEET_COLUMNS = ["student", "lesson", "raw_score", "late_penalty", "score", "max_score", "submitted", "due", "status",
                 "message"]
SHEET_BYTES = 64 << 20  # the term's sheet read back: ~100 bytes a row, so far more than any class's


def _sheet_row(o: Outcome) -> list:
    """grades.csv's row of one notebook, every text through :func:`~decoder_course.text.csv_cell`."""
    return [csv_cell(o.student), csv_cell(o.lesson), o.raw_score, o.late_penalty, o.score, o.max_score,
            _csv_time(o.submitted), _csv_time(o.due), "ok" if o.ok else "needs attention",
            csv_cell("; ".join(filter(None, [o.message, *o.notes, o.feedback_held])))]


def write_csv(path: Path, outcomes: list[Outcome]) -> None:
    """One row per student's notebook (never the canary): the raw score, the late penalty, the final score
    (``score``), when it was submitted and was due (UTC, empty without a term); every text escaped, never read as
    a formula. Only these outcomes: the term's sheet, which keeps earlier runs' rows, is :func:`write_term_sheet`."""
    with open(path, "w", newline="") as handle:
        writer = csv_writer(handle)
        writer.writerow(SHEET_COLUMNS)
        writer.writerows(_sheet_row(o) for o in outcomes if o.student != CANARY)


def read_sheet(path: Path) -> list[list[str]]:
    """The rows of an earlier grades.csv (without its header), as the course wrote them; [] when there is none.

    Read within :data:`SHEET_BYTES`. A sheet that is not one the course wrote (another header, too big, not
    UTF-8 CSV) raises ``ValueError`` saying so."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(SHEET_BYTES + 1)
    except FileNotFoundError:
        return []
    if len(raw) > SHEET_BYTES:
        raise ValueError(f"over {SHEET_BYTES >> 20} MB")
    try:
        rows = list(csv.reader(raw.decode("utf-8").splitlines()))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"not a CSV file of the course ({exc})") from None
    if not rows:
        return []
    if rows[0] != SHEET_COLUMNS:
        raise ValueError(f"its header is not grades.csv's ({', '.join(SHEET_COLUMNS)})")
    return [row for row in rows[1:] if len(row) == len(SHEET_COLUMNS)]


def write_term_sheet(path: Path, outcomes: list[Outcome]) -> None:
    """grades.csv as the term's sheet: this run's rows replace the earlier rows of the same (student, lesson), and
    every other row stays, so that grading one lesson a week never drops another's. Sorted by student, then by
    the course's lesson order; written to a temporary file and renamed over the old sheet (a crash leaves one or
    the other, whole). An earlier sheet that cannot be read (:func:`read_sheet`) is kept beside it as
    ``grades.csv.unreadable`` with a warning, and the new sheet holds this run's rows."""
    try:
        earlier = read_sheet(path)
    except ValueError as exc:
        aside = path.with_name(path.name + ".unreadable")
        os.replace(path, aside)
        log.warning("the earlier %s cannot be read (%s): kept as %s; this sheet holds this run's rows only", path,
                    exc, aside)
        earlier = []
    rows = {(row[0], row[1]): row for row in earlier}
    rows.update({(str(row[0]), str(row[1])): row for row in map(_sheet_row, outcomes) if row[0] != CANARY})
    order = {lesson: index for index, lesson in enumerate(notebooks.lessons())}
    keys = sorted(rows, key=lambda key: (key[0], order.get(key[1], len(order)), key[1]))
    with tempfile.NamedTemporaryFile("w", newline="", dir=path.parent, prefix=".grades-", suffix=".csv",
                                     delete=False) as handle:
        try:
            writer = csv_writer(handle)
            writer.writerow(SHEET_COLUMNS)
            writer.writerows(rows[key] for key in keys)
        except BaseException:
            os.unlink(handle.name)
            raise
    os.replace(handle.name, path)


def write_roster(path: Path, roster: dict[str, dict[str, str]]) -> None:
    """Who each LMS student id is (:attr:`autograder.intake.submissions.Collected.roster`), beside grades.csv, so that
    grades
    go back to the LMS by its own id; written on every run (only its header for nbgrader's layout), so that it
    never describes another run's students. Every text escaped, never read as a formula."""
    with open(path, "w", newline="") as handle:
        writer = csv_writer(handle)
        writer.writerow(["student", "lms_id", "name", "email", "note"])
        for student, entry in sorted(roster.items()):
            writer.writerow([csv_cell(student), *(csv_cell(entry.get(key, "")) for key in
                                                  ("lms_id", "name", "email", "note"))])


def score_table(outcomes: list[Outcome]) -> str:
    """A markdown table: one row per student, one column per lesson; a late notebook's final score is marked with
    its penalty."""
    lessons = sorted({o.lesson for o in outcomes})
    students = sorted({o.student for o in outcomes}, key=lambda s: (s != CANARY, s))
    cell = {(o.student, o.lesson): o for o in outcomes}
    lines = ["| student | " + " | ".join(lessons) + " |", "|---|" + "---|" * len(lessons)]
    for student in students:
        row = []
        for lesson in lessons:
            o = cell.get((student, lesson))
            row.append("" if o is None else "needs attention" if not o.ok else
                       f"{o.score:g}/{o.max_score:g}" + (f" (late, −{o.late_penalty:g})" if o.late else ""))
        lines.append(f"| {shown(student)} | " + " | ".join(row) + " |")
    return "\n".join(lines)
