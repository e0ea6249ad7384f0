"""Grading on a Dask cluster: ``./course grade SUBMISSIONS --scheduler tcp://HOST:PORT``.

One Dask task per notebook (``distributed``, Dask's own scheduler and workers; nothing home-made). Each worker
machine has the course checkout, its ``.venv`` and bubblewrap (docs/INSTRUCTOR.md shows a cluster). The split:

- **the instructor's process** (:func:`grade_on_cluster`) checks and places every notebook into its own
  ``submitted/`` tree (:func:`autograder.intake.submissions.place`, as local grading does), sends it with the grading
  secret
  and the lesson to the cluster, and, as each result comes back, writes it: the autograded notebook and its
  feedback folder into ``autograded/`` and ``feedback/`` (``timestamp.txt`` and ``submission_secret.txt`` kept as
  local grading keeps them), and the scores into the class gradebook by nbgrader's own ``SaveAutoGrades`` and the
  term's late penalties (:class:`~autograder.term.late.TermLatePenalties`) run on the returned autograded notebook, the
  very notebook those steps scored on the worker. It is the gradebook's only writer, so SQLite is fine
  (PostgreSQL with ``--db-url`` works the same). The term file travels with each task (a worker's checkout may
  have another, or none), so the worker's feedback states the same due date and penalty;
- **a worker** (:func:`grade_remote`) grades the notebook with :func:`autograder.grading.pipeline.grade_one`, the
function
  sequential and pool grading run, in a scratch nbgrader tree of its own (a private temporary folder: its own
  SQLite gradebook, a copy of one holding the lesson's assignment, made once per worker process by
  ``generate_assignment`` from its checkout), and returns the files and the outcome as data. The sandbox shows
  the kernel nothing of that folder. The grading secret (it decides the hidden cases) comes with the task and
  stays in the worker's memory (:class:`HeldSecretExecute`): never on a worker's disk, where a killed worker
  would leave it. Over a network you do not trust, use Dask's TLS (``tls://`` addresses, docs/INSTRUCTOR.md).

A worker that dies mid-run loses nothing: Dask gives its unfinished tasks to the other workers (a task whose
worker died ``distributed.scheduler.allowed-failures`` times, default 3, comes back as ``KilledWorker`` and its
notebook is reported as not graded). Tasks are idempotent (a fresh scratch tree each run, nothing written on the
worker outside it), a task that raises is retried (``retries=TASK_RETRIES``), and the instructor writes each
(student, lesson) once, from the one result its future yields. Scores equal local grading's: same code, same
secret, same hidden cases (``tests/test_distributed.py`` kills a worker mid-run and compares).

A worker refuses a task when its checkout would grade differently: the *fingerprint* (:func:`fingerprint`) of
what decides a lesson's scores (the solution notebook, its reference, hidden and visible checks, the course and
library versions) must equal the instructor's. Before a worker is given a notebook (at the start, or when it
joins), it is checked: one that cannot grade (no grading code in its environment, another checkout, no sandbox)
is named in a warning with its fix, in one line, and the notebooks go to the workers that can; only a cluster
with none stops the run. A worker finds the grading code in the course's venv (``./course setup`` writes a path
file there naming the checkout), so Dask's plain ``dask worker ADDRESS``, started from any folder, grades.
Workers grade one notebook at a time per process (a lock: ``TrustedExecute`` keeps per-notebook state in module
globals); start them with ``--nthreads 1 --nworkers N`` (``./course worker ADDRESS`` gives one thread).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import uuid
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook
from nbgrader.apps import NbGraderAPI
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import SaveAutoGrades
from tqdm.auto import tqdm

from autograder.course import lessons as lessons_registry
from autograder.course import notebooks
from autograder.grading import pipeline
from autograder.grading import pool as parallel
from autograder.grading.pipeline import COURSE_ID, Limits, Outcome
from autograder.intake import submissions as intake
from autograder.intake.submissions import BadSubmission
from autograder.judge.preprocessors import TrustedExecute
from autograder.term.late import TermLatePenalties
from decoder_course.text import shown

__all__ = ["TASK_RETRIES", "ClusterUnavailable", "HeldSecretExecute", "check_scheduler", "fingerprint", "fix_for",
           "grade_on_cluster", "grade_remote", "record"]

TASK_RETRIES = 2  # a task that raises (not a lost worker: Dask reschedules those on its own) runs again
CONNECT_TIMEOUT = 30  # s to reach the scheduler
WORKER_TIMEOUT = 120  # s to wait for a first worker
VERSIONS = ("nbgrader", "nbclient", "nbconvert", "nbformat", "numpy", "torch", "einops", "SQLAlchemy")
log = logging.getLogger("autograder")


class ClusterUnavailable(RuntimeError):
    """The scheduler cannot be reached, has no workers, or its workers cannot grade; the message says which."""


# -- what must be the same on every machine ---------------------------------------------------------------------
def fingerprint(lessons) -> str:
    """A digest of what decides the scores of ``lessons`` on this machine: each lesson's solution notebook (its
    assignment), reference module, hidden checks and visible checks, the shared check code, the course version
    and the versions of the libraries grading runs. Not every file of the checkout: editing another lesson, or
    the pipeline's own code, does not change a grade."""
    root = notebooks.ROOT
    digest = hashlib.sha256()
    # the shared check code: every module of autograder/course/checks that is not one lesson's, and what decides with it
    shared = [p for p in sorted((root / "autograder" / "course" / "checks").glob("*.py"))
              if not p.name[:1] == "l"]
    paths = [*shared, root / "autograder" / "judge" / "verdicts.py", root / "autograder" / "judge" / "policy.py",
             root / "autograder" / "course" / "mutants" / "__init__.py",
             *sorted((root / "decoder_course").glob("*.py"))]
    for lesson in sorted(set(lessons)):
        paths.append(notebooks.solution_path(lesson))
        paths += [lessons_registry.path(lesson, kind) for kind in ("reference", "checks", "visible", "mutants")]
    for path in paths:
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() if path.exists() else b"(missing)")
        digest.update(b"\0")
    for name in VERSIONS:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "(not installed)"
        digest.update(f"{name}=={version}\0".encode())
    digest.update(f"python {sys.version_info[:2]}\0".encode())
    return digest.hexdigest()[:16]


