"""nbgrader's exchange cycle on one machine, with the repository's nbgrader_config.py: release_assignment, a second
unix user's fetch_assignment and submit, collect, ``./course grade`` on the collected tree, release_feedback, and
the student's fetch_feedback receiving the course's own feedback page (the grader's report and verdicts, no hidden
test, no hidden value). Then nbgrader's ``export``, its API (what formgrader shows) and ``generate_feedback`` on
the same tree and gradebook.

Then whose submission collect takes (``autograder.intake.exchange``): three students' accounts, bob forging, linking and
tampering against alice's and carol's submissions, graded end to end; every refused form of an inbound entry in one
collect; a submission changed between the check and the copy; an inbound folder a student owns.

Runs as root (it creates the students' accounts, ``course-<role>-<random>``, and removes them at the end). The
instructor's commands run in the repository with ``DECODER_COURSE_WORK`` and ``NBGRADER_EXCHANGE_ROOT`` set, as
docs/INSTRUCTOR.md says; the student's run in the student's home with the course and exchange on the command
line, as a hub's system-wide config would give them.
"""

import contextlib
import csv
import datetime
import html
import json
import logging
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

from autograder.course import samples
from autograder.course.reference import masks as ref
from autograder.grading import grade_class
from autograder.judge import verdicts
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


@contextlib.contextmanager
def _accounts(*roles: str):
    """One new unix account per role (``course-<role>-<random>``), removed at the end."""
    assert os.geteuid() == 0, ("tests/test_exchange.py runs as root: it creates unix users (the students) to run "
                               "nbgrader's exchange between accounts")
    for tool in ("useradd", "userdel", "runuser"):
        assert shutil.which(tool) or Path("/usr/sbin", tool).exists(), f"{tool} is missing"
    names = []
    try:
        for role in roles:
            names.append(f"course-{role}-{secrets.token_hex(3)}")
            subprocess.run(["useradd", "-m", "-s", "/bin/sh", names[-1]], check=True, capture_output=True)
        yield [pwd.getpwnam(name) for name in names]
    finally:
        for name in names:
            subprocess.run(["userdel", "-r", name], capture_output=True)
        left = set(names) & {p.pw_name for p in pwd.getpwall()}
        assert not left, f"userdel did not remove {left}"


@pytest.fixture(scope="module")
def student():
    """A second unix account, the student's."""
    with _accounts("student") as (entry,):
        yield entry


@pytest.fixture(scope="module")
def classmates():
    """Three students' accounts: alice and carol work honestly, bob attacks their submissions."""
    with _accounts("alice", "bob", "carol") as entries:
        yield entries


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
    return getattr(ref, item)(*data["args"].values())  # the call's arguments by name (autograder/course/checks/spec.py)


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
    said = _run([*nbgrader, "release_assignment", LESSON], cwd=ROOT, env=instructor)
    assert f"released {LESSON} to the exchange ({exchange}/{COURSE}/outbound/{LESSON})" in said, said  # one line
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
    said = _run([*nbgrader, "collect", LESSON], cwd=ROOT, env=instructor)
    assert f"collected {LESSON}: 1 submission into {work / 'submitted'}" in said, said
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
    said = _run([*nbgrader, "release_feedback", LESSON], cwd=ROOT, env=instructor)
    assert f"released the feedback of {LESSON}: 1 page for 1 student" in said, said
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
    from autograder.intake import submissions as intake

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


# -- whose submission is collected ------------------------------------------------------------------------------

class _Account:
    """A student's account on the hub: their shell, and nbgrader run as them in their course folder."""

    def __init__(self, entry: pwd.struct_passwd, exchange: Path):
        self.name, self.uid, self.home = entry.pw_name, entry.pw_uid, Path(entry.pw_dir)
        self.exchange, self.course = exchange, self.home / "decoder-course"
        self.env = {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, "PATH": "/usr/bin:/bin",
                    "PYTHONPATH": str(SITE), "OMP_NUM_THREADS": "1"}

    def sh(self, script: str, *args, stdin: bytes | None = None) -> str:
        """``script`` in the student's shell, ``args`` as ``$1``, ``$2``… (the exchange's names have spaces)."""
        return _run(["sh", "-c", script, "sh", *map(str, args)], user=self.name, cwd=self.home, env=self.env,
                    stdin=stdin, timeout=30)

    def fails_to_run(self, script: str, *args) -> bool:
        """Whether ``script`` fails in the student's shell."""
        env = [f"{key}={value}" for key, value in self.env.items()]
        done = subprocess.run(["runuser", "-u", self.name, "--", "env", "-i", *env, "sh", "-c", script, "sh",
                               *map(str, args)], cwd=self.home, capture_output=True, timeout=30)
        return done.returncode != 0

    def nbgrader(self, python: str, *args) -> str:
        return _run([python, "-m", "nbgrader", *args, "--course", COURSE, f"--Exchange.root={self.exchange}"],
                    user=self.name, cwd=self.course, env=self.env)

    def folder(self, path: Path) -> Path:
        """A folder of the student's (0755) in a place only root may write to."""
        path.mkdir(mode=0o755)
        os.chown(path, self.uid, -1)
        return path

    def save(self, nb: nbformat.NotebookNode) -> bytes:
        """Save ``nb`` as the lesson's notebook in the student's course folder, as the student."""
        data = nbformat.writes(nb).encode()
        self.sh('cat > "$1"', self.course / LESSON / f"{LESSON}.ipynb", stdin=data)
        return data


def _inbound(exchange: Path) -> Path:
    return exchange / COURSE / "inbound"


def _new_entry(exchange: Path, before: set[str]) -> str:
    [name] = {p.name for p in _inbound(exchange).iterdir()} - before
    return name


def _stamp(offset: float = 0.0) -> str:
    """A time as nbgrader's submit writes it into a submission's name, ``offset`` seconds from now."""
    when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset)
    return when.strftime("%Y-%m-%d %H:%M:%S.%f UTC")


