"""Grade many notebooks at once: a pool of worker processes, each with its own nbgrader, one shared gradebook.

``grade_many(jobs, work, db_url, workers)`` grades ``(student, lesson, notebook_path)`` jobs with the same
:func:`autograder.pipeline.grade_one` that sequential grading uses, so the scores are the same; only the order in
which notebooks finish changes. What makes that safe:

- **processes, not threads**: ``TrustedExecute`` sets the harvest variable in ``os.environ`` and keeps per-notebook
  state (:data:`autograder.nbgrader_plugins.NOTES`) in module globals; each worker is a fresh interpreter
  (``spawn``) that builds its own :func:`~autograder.pipeline.api` once and grades one notebook at a time;
- **everything shared is written before the pool starts**: the assignments (``generate_assignment``), the grading
  secret and the canaries (:func:`prepare` does both; :func:`grade_many` refuses to start without them) and
  every student's gradebook row (nbgrader's ``update_or_create_student`` looks, then inserts: two workers starting
  the same new student's lessons at once collide on the primary key; measured: 6 of 20 such pairs failed);
- **one writer at a time in SQLite**: SQLite lets one connection write while the others wait; the default wait
  is 5 s, so the gradebook URL gets ``?timeout=60`` (SQLAlchemy hands it to ``sqlite3.connect`` and nbgrader
  passes the URL through untouched; ``tests/test_scale.py`` proves both). PostgreSQL needs nothing.

A tqdm bar shows progress; :func:`summary` says how many notebooks were graded, failed or need attention.

SQLite or PostgreSQL? SQLite is right for one grading machine, workers included: a notebook's gradebook writes
take milliseconds next to its seconds of execution. Switch to PostgreSQL (``--db-url postgresql://…``; the
driver, psycopg 3, is in the grader extra) when several machines or graders write one gradebook at once (SQLite's
file locks are not reliable on network file systems), or when nbgrader's formgrader runs on a JupyterHub for
several teaching assistants while grading goes on. ``.ci/postgres.sh start DIR`` starts a local server to try it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from sqlalchemy.engine import make_url
from tqdm.auto import tqdm

from autograder import pipeline
from autograder.pipeline import CANARY, Limits, Outcome
from autograder.sandbox import check_available

__all__ = ["SQLITE_TIMEOUT", "Job", "default_workers", "gradebook_url", "grade_many", "prepare", "summary"]

Job = tuple[str, str, Path]  # (student, lesson, notebook path)
SQLITE_TIMEOUT = 60  # s a SQLite writer waits for another's lock; one notebook's writes take well under 1 s
log = logging.getLogger("autograder")


def default_workers() -> int:
    """One worker per core this process may use (a worker keeps about one core busy: its kernel)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def gradebook_url(work: Path, db_url: str | None = None) -> str:
    """The gradebook URL for concurrent writers: SQLite gets a busy timeout unless the URL sets one."""
    url = make_url(db_url or f"sqlite:///{work / 'gradebook.db'}")
    if url.get_backend_name() == "sqlite" and "timeout" not in url.query:
        url = url.update_query_dict({"timeout": str(SQLITE_TIMEOUT)})
    return url.render_as_string(hide_password=False)


def prepare(work: Path, lessons: Sequence[str], db_url: str | None = None, verbose: bool = False,
            sandbox: bool = True, limits: Limits | None = None) -> list[Outcome]:
    """What must happen once before the pool: the assignments in the gradebook, then each lesson's canary.

    The same steps as the start of :func:`autograder.pipeline.grade`; raises ``SystemExit`` when a canary fails.
    """
    pipeline.quiet_nbgrader(verbose)
    if sandbox:
        check_available()  # as pipeline.grade: no sandbox, no grading, unless sandbox=False says so
    work.mkdir(parents=True, exist_ok=True)
    grader = pipeline.api(work, db_url, verbose=verbose, sandbox=sandbox, limits=limits)
    for lesson in lessons:
        result = grader.generate_assignment(lesson, force=True, create=True)
        if not result["success"]:
            raise SystemExit(f"generate_assignment failed for {lesson}:\n{result['log']}")
    return [pipeline.run_canary(grader, work, db_url, lesson) for lesson in lessons]