# -- the worker's side ------------------------------------------------------------------------------------------
_LOCK = threading.Lock()  # one notebook at a time per worker process, whatever --nthreads says
_HOME: dict[str, Path] = {}  # this worker process's private folder: "root", and "template" (a nbgrader tree)
_MADE: set[str] = set()  # lessons whose assignment the template gradebook holds
_SECRET: dict[str, bytes] = {}  # the running task's grading secret


class HeldSecretExecute(TrustedExecute):
    """``TrustedExecute`` (configured as ``TrustedExecute``) with the grading secret the running task brought,
    held in this process's memory instead of read from a file."""

    def _secret(self) -> bytes:
        return _SECRET["secret"]


if not callable(getattr(TrustedExecute, "_secret", None)):  # HeldSecretExecute would hold nothing
    raise ImportError("autograder.judge.preprocessors.TrustedExecute no longer reads its secret with _secret()")


def _worker_api(scratch: Path, task: dict) -> NbGraderAPI:
    """:func:`autograder.grading.pipeline.api` for the scratch tree, with :class:`HeldSecretExecute` in place of
    ``TrustedExecute``; everything else is the course's configuration."""
    term_file = ""  # the instructor's term, or none: never this worker's own default
    if task.get("term") is not None:
        term_file = scratch / "term.toml"
        term_file.write_bytes(task["term"])
    config = pipeline.nbgrader_config(scratch, None, verbose=task["verbose"], sandbox=task["sandbox"],
                                      limits=Limits(**task["limits"]), term_file=term_file)
    config.Autograde.autograde_preprocessors = [HeldSecretExecute if step is TrustedExecute else step
                                                for step in config.Autograde.autograde_preprocessors]
    # never a file: were the secret read from one after all, this path cannot be made, and grading stops
    config.TrustedExecute.secret_file = str(scratch / "gradebook.db" / "no-secret-file-on-workers")
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


def _worker_home() -> Path:
    if "root" not in _HOME:
        base = None
        try:
            from distributed import get_worker

            base = get_worker().local_directory  # removed with the worker
        except (ImportError, ValueError):
            pass
        root = Path(tempfile.mkdtemp(prefix="course-grading-", dir=base))  # 0700
        _HOME["root"] = root
        _HOME["template"] = root / "template"
    return _HOME["root"]


def _template(lesson: str) -> Path:
    """This process's gradebook holding ``lesson``'s assignment, from this checkout (as :func:`pipeline.prepare`)."""
    _worker_home()
    template = _HOME["template"]
    if lesson not in _MADE:
        result = pipeline.api(template, term_file="").generate_assignment(lesson, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(f"generate_assignment failed for {lesson} on this worker:\n{result['log'][-2000:]}")
        _MADE.add(lesson)
    return template / "gradebook.db"


def _read_tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()} \
        if folder.is_dir() else {}