def _exchange(shared: Path) -> tuple[Path, Path, dict]:
    """An exchange as docs/INSTRUCTOR.md sets it up (sticky, writable by all), a work tree, the instructor's env."""
    exchange, work = shared / "exchange", shared / "work"
    exchange.mkdir()
    exchange.chmod(0o1777)
    work.mkdir()
    (work / "secret").write_bytes(os.urandom(32))  # what TrustedExecute would make: the grading run reads it
    (work / "secret").chmod(0o600)
    env = {**os.environ, "DECODER_COURSE_WORK": str(work), "NBGRADER_EXCHANGE_ROOT": str(exchange),
           "OMP_NUM_THREADS": "1"}
    return exchange, work, env


def _files_holding(root: Path, needles: list[bytes], skip: set[Path]) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and path not in skip:
            data = path.read_bytes()
            found += [f"{path}: {needle[:16]!r}" for needle in needles if needle in data]
    return found


def _set_apart(work: Path) -> dict[str, str]:
    """What collect set apart: the folder each file names -> the file's text."""
    texts = [p.read_text() for p in sorted((work / "set_apart" / LESSON).glob("*.txt"))]
    return {re.search(r"^folder: .*/inbound/(.*)$", text, re.M).group(1): text for text in texts}


def test_collect_takes_each_students_own_submission_and_sets_apart_forgeries(classmates, shared, monkeypatch):
    """Three students through nbgrader's exchange, bob attacking: ``nbgrader submit --student alice`` with a wrong
    notebook, a later ``alice+…`` entry that is a link to alice's world-readable draft, a notebook put into carol's
    latest submission, and a submission of his own whose notebook is a link to the course's secret. Collect sets
    each apart with a message naming it and why, and takes each student's own latest submission that passed: the
    grading run gives alice and carol full marks on their own notebooks and bob his own honest 2 / 4. Nothing was
    read through a link; nbgrader's own collect, on the same exchange, would have taken the forgeries."""
    exchange, work, instructor = _exchange(shared)
    alice, bob, carol = (_Account(entry, exchange) for entry in classmates)
    python = _student_python(alice.name)
    _run([str(VENV / "bin" / "nbgrader"), "release_assignment", LESSON], cwd=ROOT, env=instructor)
    for student in (alice, bob, carol):
        student.sh('mkdir -p "$1"', student.course)
        student.nbgrader(python, "fetch_assignment", LESSON)
    # What bob cannot do at all: change the released lesson, add to outbound, rename the course's folder away.
    course_folder = exchange / COURSE
    for script in (f'echo x > "$1/outbound/{LESSON}/{LESSON}.ipynb"', 'mkdir "$1/outbound/extra"',
                   'mv "$1" "$1.old"', 'mkdir "$1/feedback"'):
        assert bob.fails_to_run(script, course_folder), f"bob could run {script!r}"
    assert not bob.fails_to_run('test -w "$1/inbound" && test -r "$1/outbound"', course_folder)  # what he can
    assert (course_folder / "outbound" / LESSON / f"{LESSON}.ipynb").read_bytes() == \
        (ROOT / "lessons" / LESSON / f"{LESSON}.ipynb").read_bytes()
    perfect, typical = samples.perfect(LESSON), samples.typical_mistakes(LESSON)
    released = nbformat.read(ROOT / "lessons" / LESSON / f"{LESSON}.ipynb", as_version=4)

    def submit(student: _Account, *args) -> str:
        before = {p.name for p in _inbound(exchange).iterdir()}
        student.nbgrader(python, "submit", LESSON, *args)
        return _new_entry(exchange, before)

    alice_answer = alice.save(perfect)
    alice_entry = submit(alice)
    bob.save(typical)
    bob_entry = submit(bob)
    carol_answer = carol.save(perfect)
    carol_entry = submit(carol)
    carol_later = submit(carol)  # the same work again; carol gives bob its folder's name

    # bob: a forgery in alice's name (a notebook that scores 0), later than alice's own submission.
    forged = bob.save(released)
    forgery = submit(bob, "--student", alice.name)
    assert forgery.startswith(f"{alice.name}+") and (_inbound(exchange) / forgery).stat().st_uid == bob.uid
    # bob: a later entry in alice's name that is a link to alice's own draft (owned by alice, readable by all).
    draft = shared / "alice-draft"
    marker = f"alice's draft {secrets.token_hex(8)}"
    draft_nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(marker)])
    alice.sh('cat > "$1/$2" && chmod 644 "$1/$2"', alice.folder(draft), f"{LESSON}.ipynb",
             stdin=nbformat.writes(draft_nb).encode())
    link_entry = f"{alice.name}+{LESSON}+{_stamp(60)}+link"
    bob.sh('ln -s "$1" "$2"', draft, _inbound(exchange) / link_entry)
    # bob: carol's folder is writable by everyone (nbgrader's submit makes it so): he replaces her notebook.
    bob.sh('rm -f "$1" && cat > "$1"', _inbound(exchange) / carol_later / f"{LESSON}.ipynb", stdin=forged)
    # bob: a later submission of his own whose notebook is a link to the course's secret.
    bob_later = submit(bob)
    bob.sh('rm -f "$1" && ln -s "$2" "$1"', _inbound(exchange) / bob_later / f"{LESSON}.ipynb", work / "secret")

    # What nbgrader's own collect (in this process, as root) would have taken: the link in alice's name, with
    # her draft read through it, and the secret read through bob's link.
    stock = _collect_in_process(work.parent / "stock-work", exchange, monkeypatch, stock=True)
    assert marker in (stock / alice.name / LESSON / f"{LESSON}.ipynb").read_text()
    assert (stock / bob.name / LESSON / f"{LESSON}.ipynb").read_bytes() == (work / "secret").read_bytes()
    assert (stock / carol.name / LESSON / f"{LESSON}.ipynb").read_bytes() == forged
    shutil.rmtree(stock.parent)

    out = _run([str(VENV / "bin" / "nbgrader"), "collect", LESSON], cwd=ROOT, env=instructor)
    reasons = {
        forgery: f"it is owned by {bob.name} (uid {bob.uid}), not by {alice.name}'s account {alice.name}",
        link_entry: "it is a symbolic link",
        carol_later: f"{LESSON}.ipynb is owned by {bob.name}",
        bob_later: f"{LESSON}.ipynb is a symbolic link",
    }
    set_apart = _set_apart(work)
    assert sorted(set_apart) == sorted(reasons), out
    for entry, reason in reasons.items():
        assert f"Set apart {entry}: {reason}" in out, out  # collect's log, in the instructor's terminal
        assert f"why: {reason}" in set_apart[entry]
        claimed = entry.split("+")[0]
        assert f"{claimed}'s own submission of " in set_apart[entry] and "collected instead" in set_apart[entry]
    for student, entry, answer in ((alice, alice_entry, alice_answer), (bob, bob_entry, None),
                                   (carol, carol_entry, carol_answer)):
        collected = work / "submitted" / student.name / LESSON
        submission = _inbound(exchange) / entry
        assert (collected / "timestamp.txt").read_text() == (submission / "timestamp.txt").read_text()
        assert (collected / f"{LESSON}.ipynb").read_bytes() == (submission / f"{LESSON}.ipynb").read_bytes()
        if answer is not None:
            assert (collected / f"{LESSON}.ipynb").read_bytes() == answer
        assert not any(p.is_symlink() for p in collected.rglob("*"))
    assert sorted(p.name for p in (work / "submitted").iterdir()) == sorted(s.name for s in (alice, bob, carol))
    secret = (work / "secret").read_bytes()
    assert not _files_holding(work, [secret, secret.hex().encode(), marker.encode()], {work / "secret"})

    _run([sys.executable, "-m", "autograder", "grade", str(work / "submitted"), "--work", str(work),
          "--lessons", LESSON], cwd=ROOT, env=instructor, timeout=400)
    with open(work / "grades.csv") as handle:
        rows = {r["student"]: (r["score"], r["max_score"], r["status"]) for r in csv.DictReader(handle)}
    assert rows == {alice.name: ("4.0", "4.0", "ok"), bob.name: ("2.0", "4.0", "ok"),
                    carol.name: ("4.0", "4.0", "ok")}
    assert not _files_holding(work, [secret, secret.hex().encode(), marker.encode()], {work / "secret"})


