"""Grade a class: the canaries, then every student's notebooks here, in a pool of processes or on a Dask cluster,
then the term's sheet, the roster and the class report: ``./course grade`` (:func:`grade`).

It sits above both ways of grading many notebooks: :mod:`autograder.grading.pipeline` (one notebook through
nbgrader, and the canaries) and :mod:`autograder.grading.cluster` (the same on Dask workers), which imports the
pipeline; so the choice between them is made here, and neither imports the other's caller.
"""

from __future__ import annotations

import json
import logging
import multiprocessing.util
import os
import sys
import tempfile
from dataclasses import asdict, replace
from datetime import UTC
from pathlib import Path

from nbgrader.api import Gradebook

from autograder.course import notebooks
from autograder.grading import cluster as distributed
from autograder.grading import pool as parallel
from autograder.grading.pipeline import (
    CANARY,
    COURSE_ID,
    Outcome,
    api,
    check_prepared,
    grade_one,
    handed_out_ledger,
    prepare,
    quiet_nbgrader,
    summary,
    term_file_of,
    write_roster,
    write_term_sheet,
)
from autograder.intake import submissions as intake
from autograder.pages import report
from autograder.sandbox import cgroups
from autograder.sandbox.launch import Limits, check_available
from autograder.sandbox.warm import retire_all, retire_warm
from autograder.term import integrity
from autograder.term import schedule as term_module
from decoder_course.text import shown

log = logging.getLogger("autograder")

class NothingToGrade(ValueError):
    """A submissions folder with no notebook of the lessons being graded; the message says what was expected."""


def name_students(db_url: str, roster: dict[str, dict[str, str]]) -> None:
    """Give the gradebook the names (and emails) an LMS export's roster has, so that formgrader and ``nbgrader
    export`` show them: "Ada Lovelace" is first name "Ada", last name "Lovelace". A student without one keeps
    what the gradebook has (formgrader then shows the id: :mod:`autograder.pages.gradebook_views`)."""
    named = {student: entry for student, entry in roster.items() if entry.get("name") or entry.get("email")}
    if not named:
        return
    with Gradebook(db_url, COURSE_ID) as gb:
        for student, entry in sorted(named.items()):
            first, _, last = entry.get("name", "").strip().rpartition(" ")
            gb.update_or_create_student(student, first_name=first or None, last_name=last or None,
                                        email=entry.get("email") or None)


def default_lessons(term: term_module.Term | None) -> list[str]:
    """The lessons a run grades when none are named: the term's (in the course's order), else all of them."""
    return [lesson for lesson in notebooks.lessons() if term is None or term.scheduled(lesson)]


def nothing_to_grade(submissions: Path, lessons: list[str], collected: intake.Collected) -> str:
    """Why a run found nothing to grade, with the layout it expected and what it found instead."""
    found = [collected.skipped_lessons(), *collected.problems[:5]]
    more = len(collected.problems) - 5
    return (f"no notebook to grade in {shown(str(submissions))} for {', '.join(lessons)}: expected "
            "student/lesson/notebook.ipynb (nbgrader's layout, what nbgrader collect writes), flat "
            "student_anything_<lesson>.ipynb files, or an LMS export (--layout)"
            + "".join(f"\n  {line}" for line in found if line) + (f"\n  … and {more} more" if more > 0 else ""))