def _where() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def grade_remote(task: dict) -> dict:
    """A Dask task: grade one notebook here with :func:`autograder.grading.pipeline.grade_one`, in a scratch nbgrader
    tree
    that is removed afterwards; return its outcome, autograded folder and feedback folder as data."""
    with _LOCK:
        return _grade_remote(task)


def _grade_remote(task: dict) -> dict:
    student, lesson = task["student"], task["lesson"]
    here = fingerprint([lesson])
    if here != task["fingerprint"]:
        why = (f"worker {_where()} grades {lesson} differently (fingerprint {here}, the instructor's "
               f"{task['fingerprint']}): update its checkout and venv to the instructor's, then restart it")
        return {"outcome": asdict(Outcome(student, lesson, 0.0, 0.0, ok=False, message=why)), "worker": _where()}
    pipeline.quiet_nbgrader(task["verbose"])
    scratch = Path(tempfile.mkdtemp(prefix="task-", dir=_worker_home()))
    try:
        shutil.copyfile(_template(lesson), scratch / "gradebook.db")
        _SECRET["secret"] = task["secret"]
        incoming = scratch / "incoming" / student / lesson
        incoming.mkdir(parents=True)
        for name, data in task["files"].items():
            (incoming / name).write_bytes(data)
        grader = _worker_api(scratch, task)
        outcome = pipeline.grade_one(grader, scratch, None, student, lesson, incoming / f"{lesson}.ipynb")
        return {"outcome": asdict(outcome), "worker": _where(),
                "autograded": _read_tree(scratch / "autograded" / student / lesson),
                "feedback": _read_tree(scratch / "feedback" / student / lesson)}
    finally:
        _SECRET.pop("secret", None)
        shutil.rmtree(scratch, ignore_errors=True)


def _worker_ready(lessons: list[str], want: str, sandbox: bool) -> str:
    """Run on every worker before it is given a notebook: '' when it can grade, else why not."""
    try:
        if fingerprint(lessons) != want:
            return f"its checkout grades {', '.join(lessons)} differently from the instructor's (fingerprint)"
        if sandbox:
            from autograder.sandbox.launch import SandboxUnavailable, check_available

            try:
                check_available()
            except SandboxUnavailable as exc:
                return str(exc)
    except Exception as exc:  # a broken checkout: say so rather than fail the run
        return f"{type(exc).__name__}: {exc}"
    return ""


def fix_for(why: str) -> str:
    """What to do about a worker that cannot grade (:func:`_worker_ready`'s answer, or the error its process
    raised before it could answer), in one line."""
    if "No module named" in why or "ImportError" in why:  # the function could not even be loaded there
        return ("start it with the course's environment, from any folder: `./course worker ADDRESS` in a checkout "
                "(or `.venv/bin/dask worker ADDRESS` after `./course setup`, which lets that venv find the "
                "grading code)")
    if "fingerprint" in why:
        return "update its checkout and venv to the instructor's (`git pull`, `./course setup`), then restart it"
    if "bubblewrap" in why or "bwrap" in why or "namespace" in why:
        return "install bubblewrap there and let it create namespaces (docs/INSTRUCTOR.md), then restart it"
    return "run `./course setup` in its checkout and restart it"


class _Workers:
    """The workers that may be given notebooks: each worker of the cluster is checked once, when first seen (at
    the start, or when it joins during the run); one that cannot grade is named with its fix and left out, and
    the run goes on with the others."""

    def __init__(self, client, lessons: list[str], want: str, sandbox: bool):
        self.client, self.lessons, self.want, self.sandbox = client, lessons, want, sandbox
        self.verdicts: dict[str, str] = {}  # address -> '' (can grade) or why not

    def usable(self) -> list[str]:
        from distributed.comm import CommClosedError

        present = set(self.client.nthreads())
        unseen = sorted(present - set(self.verdicts))
        if unseen:
            ready = self.client.run(_worker_ready, self.lessons, self.want, self.sandbox, workers=unseen,
                                    on_error="return")
            for address, why in ready.items():
                if isinstance(why, CommClosedError):
                    continue  # it left meanwhile: no problem, nothing was given to it
                why = why if isinstance(why, str) else f"{type(why).__name__}: {why}"
                self.verdicts[address] = why
                if why:
                    log.warning("Dask worker %s cannot grade (%s): %s. The run goes on with the other workers.",
                                address, shown(why)[:300], fix_for(why))
        return sorted(address for address in present if self.verdicts.get(address) == "")

    def problems(self) -> str:
        return "; ".join(f"{address}: {shown(why)[:300]} (fix: {fix_for(why)})"
                         for address, why in sorted(self.verdicts.items()) if why)


