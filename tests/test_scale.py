"""Grading at scale: parallel grading scores exactly as sequential grading, and the gradebook runs on PostgreSQL.

One class (6 students x 2 lessons, each notebook perfect, untouched or with typical mistakes) is prepared once:
release and canaries in one work folder. Copies of that folder are then graded sequentially (``grade_one`` in a
loop, as ``grade_class.grade`` does), with ``grade_many`` on 2 worker processes, and, for a few notebooks, against a
real PostgreSQL server started on loopback by ``.ci/postgres.sh`` (Debian's package, installed when missing). The
copies share the grading secret, so every run draws the same hidden cases.
"""

import shutil
import sqlite3
import subprocess
import tempfile
import threading
import time

import nbformat
import pytest
from nbgrader.api import Grade, Gradebook, InvalidEntry, SubmittedAssignment
from sqlalchemy.exc import OperationalError

from autograder.course import notebooks, samples
from autograder.grading import grade_class, pipeline
from autograder.grading import pool as parallel
from autograder.grading.pipeline import CANARY, Outcome
from tests.conftest import ROOT

pytestmark = pytest.mark.pipeline

LESSONS = [lesson for lesson in ("01-masks", "02-attention") if lesson in notebooks.lessons()]
STUDENTS = [f"student{i}" for i in range(6)]
# Student i's notebook of lesson j: every lesson gets each kind twice, and each student a mix.
MAKERS = (samples.perfect, samples.untouched, samples.typical_mistakes)
PG_STUDENTS = STUDENTS[:3]  # the PostgreSQL run: lesson 0 of three students, one of each kind


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    assert len(LESSONS) == 2, "lessons 01-masks and 02-attention are needed"
    root = tmp_path_factory.mktemp("scale")
    jobs = []
    for i, student in enumerate(STUDENTS):
        for j, lesson in enumerate(LESSONS):
            path = root / "incoming" / student / lesson / f"{lesson}.ipynb"
            path.parent.mkdir(parents=True)
            nbformat.write(MAKERS[(i + j) % len(MAKERS)](lesson), path)
            jobs.append((student, lesson, path))
    _, canaries = pipeline.prepare(root / "base", LESSONS)
    return {"root": root, "jobs": jobs, "canaries": canaries}


def _copy_of_base(prepared, name):
    work = prepared["root"] / name
    shutil.copytree(prepared["root"] / "base", work)
    return work


@pytest.fixture(scope="module")
def sequential(prepared):
    work = _copy_of_base(prepared, "sequential")
    grader = pipeline.api(work)
    outcomes = [pipeline.grade_one(grader, work, None, *job) for job in prepared["jobs"]]
    return {"work": work, "outcomes": outcomes, "url": f"sqlite:///{work / 'gradebook.db'}"}


@pytest.fixture(scope="module")
def in_parallel(prepared):
    work = _copy_of_base(prepared, "parallel")
    outcomes = grade_class.grade_many(prepared["jobs"], work, None, workers=2, progress=False)
    return {"work": work, "outcomes": outcomes, "url": f"sqlite:///{work / 'gradebook.db'}"}


def item_scores(url: str) -> dict[tuple[str, str, str], float]:
    """(student, lesson, item) -> score, for every graded item in the gradebook at ``url``."""
    with Gradebook(url, pipeline.COURSE_ID) as gb:
        return {(g.student.id, g.assignment.name, g.name): g.score for g in gb.db.query(Grade).all()}


def _summary(outcomes: list[Outcome]):
    return [(o.student, o.lesson, o.score, o.max_score, o.ok) for o in outcomes]


def test_the_class_is_graded_as_expected_sequentially(prepared, sequential):
    # the reference run itself must be right, or agreeing with it proves nothing
    assert all(c.ok and c.score == c.max_score > 0 for c in prepared["canaries"])
    for (student, lesson, _), o in zip(prepared["jobs"], sequential["outcomes"], strict=True):
        kind = MAKERS[(STUDENTS.index(student) + LESSONS.index(lesson)) % len(MAKERS)]
        assert o.ok, o.message
        if kind is samples.perfect:
            assert o.score == o.max_score > 0, o
        elif kind is samples.untouched:
            assert o.score == 0 < o.max_score, o
        else:
            assert 0 < o.score < o.max_score, o


