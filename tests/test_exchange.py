"""nbgrader's exchange cycle on one machine, with the repository's nbgrader_config.py: release_assignment, a second
unix user's fetch_assignment and submit, collect, ``./course grade`` on the collected tree, release_feedback, and
the student's fetch_feedback receiving the course's own feedback page (the grader's report and verdicts, no hidden
test, no hidden value). Then nbgrader's ``export``, its API (what formgrader shows) and ``generate_feedback`` on
the same tree and gradebook.

Runs as root (it creates the student's account, ``course-student-<random>``, and removes it at the end). The
instructor's commands run in the repository with ``DECODER_COURSE_WORK`` and ``NBGRADER_EXCHANGE_ROOT`` set, as
docs/INSTRUCTOR.md says; the student's run in the student's home with the course and exchange on the command
line, as a hub's system-wide config would give them.
"""

import csv
import html
import json
import os
import pwd
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import numpy as np
import pytest

from autograder import samples, verdicts
from autograder.reference import masks as ref
from tests.conftest import ROOT

pytestmark = pytest.mark.pipeline

LESSON = "01-masks"
COURSE = "decoder-course"
VENV = ROOT / ".venv"
SITE = VENV / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
HIDDEN_MARKERS = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS", "from decoder_course.harvest import collect")


def _run(cmd, *, user: str | None = None, cwd: Path, env: dict, stdin: bytes | None = None,
         timeout: float = 240) -> str:
    """Run ``cmd`` (as ``user`` through runuser, with exactly ``env``); fail with its output unless it succeeds."""
    if user:
        cmd = ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *cmd]
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    done = subprocess.run(cmd, cwd=cwd, env=env, input=stdin, capture_output=True, timeout=timeout)
    out = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n{out[-4000:]}"
    return out


@pytest.fixture(scope="module")
def student():
    """A second unix account, the student's, removed at the end."""
    assert os.geteuid() == 0, ("tests/test_exchange.py runs as root: it creates a second unix user (the student) "
                               "to run nbgrader's exchange between two accounts")
    for tool in ("useradd", "userdel", "runuser"):
        assert shutil.which(tool) or Path("/usr/sbin", tool).exists(), f"{tool} is missing"
    name = f"course-student-{secrets.token_hex(3)}"
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True)
        assert name not in {p.pw_name for p in pwd.getpwall()}, f"userdel did not remove {name}"