def _collect_in_process(work: Path, exchange: Path, monkeypatch, *, stock: bool = False, student: str = "",
                        **settings) -> Path:
    """Run collect as the repository's nbgrader_config.py configures it (or nbgrader's own collect class, with
    ``stock``), into ``work``; returns its submitted folder."""
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.exchange.default.collect import ExchangeCollect
    from traitlets.config import Config

    from autograder.grading.pipeline import tools_config

    monkeypatch.setenv("DECODER_COURSE_WORK", str(work))
    monkeypatch.setenv("NBGRADER_EXCHANGE_ROOT", str(exchange))
    config = tools_config(Config())
    for name, value in settings.items():
        setattr(config.CourseExchangeCollect, name, value)
    collect_class = ExchangeCollect if stock else config.ExchangeFactory.collect
    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id, coursedir.student_id = LESSON, student
    work.mkdir(parents=True, exist_ok=True)
    collect = collect_class(coursedir=coursedir, authenticator=Authenticator(config=config), config=config,
                            log=logging.getLogger("autograder.tests.collect"))
    collect.start()
    return work / "submitted"


def test_collect_refuses_links_special_files_and_other_owners_in_every_form(classmates, shared, monkeypatch,
                                                                           caplog):
    """Each way a submission in the exchange may hold what its student's account did not submit, as its own
    inbound entry later than the student's honest one: each is set apart with its reason, the honest one is
    collected, nothing is read through a link, a FIFO does not stall collect, and a name that is not a student's
    writes nothing outside the submitted folder. A student id whose account is named otherwise is mapped in
    config (``CourseExchangeCollect.unix_users``)."""
    exchange, work, _ = _exchange(shared)
    alice, bob, _carol = (_Account(entry, exchange) for entry in classmates)
    inbound = _inbound(exchange)
    inbound.mkdir(parents=True)
    inbound.chmod(0o2733)  # as release_assignment makes it
    spare = shared / "spare"  # a file of alice's on the exchange's file system, to hard-link
    alice.sh('umask 022 && echo "alice spare" > "$1/notebook"', alice.folder(spare))
    secret = (work / "secret").read_bytes()

    def hand_in(student: _Account, name: str, notebook: bytes) -> None:
        """A submission folder as nbgrader's submit leaves it: files 0644, the folder 0777."""
        student.sh('mkdir "$1" && cd "$1" && cat > "$2" && echo "$3" > timestamp.txt && chmod 644 * && '
                   'chmod 777 "$1"', inbound / name, f"{LESSON}.ipynb", name.split("+")[2], stdin=notebook)

    honest = {"alice": nbformat.writes(samples.perfect(LESSON)).encode(), "ada": b'{"ada": "honest"}'}
    hand_in(alice, f"{alice.name}+{LESSON}+{_stamp(-60)}+honest", honest["alice"])
    hand_in(alice, f"ada+{LESSON}+{_stamp(-60)}+honest", honest["ada"])
    bad = b'{"bad": "a later, refused submission"}'
    attacks = {  # suffix -> (who, the student id it claims, a shell script on its folder $1, the reason)
        "forged": (bob, alice.name, "", f"it is owned by {bob.name}"),
        "forged-mapped": (bob, "ada", "", f"it is owned by {bob.name} (uid {bob.uid}), not by ada's account "
                                          f"{alice.name}"),
        "link-to-secret": (alice, alice.name, f'rm "$1/{LESSON}.ipynb" && ln -s "$2" "$1/{LESSON}.ipynb"',
                           f": {LESSON}.ipynb is a symbolic link"),
        "deep-link": (alice, alice.name, 'mkdir -m 755 "$1/a" "$1/a/b" && ln -s "$2" "$1/a/b/notes.txt"',
                      ": a/b/notes.txt is a symbolic link"),
        "link-to-folder": (alice, alice.name, 'ln -s /etc "$1/etc"', ": etc is a symbolic link"),
        "hard-link": (alice, alice.name, 'ln "$3/notebook" "$1/extra.txt"', ": extra.txt is a hard link (2 names)"),
        "fifo": (alice, alice.name, 'mkfifo -m 644 "$1/pipe"', ": pipe is a FIFO"),
        "deep": (alice, alice.name, 'cd "$1" && mkdir -p "$(printf "d/%.0s" $(seq 40))"', "folders deep"),
        "writable": (alice, alice.name, f'chmod 666 "$1/{LESSON}.ipynb"',
                     "is writable by other accounts (mode 0666)"),
        "classmate-inside": (alice, alice.name, None, f"extra is owned by {bob.name}"),
        "no-account": (bob, f"nobody-{secrets.token_hex(3)}", "", "there is no unix account"),
        "not-an-id": (bob, "\x1b[2Jx", "", "'\\x1b[2Jx' is not a student id"),
    }
    for offset, (suffix, (who, claimed, script, _)) in enumerate(attacks.items()):
        name = f"{claimed}+{LESSON}+{_stamp(offset)}+{suffix}"
        hand_in(who, name, bad)
        if script:
            who.sh(script, inbound / name, work / "secret", spare)
        elif script is None:  # alice's folder is writable by everyone: bob adds to it
            bob.sh('mkdir -m 755 "$1/extra" && echo bob > "$1/extra/notes.txt" && chmod 644 "$1/extra/notes.txt"',
                   inbound / name)
    # Entries that are no submission at all: a file in alice's name, a link to alice's honest folder, a name with
    # no time in it.
    alice.sh('echo not a folder > "$1"', inbound / f"{alice.name}+{LESSON}+{_stamp(30)}+file")
    bob.sh('ln -s "$1" "$2"', inbound / f"{alice.name}+{LESSON}+{_stamp(-60)}+honest",
           inbound / f"{alice.name}+{LESSON}+{_stamp(31)}+link")
    bob.sh('mkdir "$1"', inbound / f"{alice.name}+{LESSON}+yesterday+noon")
    attacks["file"] = (alice, alice.name, "", "it is a file, not a folder")
    attacks["link"] = (bob, alice.name, "", "it is a symbolic link")
    attacks["noon"] = (bob, alice.name, "", "it is not a submission's name ({student_id}+01-masks+{time}): not a "
                                            "time as nbgrader writes it")

    caplog.set_level(logging.WARNING)
    submitted = _collect_in_process(work, exchange, monkeypatch, unix_users={"ada": alice.name})
    assert sorted(p.name for p in work.iterdir()) == ["exchange", "gradebook.db", "secret", "set_apart", "submitted"]
    assert sorted(p.name for p in submitted.iterdir()) == sorted([alice.name, "ada"])
    for student, notebook in (("ada", honest["ada"]), (alice.name, honest["alice"])):
        assert (submitted / student / LESSON / f"{LESSON}.ipynb").read_bytes() == notebook
    set_apart = _set_apart(work)
    problems = []
    for suffix, (*_, reason) in attacks.items():
        [entry] = [name for name in set_apart if name.endswith(f"+{suffix}")] or [None]
        if entry is None:
            problems.append(f"{suffix}: not set apart")
        elif reason not in set_apart[entry] or not any(f"Set apart {entry}: " in r.message and reason in r.message
                                                       for r in caplog.records):
            problems.append(f"{suffix}: no {reason!r} in\n{set_apart[entry]}")
    assert not problems, "\n".join(problems)
    assert len(set_apart) == len(attacks)
    assert not _files_holding(work, [secret, b"alice spare", bad], {work / "secret"})
    shown_to_instructor = [r.getMessage() for r in caplog.records] + list(set_apart.values())
    assert not [text for text in shown_to_instructor if "\x1b" in text]  # the ids are the attacker's text