def grade(submissions: Path, work: Path, lessons: list[str] | None = None, db_url: str | None = None,
          verbose: bool = False, sandbox: bool = True, limits: Limits | None = None, workers: int = 1,
          progress: bool = False, scheduler: str | None = None, layout: str | None = None,
          term_file: Path | str | None = None) -> list[Outcome]:
    """Canary first, then every student (``workers`` at a time, or one Dask task each on the cluster at
    ``scheduler``: :mod:`autograder.grading.cluster`), feedback, CSV: the one way into grading.

    Each kernel runs in a sandbox under ``limits``; without bubblewrap this raises :class:`SandboxUnavailable`
    unless ``sandbox=False`` (unsafe: student code then runs with the grader's rights). ``layout`` is the
    submissions' layout (:data:`autograder.intake.submissions.LAYOUTS`), found from the files when None; the roster an
    LMS
    export gave goes to ``roster.csv`` beside ``grades.csv``. ``term_file`` is the term (None: the default one
    when there, ``""``: none); it is read first, and a term that cannot be used stops the run before any grading
    (:class:`~autograder.term.schedule.TermError`).
    """
    limits = limits or Limits()
    term_file = term_file_of(term_file)
    term = term_module.load(term_file) if term_file else None
    lessons = lessons or default_lessons(term)
    ledger = handed_out_ledger(work)
    if term is not None:
        integrity.handed_out(ledger)  # a record that cannot be read stops the run here, before any grading
    if scheduler:
        distributed.check_scheduler(scheduler)  # before the canaries: an unreachable cluster fails at once
    if sandbox:
        check_available()  # no sandbox: said first, whatever the submissions (prepare checks again, cached)
    with tempfile.TemporaryDirectory(prefix="collect-") as tmp:
        collected = intake.collect_submissions(submissions, lessons, Path(tmp), limits.notebook_bytes,
                                               layout=layout, zone=term.zone if term else UTC)
        log.info("submissions in the %s layout, %d students", collected.layout, len(collected.found))
        for problem in collected.problems:
            log.warning("skipped: %s", problem)
        if collected.skipped_lessons() and progress:
            print(collected.skipped_lessons())
        jobs = [(student, lesson, collected.found[student][lesson])
                for student in sorted(collected.found) for lesson in lessons if lesson in collected.found[student]]
        if not jobs and not collected.refused:  # before the canaries: nothing would come of them
            raise NothingToGrade(nothing_to_grade(submissions, lessons, collected))
        grader, outcomes = prepare(work, lessons, db_url, verbose, sandbox, limits, term_file)
        name_students(grader.coursedir.db_url, collected.roster)
        if scheduler:
            outcomes += distributed.grade_on_cluster(jobs, work, db_url, scheduler, progress, verbose=verbose,
                                                     sandbox=sandbox, limits=limits, term_file=term_file,
                                                     exchange=collected.exchange)
        elif workers > 1:
            outcomes += grade_many(jobs, work, db_url, workers, progress, verbose=verbose, sandbox=sandbox,
                                   limits=limits, term_file=term_file, exchange=collected.exchange)
        else:
            try:
                for student, lesson, notebook in jobs:
                    outcome = grade_one(grader, work, db_url, student, lesson, notebook,
                                        (student, lesson) in collected.exchange)
                    log.info("%s %s: %s/%s", student, lesson, outcome.score, outcome.max_score)
                    outcomes.append(outcome)
            finally:
                retire_warm()  # the last student's sandbox: nothing of a grading run outlives it
    for student, refused in sorted(collected.refused.items()):
        for lesson, why in sorted(refused.items()):
            outcomes.append(Outcome(student, lesson, 0.0, 0.0, ok=False, message=shown(why)))
    if term is not None:  # work that earned points after its answers went out (a late extension): look at it
        out = integrity.handed_out_in(term, ledger)
        for o in outcomes:
            after = integrity.submitted_after_answers(out, o.lesson, o.submitted) if o.ok and o.score else ""
            o.notes += [after] if after else []
    write_term_sheet(work / "grades.csv", outcomes)
    # a feedback page shows the course's code of its given cells: answers of the lessons closed by now
    fed = [o.lesson for o in outcomes if o.student != CANARY and (work / "feedback" / o.student / o.lesson).is_dir()]
    integrity.record_handed_out(ledger, term, sorted(set(fed)), term_module.now(), "the feedback of")
    write_roster(work / "roster.csv", collected.roster)
    (work / "problems.json").write_text(json.dumps([shown(p) for p in collected.problems], indent=2))
    report.after_grading(work, db_url)  # the instructor's class report (autograder/pages/report.py): work/report/
    return outcomes