def test_parallel_grading_gives_the_same_scores_as_sequential(prepared, sequential, in_parallel):
    # same outcomes, in the order of the jobs, whatever order the workers finished in
    assert _summary(in_parallel["outcomes"]) == _summary(sequential["outcomes"])
    assert [o.notes for o in in_parallel["outcomes"]] == [o.notes for o in sequential["outcomes"]]
    # same score for every item in the two gradebooks
    want, got = item_scores(sequential["url"]), item_scores(in_parallel["url"])
    assert len(want) > len(STUDENTS) * len(LESSONS)
    assert got == want
    assert pipeline.summary(in_parallel["outcomes"]) == f"graded {len(prepared['jobs'])}, needs attention 0, failed 0"


def test_parallel_gradebook_has_exactly_one_row_per_student_submission_and_item(prepared, in_parallel):
    work = in_parallel["work"]
    with Gradebook(in_parallel["url"], pipeline.COURSE_ID) as gb:
        # the canary is graded in its own tree: never a student of the class
        assert sorted(s.id for s in gb.students) == sorted(STUDENTS)
        n_items = 0
        for lesson in LESSONS:
            items = len(gb.find_notebook(lesson, lesson).grade_cells)
            submissions = gb.find_assignment(lesson).submissions
            assert sorted(s.student.id for s in submissions) == sorted(STUDENTS)
            for submission in submissions:
                (notebook,) = submission.notebooks
                assert len(notebook.grades) == items, f"{submission.student.id}/{lesson}"
            n_items += items
        assert gb.db.query(SubmittedAssignment).count() == len(LESSONS) * len(STUDENTS)
        assert gb.db.query(Grade).count() == n_items * len(STUDENTS)
    for student, lesson, _ in prepared["jobs"]:
        assert (work / "autograded" / student / lesson / f"{lesson}.ipynb").exists()
        assert (work / "feedback" / student / lesson / f"{lesson}.html").exists()


def test_students_exist_before_the_workers_start_and_a_bad_file_fails_alone(prepared):
    # Two workers creating the same new student at once collide (UNIQUE constraint): grade_many creates every
    # student first. A file that is not a notebook never reaches nbgrader, so only that can have made the rows.
    work = _copy_of_base(prepared, "bad-files")
    broken = prepared["root"] / "broken.ipynb"
    broken.write_text('{"cells": [')
    jobs = [("zoe", LESSONS[0], broken), ("yan", LESSONS[1], broken)]
    outcomes = grade_class.grade_many(jobs, work, None, workers=2, progress=False)
    assert [(o.student, o.lesson, o.ok) for o in outcomes] == [("zoe", LESSONS[0], False), ("yan", LESSONS[1], False)]
    assert all("not a notebook" in o.message for o in outcomes), [o.message for o in outcomes]
    assert pipeline.summary(outcomes) == "graded 0, needs attention 0, failed 2"
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}", pipeline.COURSE_ID) as gb:
        assert sorted(s.id for s in gb.students) == sorted(["zoe", "yan"])