def _check_ready(work: Path, db_url: str, jobs: Sequence[Job]) -> None:
    """Refuse to start unless the shared state exists; then create every student's row, once, here."""
    if not (work / "secret").exists():
        raise RuntimeError(f"no grading secret in {work}: grade the canaries first (autograder.parallel.prepare)")
    with Gradebook(db_url, pipeline.COURSE_ID) as gb:
        for lesson in sorted({lesson for _, lesson, _ in jobs}):
            try:
                gb.find_submission(lesson, CANARY)
            except MissingEntry:
                raise RuntimeError(f"lesson {lesson} has no canary in the gradebook: run generate_assignment and "
                                   "the canary first (autograder.parallel.prepare)") from None
        for student in sorted({student for student, _, _ in jobs}):
            gb.update_or_create_student(student)


# -- the worker process ------------------------------------------------------------------------------------------
_GRADER = None  # this worker's NbGraderAPI, built once by _init_worker
_SETTINGS: dict = {}


def _init_worker(work: str, db_url: str, verbose: bool, sandbox: bool, limits: dict, threads: int) -> None:
    global _GRADER
    # workers share the cores: each kernel (it inherits this) and this process's own checks get their share
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    pipeline.quiet_nbgrader(verbose)
    _SETTINGS.update(work=Path(work), db_url=db_url)
    _GRADER = pipeline.api(Path(work), db_url, verbose=verbose, sandbox=sandbox, limits=Limits(**limits))


def _grade_job(job: Job) -> Outcome:
    student, lesson, notebook = job
    return pipeline.grade_one(_GRADER, _SETTINGS["work"], _SETTINGS["db_url"], student, lesson, Path(notebook))


# -- the pool ----------------------------------------------------------------------------------------------------
def grade_many(jobs: Sequence[Job], work: Path, db_url: str | None = None, workers: int | None = None,
               progress: bool = True, *, verbose: bool = False, sandbox: bool = True,
               limits: Limits | None = None) -> list[Outcome]:
    """Grade ``jobs`` in ``workers`` processes (default: one per core); outcomes in the order of ``jobs``.

    The assignments and canaries must be in the gradebook already (:func:`prepare`, or the start of
    :func:`autograder.pipeline.grade`). A job that raises is reported as an outcome that is not ok; a worker
    process that dies takes its unfinished jobs to a fresh pool once, and a job caught in two such crashes is
    reported as failed. Scores are those of sequential grading: each job runs the same ``grade_one``.
    """
    jobs = [(student, lesson, Path(notebook)) for student, lesson, notebook in jobs]
    workers = max(1, min(workers or default_workers(), len(jobs) or 1))
    db_url = gradebook_url(work, db_url)
    if not jobs:
        return []
    _check_ready(work, db_url, jobs)
    limits = limits or Limits()
    threads = max(1, default_workers() // workers)
    init_args = (str(work), db_url, verbose, sandbox, asdict(limits), threads)
    results: dict[int, Outcome] = {}
    crashes = dict.fromkeys(range(len(jobs)), 0)
    pending = list(range(len(jobs)))
    bar = tqdm(total=len(jobs), desc=f"grading ({workers} workers)", unit="notebook", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)
    try:
        while pending:
            broken = []
            # spawn, not fork: a fresh interpreter per worker, no copied locks, torch threads or open gradebooks
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                     initargs=init_args) as pool:
                futures = {pool.submit(_grade_job, jobs[i]): i for i in pending}
                for future in as_completed(futures):
                    i = futures[future]
                    student, lesson, _ = jobs[i]
                    try:
                        results[i] = future.result()
                    except BrokenProcessPool:
                        broken.append(i)
                        continue
                    except Exception as exc:  # grade_one reports its own failures; this is the machinery's
                        results[i] = Outcome(student, lesson, 0.0, 0.0, ok=False,
                                             message=f"grading failed: {type(exc).__name__}: {exc}")
                    _advance(bar, results.values())
            pending = []
            for i in sorted(broken):
                crashes[i] += 1
                if crashes[i] < 2:
                    pending.append(i)
                    continue
                student, lesson, _ = jobs[i]
                results[i] = Outcome(student, lesson, 0.0, 0.0, ok=False,
                                     message="grading failed: a grading worker process died twice while this "
                                             "notebook was queued or running; grade it again on its own")
                _advance(bar, results.values())
            if pending:
                log.warning("a grading worker died; %d unfinished notebooks go to a fresh pool", len(pending))
    finally:
        bar.close()
    return [results[i] for i in range(len(jobs))]


def _advance(bar, outcomes) -> None:
    bar.set_postfix_str(summary(outcomes), refresh=False)
    bar.update(1)


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