# -- many notebooks at once --------------------------------------------------------------------------------------
_GRADER = None  # a pool worker's NbGraderAPI, built once by _init_worker
_SETTINGS: dict = {}


def _init_worker(work: str, db_url: str, verbose: bool, sandbox: bool, limits: dict, threads: int, term_file: str,
                 exchange: set | None) -> None:
    global _GRADER
    # workers share the cores: each kernel (it inherits this) and this process's own checks get their share
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    quiet_nbgrader(verbose)
    _SETTINGS.update(work=Path(work), db_url=db_url, exchange=exchange)
    _GRADER = api(Path(work), db_url, verbose=verbose, sandbox=sandbox, limits=Limits(**limits), term_file=term_file)
    # a pool worker leaves by os._exit (no atexit): its last student's warm sandbox is retired here
    multiprocessing.util.Finalize(None, retire_all, exitpriority=10)


def _grade_job(job: parallel.Job) -> Outcome:
    student, lesson, notebook = job
    exchange = _SETTINGS["exchange"]
    return grade_one(_GRADER, _SETTINGS["work"], _SETTINGS["db_url"], student, lesson, Path(notebook),
                     exchange is None or (student, lesson) in exchange)


def _student(job: parallel.Job) -> str:
    return job[0]


def _failed(job: parallel.Job, why: str) -> Outcome:
    return Outcome(job[0], job[1], 0.0, 0.0, ok=False, message=why)


def worker_limits(limits: Limits, workers: int, cores: int | None = None) -> Limits:
    """``limits`` for one of ``workers`` grading processes: unless the CPU share is set, each sandbox gets that
    worker's part of the cores (:func:`autograder.sandbox.cgroups.cpu_share`), so that no worker's sandbox slows
    another's."""
    return limits if limits.cpus else replace(limits, cpus=cgroups.cpu_share(cores, workers))


def grade_many(jobs, work: Path, db_url: str | None = None, workers: int | None = None, progress: bool = True, *,
               verbose: bool = False, sandbox: bool = True, limits: Limits | None = None,
               term_file: Path | str | None = None, exchange: set[tuple[str, str]] | None = None) -> list[Outcome]:
    """Grade ``(student, lesson, notebook)`` jobs in ``workers`` processes (:func:`autograder.grading.pool.run_pool`);
    outcomes in the order of ``jobs``, scores those of sequential grading (each job runs :func:`grade_one`).
    ``term_file`` as :func:`grade`'s; ``exchange``: the (student, lesson) whose notebooks are in nbgrader's layout
    (:attr:`autograder.intake.submissions.Collected.exchange`; None: all).

    The assignments and canaries must be there already (:func:`prepare`); every student's gradebook row is made
    here, once, before the pool starts (two workers creating the same new student collide on its key).
    """
    jobs = [(student, lesson, Path(notebook)) for student, lesson, notebook in jobs]
    if not jobs:
        return []
    db_url = parallel.gradebook_url(work, db_url)
    check_prepared(work, {lesson for _, lesson, _ in jobs})
    with Gradebook(db_url, COURSE_ID) as gb:
        for student in sorted({student for student, _, _ in jobs}):
            gb.update_or_create_student(student)
    workers = max(1, min(workers or parallel.default_workers(), len(jobs)))
    threads = max(1, parallel.default_workers() // workers)
    init_args = (str(work), db_url, verbose, sandbox, asdict(worker_limits(limits or Limits(), workers)), threads,
                 term_file_of(term_file), exchange)
    # a student's notebooks go to one worker as far as the work allows: one warm sandbox serves them all
    return parallel.run_pool(jobs, _grade_job, _failed, workers, _init_worker, init_args, progress=progress,
                             status=summary, group=_student)