def test_collect_checks_again_as_it_copies(classmates, shared, monkeypatch, caplog):
    """A submission changed between collect's check and its copy (here: the check is skipped, and the notebook is a
    link to the course's secret) is refused by the copy itself, which reads from descriptors it checked: nothing is
    collected for that student, nothing of the secret is copied, no staging folder is left, and the message says to
    collect again."""
    from autograder.intake.exchange import CourseExchangeCollect

    exchange, work, _ = _exchange(shared)
    alice = _Account(classmates[0], exchange)
    inbound = _inbound(exchange)
    inbound.mkdir(parents=True)
    inbound.chmod(0o2733)
    name = f"{alice.name}+{LESSON}+{_stamp()}+swapped"
    alice.sh('mkdir "$1" && ln -s "$2" "$1/$3" && chmod 777 "$1"', inbound / name, work / "secret", f"{LESSON}.ipynb")
    monkeypatch.setattr(CourseExchangeCollect, "_examine", lambda self, record: None)
    caplog.set_level(logging.WARNING)
    submitted = _collect_in_process(work, exchange, monkeypatch)
    assert list(submitted.iterdir()) == []
    assert not _files_holding(work, [(work / "secret").read_bytes()], {work / "secret"})
    text = _set_apart(work)[name]
    assert f"why: {LESSON}.ipynb is a symbolic link" in text and "changed after it was checked" in text
    assert any(f"Set apart {name}: {LESSON}.ipynb is a symbolic link" in r.message and "run collect again" in r.message
               for r in caplog.records)