# -- the instructor's side --------------------------------------------------------------------------------------
def _replace_folder(dest: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` as the folder ``dest``: staged beside it, then swapped in by renames."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    staged.chmod(0o755)
    for name, data in files.items():
        path = staged / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            raise ValueError(f"a worker returned a file outside its folder: {shown(name)}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    old = None
    if dest.exists():
        old = dest.rename(staged.with_name(staged.name + ".old"))
    staged.rename(dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def record(grader, work: Path, db_url: str, student: str, lesson: str, result: dict) -> Outcome:
    """Write one worker's result into the instructor's work folder and gradebook (the only writer of both).

    The scores are nbgrader's: ``SaveAutoGrades`` and the term's ``TermLatePenalties`` on the autograded notebook
    the worker returned, against this gradebook's submission (made as ``nbgrader autograde`` makes it, with the
    submission's timestamp). They are checked against the worker's own gradebook's (score, penalty, total)."""
    outcome = Outcome(**result["outcome"])
    if not outcome.ok:
        return outcome
    autograded = result["autograded"]
    ipynbs = sorted(name for name in autograded if name.endswith(".ipynb") and "/" not in name)
    if f"{lesson}.ipynb" not in ipynbs:
        return Outcome(student, lesson, 0.0, 0.0, ok=False, message=f"worker {result['worker']} returned no "
                       "autograded notebook", seconds=outcome.seconds, notes=outcome.notes)
    _replace_folder(work / "autograded" / student / lesson, autograded)
    _replace_folder(work / "feedback" / student / lesson, result["feedback"])
    timestamp = grader.coursedir.get_existing_timestamp(str(work / "submitted" / student / lesson))
    with Gradebook(db_url, COURSE_ID) as gb:
        gb.update_or_create_student(student)
        if timestamp:
            gb.update_or_create_submission(lesson, student, timestamp=timestamp)
        else:
            gb.update_or_create_submission(lesson, student)
    for name in ipynbs:
        nb = nbformat.reads(autograded[name].decode("utf-8"), as_version=nbformat.NO_CONVERT)
        resources = {"nbgrader": {"notebook": name[:-len(".ipynb")], "assignment": lesson, "student": student,
                                  "db_url": db_url}}
        for step in (SaveAutoGrades, TermLatePenalties):
            nb, resources = step(config=grader.config).preprocess(nb, resources)
    here = pipeline._score(db_url, lesson, student)
    if (here["score"], here["max_score"], here["late_penalty"]) != \
            (outcome.score, outcome.max_score, outcome.late_penalty):
        return Outcome(student, lesson, 0.0, 0.0, ok=False, seconds=outcome.seconds, notes=outcome.notes,
                       message=f"the gradebook says {here['score']:g}/{here['max_score']:g} (late penalty "
                               f"{here['late_penalty']:g}), worker {result['worker']} said {outcome.score:g}/"
                               f"{outcome.max_score:g} (late penalty {outcome.late_penalty:g}): grade this "
                               "notebook again")
    return Outcome(student, lesson, **here, seconds=outcome.seconds, notes=outcome.notes)


def _stage(work: Path, student: str, lesson: str, notebook: Path, max_bytes: int,
           exchange_files: bool = True) -> dict[str, bytes]:
    """Check and place the notebook into the instructor's ``submitted/`` tree; its files, as the task carries them
    (``timestamp.txt`` among them: the worker dates the submission as the instructor did)."""
    intake.place(work / "submitted", student, lesson, notebook, max_bytes, exchange_files)
    return _read_tree(work / "submitted" / student / lesson)


def _client(scheduler: str):
    from distributed import Client

    try:
        if scheduler.endswith(".json") and Path(scheduler).is_file():
            return Client(scheduler_file=scheduler, timeout=CONNECT_TIMEOUT)
        return Client(scheduler, timeout=CONNECT_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        raise ClusterUnavailable(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from exc


def check_scheduler(scheduler: str) -> None:
    """Raise :class:`ClusterUnavailable` unless the scheduler answers (before the canaries, to fail fast)."""
    with _client(scheduler):
        pass


def grade_on_cluster(jobs, work: Path, db_url: str | None, scheduler: str, progress: bool = True, *,
                     verbose: bool = False, sandbox: bool = True, limits: Limits | None = None,
                     term_file: Path | str | None = None,
                     exchange: set[tuple[str, str]] | None = None) -> list[Outcome]:
    """Grade ``(student, lesson, notebook)`` jobs on the Dask cluster at ``scheduler`` (an address such as
    ``tcp://10.0.0.5:8786``, or a scheduler file); outcomes in the order of ``jobs``, scores those of local
    grading. The assignments and canaries must be there already (:func:`autograder.grading.pipeline.prepare`).
    ``term_file`` and ``exchange`` as :func:`autograder.grading.grade_class.grade_many`'s."""
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    jobs = [(student, lesson, Path(notebook)) for student, lesson, notebook in jobs]
    if len({(student, lesson) for student, lesson, _ in jobs}) != len(jobs):
        raise ValueError("a (student, lesson) appears twice among the jobs: each notebook is graded once")
    if not jobs:
        return []
    lessons = sorted({lesson for _, lesson, _ in jobs})
    pipeline.check_prepared(work, lessons)
    limits = limits or Limits()
    db_url = parallel.gradebook_url(work, db_url)
    term_file = pipeline.term_file_of(term_file)
    term = Path(term_file).read_bytes() if term_file else None
    grader = pipeline.api(work, db_url, verbose=verbose, sandbox=sandbox, limits=limits, term_file=term_file)
    secret = (work / "secret").read_bytes()
    want = fingerprint(lessons)
    per_lesson = {lesson: fingerprint([lesson]) for lesson in lessons}  # what each task's worker must match
    outcomes: dict[int, Outcome] = {}
    bar = tqdm(total=len(jobs), desc="grading (Dask)", unit="notebook", disable=not progress, file=sys.stderr,
               dynamic_ncols=True)

    def done(i: int, outcome: Outcome) -> None:
        outcomes[i] = outcome
        log.info("%s %s: %s/%s", outcome.student, outcome.lesson, outcome.score, outcome.max_score)
        bar.set_postfix_str(pipeline.summary(outcomes.values()), refresh=False)
        bar.update(1)

    try:
        with _client(scheduler) as client:
            try:
                client.wait_for_workers(1, timeout=WORKER_TIMEOUT)
            except TimeoutError as exc:
                raise ClusterUnavailable(f"the Dask scheduler at {scheduler} has no workers after "
                                         f"{WORKER_TIMEOUT} s: start `dask worker {scheduler}` on the grading "
                                         "machines") from exc
            workers = _Workers(client, lessons, want, sandbox)
            usable = workers.usable()
            if not usable:
                raise ClusterUnavailable(f"no Dask worker of {scheduler} can grade: {workers.problems()}")
            slots = sum(n for address, n in client.nthreads().items() if address in usable) or 1
            window = max(8, 4 * slots)  # notebooks in flight: enough to keep every worker busy, not the class
            queue = list(range(len(jobs)))
            pending = as_completed()
            futures = {}

            def submit_next() -> bool:
                while queue:
                    i = queue.pop(0)
                    student, lesson, notebook = jobs[i]
                    try:
                        files = _stage(work, student, lesson, notebook, limits.notebook_bytes,
                                       exchange is None or (student, lesson) in exchange)
                    except BadSubmission as exc:
                        log.warning("%s %s: not graded: %s", student, lesson, shown(exc))
                        done(i, Outcome(student, lesson, 0.0, 0.0, ok=False, message=shown(exc)))
                        continue
                    task = {"student": student, "lesson": lesson, "files": files, "secret": secret,
                            "fingerprint": per_lesson[lesson], "sandbox": sandbox, "limits": asdict(limits),
                            "verbose": verbose, "term": term}
                    key = f"grade-{lesson}-{student}-{uuid.uuid4().hex[:8]}"
                    usable = workers.usable()  # a worker that joined meanwhile is checked first
                    if not usable:
                        raise ClusterUnavailable(f"no Dask worker of {scheduler} can grade any more (those that "
                                                 f"could left): {workers.problems() or 'no worker is left'}")
                    future = client.submit(grade_remote, task, key=key, retries=TASK_RETRIES, pure=False,
                                           workers=usable, allow_other_workers=False)
                    futures[future] = i
                    pending.add(future)
                    return True
                return False

            for _ in range(window):
                if not submit_next():
                    break
            for future in pending:
                i = futures.pop(future)
                student, lesson, _ = jobs[i]
                try:
                    outcome = record(grader, work, db_url, student, lesson, future.result())
                except KilledWorker as exc:
                    outcome = Outcome(student, lesson, 0.0, 0.0, ok=False, message=(
                        "grading failed: every Dask worker that took this notebook died while grading it "
                        f"({shown(exc)[:200]}); grade it again on its own"))
                except Exception as exc:  # the task reports its own failures; this is the machinery's
                    outcome = Outcome(student, lesson, 0.0, 0.0, ok=False,
                                      message=f"grading failed: {type(exc).__name__}: {shown(exc)[:300]}")
                future.release()
                done(i, outcome)
                submit_next()
    finally:
        bar.close()
    return [outcomes[i] for i in range(len(jobs))]