def _student_python(user: str) -> str:
    """An interpreter the student may run with the venv's packages.

    The venv's ``python`` is a link to the interpreter it was made from, which may sit where only its owner can
    go (pyenv under /root): then the same Python version from the system is used, with the venv's site-packages
    on ``PYTHONPATH`` (readable by everyone: checked here)."""
    candidates = [str(VENV / "bin" / "python"), f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}",
                  f"/usr/local/bin/python{sys.version_info[0]}.{sys.version_info[1]}"]
    tried = []
    for python in candidates:
        done = subprocess.run(["runuser", "-u", user, "--", "env", "-i", f"PYTHONPATH={SITE}", python, "-c",
                               "import nbgrader, sys; print(sys.version_info[:2])"], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == str(tuple(sys.version_info[:2])):
            return python
        tried.append(f"{python}: {(done.stderr or done.stdout).strip()[-200:]}")
    pytest.fail("the student cannot run nbgrader from this venv (read access to .venv, a Python "
                f"{sys.version_info[0]}.{sys.version_info[1]} they may execute):\n" + "\n".join(tried))


def _text(path: Path) -> str:
    """What a reader sees of an HTML page: no tags (code is split into highlighting spans), entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


def _renderings(array: np.ndarray) -> set[str]:
    if array.size < 6:
        return set()
    forms = {repr(array), str(array), str(array.tolist()), json.dumps(array.tolist())}
    return {form for form in forms if len(form) >= 12}


def _expected(item: str, data: dict) -> np.ndarray:
    """The reference output of one hidden case of lesson 01."""
    return getattr(ref, item)(*data["args"].values())  # the call's arguments by name (autograder/checks/spec.py)


def _hidden_values(work: Path, student: str) -> set[str]:
    """The hidden inputs and reference outputs of this student's grading, recomputed from the course's secret."""
    nb = nbformat.read(work / "autograded" / student / LESSON / f"{LESSON}.ipynb", as_version=4)
    for cell in nb.cells:
        cell.pop("outputs", None)
    secret = (work / "secret").read_bytes()
    digest = verdicts.submission_digest(nb)
    found = {secret.hex()}
    for item, exercise in verdicts.exercises_for(LESSON).items():
        seed = verdicts.derive_seed(secret, LESSON, student, item, digest)
        found.add(str(seed))
        for case in exercise().cases(np.random.default_rng(seed)):
            for array in case.arrays.values():
                found |= _renderings(np.asarray(array))
            found |= _renderings(np.asarray(_expected(item, case.data)))
    return found


def _assert_course_feedback(path: Path, work: Path, student: str) -> None:
    """The course's feedback page: the grader's report and verdicts; no hidden test, no hidden value."""
    raw = path.read_text()
    text = _text(path)
    assert 'data-course-grader="report"' in raw, f"{path}: not the course's feedback (no grader's report)"
    assert f"Grader's report · {LESSON} · {student} · 2 / 4 points" in text, text[:2000]
    assert raw.count('data-course-grader="verdict"') == 4
    assert text.count("✓ Hidden checks: all 4 hidden cases passed") >= 2  # in the report and in the cells
    assert "✗ Hidden checks for `causal_mask`" in text and "✗ Hidden checks for `combine_masks`" in text
    for marker in HIDDEN_MARKERS:
        assert marker not in text and marker not in raw, f"{path} shows hidden-test text {marker!r}"
    values = _hidden_values(work, student)
    assert len(values) > 10
    for value in values:
        assert value not in text, f"{path} shows a hidden input or reference value: {value[:80]!r}"


def _root_config_api(work: Path, exchange: Path, monkeypatch):
    """nbgrader's API (what formgrader uses) built from the repository's nbgrader_config.py."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    monkeypatch.setenv("DECODER_COURSE_WORK", str(work))
    monkeypatch.setenv("NBGRADER_EXCHANGE_ROOT", str(exchange))
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


@pytest.fixture
def shared():
    """A folder both accounts reach (pytest's own tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="exchange-test-"))
    path.chmod(0o755)  # the student traverses it to reach the exchange
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_exchange_cycle_between_two_accounts_delivers_the_course_feedback(student, shared, monkeypatch):
    user, home, tmp_path = student.pw_name, Path(student.pw_dir), shared
    for parent in tmp_path.parents:
        assert os.stat(parent).st_mode & 0o001, f"{parent} is not traversable by other users"
    exchange, work = tmp_path / "exchange", tmp_path / "work"
    exchange.mkdir()
    exchange.chmod(0o777)
    instructor = {**os.environ, "DECODER_COURSE_WORK": str(work), "NBGRADER_EXCHANGE_ROOT": str(exchange),
                  "OMP_NUM_THREADS": "1"}
    nbgrader = [str(VENV / "bin" / "nbgrader")]
    python = _student_python(user)
    course = home / "decoder-course"
    _run(["mkdir", "-p", str(course)], user=user, cwd=home, env={"HOME": str(home)})
    as_student = {"HOME": str(home), "USER": user, "LOGNAME": user, "PATH": "/usr/bin:/bin",
                  "PYTHONPATH": str(SITE), "OMP_NUM_THREADS": "1"}
    on_exchange = ["--course", COURSE, f"--Exchange.root={exchange}"]

    def as_the_student(*args):
        return _run([python, "-m", "nbgrader", *args, *on_exchange], user=user, cwd=course, env=as_student)

    # The instructor hands out lessons/01-masks; the student fetches it.
    _run([*nbgrader, "release_assignment", LESSON], cwd=ROOT, env=instructor)
    released = exchange / COURSE / "outbound" / LESSON / f"{LESSON}.ipynb"
    assert released.read_bytes() == (ROOT / "lessons" / LESSON / f"{LESSON}.ipynb").read_bytes()
    as_the_student("fetch_assignment", LESSON)
    fetched = course / LESSON / f"{LESSON}.ipynb"
    assert fetched.stat().st_uid == student.pw_uid

    # The student works (typical mistakes: two of four exercises wrong), saves as themselves, submits.
    answer = nbformat.writes(samples.typical_mistakes(LESSON)).encode()
    _run(["sh", "-c", f"cat > '{fetched}'"], user=user, cwd=course, env=as_student, stdin=answer)
    assert fetched.stat().st_uid == student.pw_uid and fetched.read_bytes() == answer
    as_the_student("submit", LESSON)

    # The instructor collects into the work tree, then grades that very tree with ./course grade.
    _run([*nbgrader, "collect", LESSON], cwd=ROOT, env=instructor)
    collected = work / "submitted" / user / LESSON
    assert sorted(p.name for p in collected.iterdir()) == [f"{LESSON}.ipynb", "submission_secret.txt",
                                                             "timestamp.txt"]
    side = {name: (collected / name).read_text() for name in ("timestamp.txt", "submission_secret.txt")}
    out = _run([sys.executable, "-m", "autograder", "grade", str(work / "submitted"), "--work", str(work),
                "--lessons", LESSON], cwd=ROOT, env=instructor, timeout=400)
    print(out[-600:])
    # The collected submission survives being graded in place: the same notebook, the exchange's files kept.
    assert sorted(p.name for p in collected.iterdir()) == sorted([f"{LESSON}.ipynb", *side])
    assert {name: (collected / name).read_text() for name in side} == side
    kept = nbformat.read(collected / f"{LESSON}.ipynb", as_version=4)
    assert [c.source for c in kept.cells] == [c.source for c in nbformat.reads(answer.decode(), as_version=4).cells]
    with open(work / "grades.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["student"], r["score"], r["max_score"], r["status"]) for r in rows] == [(user, "2.0", "4.0", "ok")]
    feedback = work / "feedback" / user / LESSON / f"{LESSON}.html"
    _assert_course_feedback(feedback, work, user)

    # release_feedback, and the student's fetch_feedback receives exactly the course's page.
    _run([*nbgrader, "release_feedback", LESSON], cwd=ROOT, env=instructor)
    as_the_student("fetch_feedback", LESSON)
    received = sorted((course / LESSON / "feedback").glob(f"*/{LESSON}.html"))
    assert len(received) == 1, f"fetch_feedback delivered {received}"
    assert received[0].stat().st_uid == student.pw_uid
    assert received[0].read_bytes() == feedback.read_bytes()
    _assert_course_feedback(received[0], work, user)

    # nbgrader's export: the student, not the canary.
    _run([*nbgrader, "export", f"--CsvExportPlugin.to={tmp_path / 'export.csv'}"], cwd=ROOT, env=instructor)
    with open(tmp_path / "export.csv") as handle:
        exported = list(csv.DictReader(handle))
    assert [(r["student_id"], r["assignment"], float(r["score"]), float(r["max_score"])) for r in exported] == \
        [(user, LESSON, 2.0, 4.0)]

    # What formgrader shows: autograded (the timestamps match), graded, the course's score; no canary.
    api = _root_config_api(work, exchange, monkeypatch)
    [submission] = api.get_submissions(LESSON)
    assert submission["student"] == user and submission["autograded"] and not submission["needs_manual_grade"]
    assert (submission["score"], submission["max_score"]) == (2.0, 4.0)
    assert submission["timestamp"] and submission["timestamp"].replace("T", " ") in side["timestamp.txt"]
    assert [s["id"] for s in api.get_students()] == [user]
    assert api.get_assignment(LESSON)["average_score"] == 2.0

    # nbgrader generate_feedback from the CLI goes through the course's preprocessors: a new page (a new seal),
    # with the grader's report, still no hidden test and no hidden value.
    before = feedback.read_text()
    _run([*nbgrader, "generate_feedback", LESSON, "--force"], cwd=ROOT, env=instructor)
    assert feedback.read_text() != before
    _assert_course_feedback(feedback, work, user)


def test_grading_a_collected_tree_in_place_keeps_the_submission_when_writing_fails(tmp_path, monkeypatch):
    """``./course grade <work>/submitted`` replaces each folder it reads from: by renames, after everything is
    read, so a failure while writing leaves the collected submission (notebook and exchange files) as it was."""
    from autograder import intake

    folder = tmp_path / "submitted" / "ada" / LESSON
    folder.mkdir(parents=True)
    nbformat.write(samples.perfect(LESSON), folder / f"{LESSON}.ipynb")
    side = {"timestamp.txt": "2026-12-01 07:58:18.819097 UTC", "submission_secret.txt": "ab" * 64}
    for name, text in side.items():
        (folder / name).write_text(text)
    (folder / "scratch.txt").write_text("not part of the submission")
    original = (folder / f"{LESSON}.ipynb").read_bytes()

    def broken_write(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(intake.nbformat, "write", broken_write)
        with pytest.raises(OSError):
            intake.place(tmp_path / "submitted", "ada", LESSON, folder / f"{LESSON}.ipynb", 16 << 20)
    assert (folder / f"{LESSON}.ipynb").read_bytes() == original
    assert sorted(p.name for p in (tmp_path / "submitted" / "ada").iterdir()) == [LESSON]  # nothing left behind

    intake.place(tmp_path / "submitted", "ada", LESSON, folder / f"{LESSON}.ipynb", 16 << 20)
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{LESSON}.ipynb", *side])
    assert {name: (folder / name).read_text() for name in side} == side
    assert [c.source for c in nbformat.read(folder / f"{LESSON}.ipynb", as_version=4).cells] == \
        [c.source for c in samples.perfect(LESSON).cells]
    assert sorted(p.name for p in (tmp_path / "submitted" / "ada").iterdir()) == [LESSON]