def test_collect_refuses_an_inbound_folder_a_student_owns(classmates, shared, monkeypatch):
    """A course folder in the exchange that a student created or put in place of the instructor's (an exchange
    root without its sticky bit lets them rename it): collect stops and says what to do, and collects nothing."""
    from nbgrader.exchange import ExchangeError

    exchange, work, _ = _exchange(shared)
    bob = _Account(classmates[1], exchange)
    inbound = _inbound(exchange)
    inbound.mkdir(parents=True)
    inbound.chmod(0o2733)
    os.chown(inbound, bob.uid, -1)
    bob.sh('mkdir "$1" && chmod 777 "$1"', inbound / f"{bob.name}+{LESSON}+{_stamp()}+x")
    with pytest.raises(ExchangeError, match="inbound is owned by"):
        _collect_in_process(work, exchange, monkeypatch)
    assert not (work / "submitted").exists()


def test_collect_dates_a_submission_no_earlier_than_the_exchange_saw_it_change(classmates, shared, monkeypatch,
                                                                              caplog, tmp_path):
    """The collected ``timestamp.txt`` (what autograde dates a submission by, autograder.term.schedule's rule):
    nbgrader's
    time when the submission last changed within ``SUBMIT_SLACK`` of it (kept as written); else the newest
    ``ctime`` of the folder and its files, which no student can set back. Variants: an honest submission (kept to
    the microsecond); a forged name and ``timestamp.txt`` two days early; an honest name with ``timestamp.txt``
    rewritten three hours early; no ``timestamp.txt`` and a name a day early; a ``timestamp.txt`` that is a folder
    (the name's time, dated by the change); one in the year 9999 (later is the student's own loss).

    Then the collected tree is graded with a term whose due date was two hours ago (alice has an extension): every
    forgery that claimed to be on time loses a day's 10%, in grades.csv and in the gradebook; alice loses nothing,
    and the year-9999 notebook scores zero."""
    from nbgrader.utils import parse_utc

    from autograder.intake.exchange import SUBMIT_SLACK

    exchange, work, _ = _exchange(shared)
    alice, bob, carol = (_Account(entry, exchange) for entry in classmates)
    inbound = _inbound(exchange)
    inbound.mkdir(parents=True)
    inbound.chmod(0o2733)
    notebook = nbformat.writes(samples.perfect(LESSON)).encode()
    started = datetime.datetime.now(datetime.UTC)
    submissions = {  # student id -> (account, the name's time, timestamp.txt's or None, kept as written)
        alice.name: (alice, _stamp(-5), _stamp(-5), True),
        bob.name: (bob, _stamp(-2 * 86400), _stamp(-2 * 86400), False),
        carol.name: (carol, _stamp(-1), _stamp(-3 * 3600), False),
        "ada": (alice, _stamp(-86400), None, False),
        "eve": (bob, _stamp(-3600), "a folder", False),
        "fay": (carol, _stamp(-2), "9999-12-31 23:59:59.000000 UTC", True),
    }
    for student, (account, named, written, _) in submissions.items():
        folder = inbound / f"{student}+{LESSON}+{named}+x"
        account.sh('mkdir "$1" && cd "$1" && cat > "$2" && chmod 644 "$2"', folder, f"{LESSON}.ipynb",
                   stdin=notebook)
        if written == "a folder":
            account.sh('mkdir -m 755 "$1/timestamp.txt"', folder)
        elif written is not None:
            account.sh('cd "$1" && printf %s "$2" > timestamp.txt && chmod 644 timestamp.txt', folder, written)
        account.sh('chmod 777 "$1"', folder)
    caplog.set_level(logging.WARNING)
    submitted = _collect_in_process(work, exchange, monkeypatch,
                                    unix_users={"ada": alice.name, "eve": bob.name, "fay": carol.name})
    finished = datetime.datetime.now(datetime.UTC)
    assert sorted(p.name for p in submitted.iterdir()) == sorted(submissions)
    for student, (_, named, written, kept) in submissions.items():
        text = (submitted / student / LESSON / "timestamp.txt").read_text()
        when = parse_utc(text).replace(tzinfo=datetime.UTC)
        if kept:
            assert text == written
        else:
            assert started - datetime.timedelta(seconds=1) <= when <= finished, (student, text)
            claimed = named if written in (None, "a folder") else written
            assert when - parse_utc(claimed).replace(tzinfo=datetime.UTC) > SUBMIT_SLACK
            assert any(f"{student}+{LESSON}+" in r.message and "last changed at" in r.message for r in caplog.records)
    for student in (alice.name, "fay"):
        assert not any(f"{student}+{LESSON}+" in r.message and "last changed" in r.message for r in caplog.records)

    from nbgrader.api import Gradebook

    due = started - datetime.timedelta(hours=2)
    term_file = tmp_path / "term.toml"
    term_file.write_text(f'[late]\ngrace_minutes = 10\npercent_per_day = 10\nmax_percent = 50\ncutoff_days = 7\n'
                         f'[lessons]\n"{LESSON}" = {{ due = {due.strftime("%Y-%m-%dT%H:%M:%SZ")} }}\n'
                         f'[extensions]\n"{alice.name}" = {{ "{LESSON}" = 1 }}\n')
    grade_class.grade(submitted, work, [LESSON], term_file=term_file)
    with open(work / "grades.csv") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    percent = {student: 0 if student == alice.name else 100 if student == "fay" else 10 for student in submissions}
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}") as gb:
        for student, row in rows.items():
            raw = float(row["raw_score"])
            assert raw == float(row["max_score"]) > 0 and row["status"] == "ok", row
            assert float(row["late_penalty"]) == pytest.approx(raw * percent[student] / 100), row
            assert float(row["score"]) == pytest.approx(raw - float(row["late_penalty"]))
            notebook = gb.find_submission_notebook(LESSON, LESSON, student)
            assert (notebook.late_submission_penalty or 0) == pytest.approx(float(row["late_penalty"]))
            assert gb.find_submission(LESSON, student).timestamp == parse_utc(
                (submitted / student / LESSON / "timestamp.txt").read_text())
    assert sorted(rows) == sorted(submissions)