# -- PostgreSQL ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def postgres_url():
    # not pytest's tmp_path: as root, the server runs as `postgres`, which must reach the folder
    folder = tempfile.mkdtemp(prefix="decoder-course-pg-")
    script = str(ROOT / ".ci" / "postgres.sh")
    started = subprocess.run([script, "start", folder], capture_output=True, text=True, timeout=600)
    assert started.returncode == 0, f"could not start PostgreSQL: {started.stderr[-2000:]}"
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([script, "stop", folder], capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


def test_postgresql_gradebook_gives_the_same_scores_as_sqlite(prepared, sequential, postgres_url):
    lesson = LESSONS[0]
    work = prepared["root"] / "postgres"
    work.mkdir()
    shutil.copy(prepared["root"] / "base" / "secret", work / "secret")  # the same hidden cases as the SQLite runs
    _, (canary,) = pipeline.prepare(work, [lesson], db_url=postgres_url)
    assert canary.ok and canary.score == canary.max_score > 0
    jobs = [job for job in prepared["jobs"] if job[0] in PG_STUDENTS and job[1] == lesson]
    outcomes = grade_class.grade_many(jobs, work, postgres_url, workers=2, progress=False)
    assert all(o.ok for o in outcomes), [o.message for o in outcomes]
    assert not (work / "gradebook.db").exists(), "a SQLite gradebook was written instead of PostgreSQL"

    got = item_scores(postgres_url)
    want = {key: score for key, score in item_scores(sequential["url"]).items()
            if key[1] == lesson and key[0] in PG_STUDENTS}
    assert got == want
    assert {score for (student, _, _), score in got.items() if student != CANARY} != {0.0}
    with Gradebook(postgres_url, pipeline.COURSE_ID) as gb:
        assert gb.engine.dialect.name == "postgresql"
        assert sorted(s.id for s in gb.students) == sorted(PG_STUDENTS)


# -- the SQLite gradebook under concurrent writers ----------------------------------------------------------------
def _hold_write_lock(path, seconds, locked: threading.Event):
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("BEGIN IMMEDIATE")  # the write lock, as a worker saving its grades holds it
    locked.set()
    time.sleep(seconds)
    con.execute("COMMIT")
    con.close()


@pytest.mark.parametrize("timeout, waits", [(0.1, False), (None, True)])
def test_sqlite_busy_timeout_reaches_the_connection_through_nbgrader(tmp_path, timeout, waits):
    # Another connection holds the write lock for 2 s. With ?timeout=0.1 the write gives up at once (so the
    # parameter reached sqlite3.connect: its default would wait 5 s and succeed); with gradebook_url's it waits.
    path = tmp_path / "gradebook.db"
    with Gradebook(f"sqlite:///{path}", pipeline.COURSE_ID):
        pass  # creates the tables
    url = parallel.gradebook_url(tmp_path) if timeout is None else f"sqlite:///{path}?timeout={timeout}"
    assert url.startswith(f"sqlite:///{path}?timeout=")
    locked = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(path, 2.0, locked))
    holder.start()
    try:
        assert locked.wait(10)
        started = time.perf_counter()
        with Gradebook(url, pipeline.COURSE_ID) as gb:
            if waits:
                gb.update_or_create_student("ada")  # waits for the lock, then writes
                assert time.perf_counter() - started >= 1.5
                assert [s.id for s in gb.students] == ["ada"]
            else:
                # nbgrader wraps it in its InvalidEntry
                with pytest.raises((OperationalError, InvalidEntry), match="database is locked"):
                    gb.update_or_create_student("ada")
    finally:
        holder.join()


def test_gradebook_url_adds_a_timeout_to_sqlite_only(tmp_path):
    assert parallel.gradebook_url(tmp_path) == f"sqlite:///{tmp_path / 'gradebook.db'}?timeout=60"
    assert parallel.gradebook_url(tmp_path, "sqlite:////x/g.db?timeout=5") == "sqlite:////x/g.db?timeout=5"
    pg = "postgresql://grader:pw@127.0.0.1:5432/gradebook"
    assert parallel.gradebook_url(tmp_path, pg) == pg


def test_grade_many_refuses_to_start_before_the_canary(tmp_path):
    with pytest.raises(RuntimeError, match="canar"):
        grade_class.grade_many([("ada", "01-masks", tmp_path / "x.ipynb")], tmp_path, workers=2, progress=False)


def test_summary_counts_each_notebook_once():
    outcomes = [Outcome(CANARY, "l", 4, 4), Outcome("a", "l", 4, 4), Outcome("b", "l", 0, 4),
                Outcome("c", "l", 2, 4, notes=["cell 3 ran past the 120 s cell limit"]),
                Outcome("d", "l", 0, 0, ok=False, message="not a notebook")]
    assert pipeline.summary(outcomes) == "graded 2, needs attention 1, failed 1"