@pytest.mark.parametrize("student,chosen", [("alice", "on time"), ("bob", "extended"), ("carol", "on time")])
def test_collect_before_duedate_takes_each_students_own_due_date_from_the_term(tmp_path, monkeypatch, student,
                                                                                chosen):
    """``nbgrader collect --before-duedate`` with a term: the latest submission before the student's own due date
    (bob's extension moves his), not the gradebook's one date for everybody."""
    from datetime import UTC, datetime, timedelta

    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    from autograder.grading.pipeline import tools_config
    from autograder.intake.exchange import CourseExchangeCollect

    due = datetime(2027, 1, 18, 12, tzinfo=UTC)
    term_file = tmp_path / "term.toml"
    term_file.write_text(f'[late]\npercent_per_day = 10\ncutoff_days = 7\n[lessons]\n"{LESSON}" = {{ due = '
                         f'{due:%Y-%m-%dT%H:%M:%S}Z }}\n[extensions]\nbob = {{ "{LESSON}" = 2 }}\n')
    monkeypatch.setenv("DECODER_COURSE_WORK", str(tmp_path / "work"))
    monkeypatch.setenv("DECODER_COURSE_TERM", str(term_file))
    config = tools_config(Config())
    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id = LESSON
    collect = CourseExchangeCollect(coursedir=coursedir, authenticator=Authenticator(config=config), config=config)
    collect.before_duedate, collect.duedate = True, None  # the gradebook has no due date: the term decides
    naive = due.replace(tzinfo=None)
    records = [{"username": student, "filename": name, "timestamp": naive + offset} for name, offset in
               (("on time", -timedelta(hours=1)), ("extended", timedelta(days=1)),
                ("too late", timedelta(days=3)))]
    assert collect._in_order(records)[0]["filename"] == chosen


# -- one submission never stops the class ------------------------------------------------------------------------

def _inbound_ready(exchange: Path) -> Path:
    inbound = _inbound(exchange)
    inbound.mkdir(parents=True)
    inbound.chmod(0o2733)  # as release_assignment makes it
    return inbound


def _submit_folder(account: _Account, folder: Path, notebook: bytes, timestamp: bytes | None = None,
                   script: str = "") -> None:
    """A submission as nbgrader's submit leaves it (files 0644, the folder 0777), ``folder`` given as bytes or text
    (``$1``); ``timestamp`` the raw bytes of its timestamp.txt; ``script`` run in it before the chmod."""
    account.sh('mkdir "$1" && cd "$1" && cat > "$2" && chmod 644 "$2"', os.fsdecode(bytes(folder)),
               f"{LESSON}.ipynb", stdin=notebook)
    if timestamp is not None:
        account.sh('cat > "$1/timestamp.txt" && chmod 644 "$1/timestamp.txt"', os.fsdecode(bytes(folder)),
                   stdin=timestamp)
    if script:
        account.sh(f'cd "$1" && {script}', os.fsdecode(bytes(folder)))
    account.sh('chmod 777 "$1"', os.fsdecode(bytes(folder)))


def _notes(work: Path) -> dict[str, str]:
    """Every set-apart note (file name -> text); each must be UTF-8."""
    return {p.name: p.read_bytes().decode("utf-8") for p in sorted((work / "set_apart" / LESSON).iterdir())}


def test_one_submission_never_stops_the_class_collect(classmates, shared, monkeypatch, caplog):
    """The issue's attacks on collect, each from one student's own account, and more of their kind: a folder name
    whose time holds a ``..`` zone, a zone file name or another zone's abbreviation, a month 13; a name and a student
    id with undecodable bytes; a ``timestamp.txt`` holding a ``..`` zone, a path as its zone, undecodable bytes or
    100 kB; a file in a submission whose name is not UTF-8; a submission on which the check or the copy raises an
    error nobody expected. Collect runs to its end: each bad one is set apart with a note (UTF-8, the bytes shown
    escaped) or collected with a time of nbgrader's own format, and every honest submission is collected."""
    from autograder.intake import exchange as exchange_module

    exchange, work, _ = _exchange(shared)
    alice, bob, carol = (_Account(entry, exchange) for entry in classmates)
    inbound = _inbound_ready(exchange)
    notebook = nbformat.writes(samples.perfect(LESSON)).encode()
    lesson = LESSON.encode()
    stamp = _stamp(-3600).encode()
    later = _stamp(-60).encode()

    def name(student: str | bytes, when: bytes, suffix: bytes) -> Path:
        student = student if isinstance(student, bytes) else student.encode()
        return Path(os.fsdecode(bytes(inbound) + b"/" + b"+".join([student, lesson, when, suffix])))

    honest = {alice.name: alice, carol.name: carol}
    for student, account in honest.items():
        _submit_folder(account, name(student, stamp, b"honest"), notebook)
    set_apart = {  # the suffix of the folder's name -> (account, claimed id, its time, the reason in the note)
        b"dots-zone": (bob, bob.name, stamp[:19] + b" ..", "not a time as nbgrader writes it"),
        b"file-zone": (bob, bob.name, stamp[:19] + b" posixrules", "not a time as nbgrader writes it"),
        b"other-zone": (bob, bob.name, stamp[:19] + b" EST", "the time zone 'EST' is neither UTC"),
        b"month-13": (bob, bob.name, b"2027-13-01 00:00:00.000000 UTC", "month must be in 1..12"),
        b"bytes-\xff\xfe": (bob, bob.name, later, "its name is not UTF-8 text"),
        b"bytes-id": (bob, b"b\xffb", later, "its name is not UTF-8 text"),
        b"file-name": (alice, "hal", later, "has a name that is not UTF-8 text"),
        b"raises-in-check": (carol, "ivy", later, "collect could not read it (RuntimeError: boom in the check)"),
        b"raises-in-copy": (carol, "jan", later, "collect could not read it (RuntimeError: boom in the copy)"),
    }
    for suffix, (account, student, when, _) in set_apart.items():
        script = {b"file-name": "printf x > \"$(printf 'notes\\377.txt')\" && chmod 644 *",
                  b"raises-in-check": "echo boom > boom.txt && chmod 644 boom.txt",
                  b"raises-in-copy": "echo boom > boom.txt && chmod 644 boom.txt"}.get(suffix, "")
        _submit_folder(account, name(student, when, suffix), notebook, script=script)
    _submit_folder(alice, name("hal", stamp, b"honest"), notebook)  # hal's earlier one is collected instead
    collected = {  # student id -> (account, timestamp.txt's bytes): collected, dated by the name or the change
        bob.name: (bob, b"2027-01-25 10:00:00.000000 .."),
        "eve": (bob, b"2027-01-25 10:00:00 /etc/passwd"),
        "fay": (carol, b"\xff\xfe2027-01-25 10:00:00 UTC"),
        "gus": (alice, b"2" * 100_000),
    }
    for student, (account, timestamp) in collected.items():
        _submit_folder(account, name(student, stamp, b"odd-timestamp"), notebook, timestamp=timestamp)

    original = exchange_module._Walk.file

    def file(self, fd, st, shown_path, file_name, target):
        if file_name == "boom.txt" and self.expected.startswith("ivy"):
            raise RuntimeError("boom in the check")
        if file_name == "boom.txt" and self.expected.startswith("jan") and target is not None:
            raise RuntimeError("boom in the copy")
        return original(self, fd, st, shown_path, file_name, target)

    monkeypatch.setattr(exchange_module._Walk, "file", file)
    caplog.set_level(logging.WARNING)
    accounts = {"eve": bob.name, "fay": carol.name, "gus": alice.name, "hal": alice.name, "ivy": carol.name,
                "jan": carol.name}
    submitted = _collect_in_process(work, exchange, monkeypatch, unix_users=accounts)

    assert sorted(p.name for p in submitted.iterdir()) == sorted([*honest, *collected, "hal"])
    for student in submitted.iterdir():
        folder = student / LESSON
        assert (folder / f"{LESSON}.ipynb").read_bytes() == notebook
        text = (folder / "timestamp.txt").read_text()
        from autograder.term.schedule import parse_timestamp
        parse_timestamp(text)  # nbgrader's own format, which autograde reads
    notes = _notes(work)
    problems = []
    for suffix, (*_, reason) in set_apart.items():
        shown_suffix = suffix.decode("utf-8", "backslashreplace")
        found = [text for note, text in notes.items() if f"+{shown_suffix}\n" in text]
        if len(found) != 1 or reason not in found[0]:
            problems.append(f"{shown_suffix}: {reason!r} not in {found}")
    assert not problems, "\n".join(problems) + "\n" + "\n".join(notes)
    assert len(notes) == len(set_apart)
    shown_to_instructor = [r.getMessage() for r in caplog.records] + list(notes.values())
    assert not [text for text in shown_to_instructor if re.search("[\ud800-\udfff\x1b]", text)]


def test_collect_reads_listings_within_their_caps(classmates, shared, monkeypatch, caplog):
    """A listing is cut while it is read, never read whole and then cut. In a submission: a folder of many hard
    links to one file (the issue's 600,000, here 1,000 against a cap of 100), of many files, of many folders, ten
    nested folders of 60 files each: no listing yields more than the cap, and each is set apart for its size. In the
    inbound folder: 100 forgeries in alice's name, later than hers, and 12 of her own submissions (the latest
    honest) against caps of 5 own and 20 others: her latest is collected, 20 forgeries get a note, the rest are
    counted in one (the log names every submission set apart)."""
    from autograder.intake import exchange as exchange_module

    monkeypatch.setattr(exchange_module, "_MAX_ENTRIES", 100)
    monkeypatch.setattr(exchange_module, "_MAX_OWN", 5)
    monkeypatch.setattr(exchange_module, "_MAX_NOTES", 20)
    exchange, work, _ = _exchange(shared)
    alice, bob, carol = (_Account(entry, exchange) for entry in classmates)
    inbound = _inbound_ready(exchange)
    notebook = nbformat.writes(samples.perfect(LESSON)).encode()
    big = {"links": 'for i in $(seq 1000); do ln "$1/$2" "$1/l$i"; done',
           "files": 'for i in $(seq 1000); do : > "$1/f$i"; done',
           "folders": 'for i in $(seq 1000); do mkdir "$1/d$i"; done',
           "nested": 'p="$1"; for d in $(seq 10); do p="$p/n$d"; mkdir "$p"; '
                     'for i in $(seq 60); do : > "$p/f$i"; done; done'}
    for number, (kind, script) in enumerate(big.items()):
        folder = inbound / f"{carol.name}+{LESSON}+{_stamp(number)}+{kind}"
        _submit_folder(carol, folder, notebook)
        carol.sh(script, folder, f"{LESSON}.ipynb")
    _submit_folder(carol, inbound / f"{carol.name}+{LESSON}+{_stamp(-600)}+honest", notebook)
    for number in range(12):
        _submit_folder(alice, inbound / f"{alice.name}+{LESSON}+{_stamp(-600 + number)}+own{number}",
                       b'{"own": %d}' % number)
    bob.sh('cd "$1" && for i in $(seq 100); do mkdir "$2+$3+$(date -u -d "+$i min" "+%Y-%m-%d %H:%M:%S.%6N UTC")'
           '+forged$i"; done', inbound, alice.name, LESSON)

    most = []
    scandir = os.scandir

    class Counted:
        def __init__(self, path):
            self.listing, self.read, self.in_submission = scandir(path), 0, isinstance(path, int)
            most.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.listing.close()

        def __iter__(self):
            for entry in self.listing:
                self.read += 1
                yield entry

    monkeypatch.setattr(exchange_module.os, "scandir", Counted)
    caplog.set_level(logging.WARNING)
    submitted = _collect_in_process(work, exchange, monkeypatch)
    monkeypatch.undo()
    assert sorted(p.name for p in submitted.iterdir()) == sorted([alice.name, carol.name])
    assert (submitted / alice.name / LESSON / f"{LESSON}.ipynb").read_bytes() == b'{"own": 11}'
    assert (submitted / carol.name / LESSON / f"{LESSON}.ipynb").read_bytes() == notebook
    folder_reads = [c.read for c in most if c.in_submission]  # (the inbound is read whole, its records bounded)
    assert folder_reads and max(folder_reads) == 101, sorted(folder_reads)[-5:]
    for kind in big:  # in the log: the 20 notes went to alice's forgeries, read first
        assert any(f"+{kind}: the submission holds more than 100 files and folders" in r.getMessage()
                   for r in caplog.records), kind
    notes = _notes(work)
    assert len(notes) == 20 + 1 and len([text for text in notes.values() if "+forged" in text]) == 20
    counted = notes["_more_entries.txt"]
    assert counted.startswith(f"{80 + 12 - 5} entries of {LESSON}") and "collect again" in counted
    assert any("were not examined" in r.getMessage() for r in caplog.records)


def test_collect_dates_what_changed_while_it_copied(classmates, shared, monkeypatch, caplog):
    """A submission written to while collect copies it: the copy checks each file's size and ``ctime`` after
    reading it, and each folder's after listing it, and copies afresh, so the collected submission holds the change
    and is dated by it, never before it. Variants: the notebook grows (alice), is rewritten in place to the same
    size (bob), a file is added beside it (carol); one written to at every copy is set apart after three (ada);
    one whose notebook is swapped for a classmate's file is refused by the copy's own owner check (eve)."""
    import time
    import types

    from autograder.intake import exchange as exchange_module
    from autograder.term.schedule import parse_timestamp

    exchange, work, _ = _exchange(shared)
    alice, bob, carol = (_Account(entry, exchange) for entry in classmates)
    inbound = _inbound_ready(exchange)
    owners = {alice.name: alice, bob.name: bob, carol.name: carol, "ada": alice, "eve": bob}
    folders = {}
    for student, account in owners.items():
        folders[student] = inbound / f"{student}+{LESSON}+{_stamp(-3600)}+x"
        _submit_folder(account, folders[student], b'{"v": 1}')
    time.sleep(1.2)  # every ctime so far is a second older than any edit
    edits: dict[str, list] = {student: [] for student in owners}  # student -> the times of its edits

    def notebook_of(fd: int) -> str | None:
        st = os.fstat(fd)
        for student, folder in folders.items():
            path = folder / f"{LESSON}.ipynb"
            with contextlib.suppress(OSError):
                if (os.stat(path).st_dev, os.stat(path).st_ino) == (st.st_dev, st.st_ino):
                    return student
        return None

    def edit(student: str) -> None:
        path = folders[student] / f"{LESSON}.ipynb"
        time.sleep(0.02)  # a clock tick later than the copy's first look
        edits[student].append(datetime.datetime.now(datetime.UTC))
        if student == alice.name:
            path.write_bytes(b'{"v": 1, "more": "grown"}')
        elif student in (bob.name, "ada"):
            with open(path, "r+b") as handle:
                handle.write(b'{"v": %d}' % (len(edits[student]) + 1))
        elif student == carol.name:
            (folders[student] / "extra.txt").write_bytes(b"added")
            os.chown(folders[student] / "extra.txt", carol.uid, -1)
            os.chmod(folders[student] / "extra.txt", 0o644)
        else:  # eve's notebook replaced by a file of carol's
            swap = folders[student] / ".swap"
            swap.write_bytes(b'{"v": "carol"}')
            os.chown(swap, carol.uid, -1)
            os.chmod(swap, 0o644)
            os.replace(swap, path)

    def read(fd: int, size: int) -> bytes:
        student = notebook_of(fd)
        if student is not None and (student == "ada" or not edits[student]):
            edit(student)
        return os.read(fd, size)

    watched_os = types.SimpleNamespace(**{name: getattr(os, name) for name in dir(os) if not name.startswith("__")})
    watched_os.read = read
    monkeypatch.setattr(exchange_module, "os", watched_os)
    caplog.set_level(logging.WARNING)
    submitted = _collect_in_process(work, exchange, monkeypatch, unix_users={"ada": alice.name, "eve": bob.name})
    monkeypatch.undo()

    assert sorted(p.name for p in submitted.iterdir()) == sorted([alice.name, bob.name, carol.name])
    holds = {alice.name: b'{"v": 1, "more": "grown"}', bob.name: b'{"v": 2}', carol.name: b'{"v": 1}'}
    for student, notebook in holds.items():
        folder = submitted / student / LESSON
        assert (folder / f"{LESSON}.ipynb").read_bytes() == notebook, student
        when = parse_timestamp((folder / "timestamp.txt").read_text())
        assert when >= edits[student][0] - datetime.timedelta(milliseconds=50), (student, when, edits[student])
    assert (submitted / carol.name / LESSON / "extra.txt").read_bytes() == b"added"
    notes = _notes(work)
    [ada] = [text for text in notes.values() if "claims to be: ada's" in text]
    assert "changed while it was being collected, 3 copies in a row" in ada and "kept changing" in ada
    assert len(edits["ada"]) >= 3  # written to at every read of it
    [eve] = [text for text in notes.values() if "claims to be: eve's" in text]
    assert f"is owned by {carol.name}" in eve and "changed after it was checked" in eve
    assert len(notes) == 2
