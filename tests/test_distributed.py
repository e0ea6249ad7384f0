"""Grading on a Dask cluster (issues 13, 32): a worker killed mid-run loses nothing, a worker that cannot grade is
named with its fix while the others grade, and the scores are local grading's.

A Dask scheduler and three workers run as separate processes on 127.0.0.1 (Dask's own ``dask scheduler`` and
``dask worker`` commands, one thread each). Two are plain ``dask worker`` commands of the course's venv, started
in a folder of their own without ``PYTHONPATH``: they find the grading code as a Dask user's worker would, through
the venv (``./course setup``'s path file). The third cannot import it (its ``sys.path`` lacks the checkout): it is
named in a warning with its fix, and gets no notebook. A small class (3 students x 00-setup, 01-masks; each notebook
perfect, untouched or with typical mistakes; one with nbgrader's exchange files) is graded through
``grade_class.grade(..., scheduler=address)``. As soon as one worker runs a student's kernel (a ``bwrap`` among its
processes), its whole process group is killed with SIGKILL. Then: every notebook was graded exactly once (the
gradebook's rows), with the scores, gradebook rows, notes and feedback of local sequential grading of the same
submissions with the same secret, and nothing of the cluster is left running: no Dask process, no sandbox.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from nbgrader.api import Comment, Grade, Gradebook, SubmittedAssignment

from autograder.course import samples
from autograder.grading import cluster as distributed
from autograder.grading import grade_class, pipeline
from tests.conftest import ROOT

pytestmark = pytest.mark.pipeline

LESSONS = ["00-setup", "01-masks"]  # two quick NumPy lessons
STUDENTS = ["s0", "s1", "s2"]
MAKERS = (samples.perfect, samples.untouched, samples.typical_mistakes)
# Tight, as tests/test_adversarial.py's, with room for a loaded 2-core machine running two workers
LIMITS = pipeline.Limits(cell_timeout=20, interrupt_grace=2, deadline=60, cpu_seconds=60, memory_bytes=1536 << 20,
                         processes=64, file_bytes=16 << 20, tmpfs_bytes=32 << 20, scratch_bytes=48 << 20,
                         output_bytes=2 << 20, notebook_bytes=2 << 20)
TIMESTAMP = "2026-12-01 10:00:00.000000 UTC"  # nbgrader's exchange files beside s0's 01-masks
SUBMISSION_SECRET = "0123456789abcdef0123456789abcdef"
# A term both runs grade by: 01-masks long overdue (every late notebook capped at 50%), s0 extended past its
# timestamp (on time); 00-setup not in it (never late). The workers get it from their tasks, not their checkout.
TERM = f"""[late]
percent_per_day = 10
max_percent = 50
cutoff_days = 100000
[lessons]
"{LESSONS[1]}" = {{ due = 2026-01-01T00:00:00Z }}
[extensions]
s0 = {{ "{LESSONS[1]}" = 2026-12-02T00:00:00Z }}
"""
BIN = Path(sys.executable).parent
WITHOUT_CHECKOUT = """import sys
from pathlib import Path
root = Path(sys.argv.pop(1)).resolve()
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != root]
from distributed.cli.dask_worker import main
sys.argv[0] = "dask-worker"
main()
"""


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    incoming = root / "incoming"
    jobs = []
    for i, student in enumerate(STUDENTS):
        for j, lesson in enumerate(LESSONS):
            path = incoming / student / lesson / f"{lesson}.ipynb"
            path.parent.mkdir(parents=True)
            nbformat.write(MAKERS[(i + j) % len(MAKERS)](lesson), path)
            jobs.append((student, lesson, path))
    (incoming / "s0" / LESSONS[0] / "timestamp.txt").write_text(TIMESTAMP)
    (incoming / "s0" / LESSONS[0] / "submission_secret.txt").write_text(SUBMISSION_SECRET)
    pipeline.prepare(root / "base", LESSONS, limits=LIMITS)  # the secret both runs share
    (root / "term.toml").write_text(TERM)
    return {"root": root, "incoming": incoming, "jobs": jobs, "term": root / "term.toml"}


@pytest.fixture(scope="module")
def local(prepared):
    work = prepared["root"] / "local"
    shutil.copytree(prepared["root"] / "base", work)
    grader = pipeline.api(work, limits=LIMITS, term_file=prepared["term"])
    outcomes = [pipeline.grade_one(grader, work, None, *job) for job in prepared["jobs"]]
    return {"work": work, "outcomes": outcomes}


# -- the cluster ------------------------------------------------------------------------------------------------
class Cluster:
    """``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1, each in its own process group; every
    process they start (nannies, workers, sandboxes) is remembered, so that the test can say none survived."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.scheduler_file = folder / "scheduler.json"
        # no PYTHONPATH, and each process in a folder of its own: the venv alone must bring the grading code
        self.env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "OMP_NUM_THREADS": "1",
                    "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
        self.processes: dict[str, subprocess.Popen] = {}
        self.seen: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.folder / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        where = self.folder / name
        where.mkdir(exist_ok=True)
        self.processes[name] = subprocess.Popen(argv, cwd=where, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)
        log.close()

    def start(self) -> str:
        self._start("scheduler", [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                                  "--no-dashboard", "--scheduler-file", str(self.scheduler_file)])
        deadline = time.monotonic() + 60
        while not self.scheduler_file.exists():
            assert time.monotonic() < deadline, "no scheduler file: " + self.log("scheduler")
            assert self.processes["scheduler"].poll() is None, self.log("scheduler")
            time.sleep(0.2)
        time.sleep(0.2)  # written at once, but be sure it is complete
        address = json.loads(self.scheduler_file.read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:"), address
        options = ["--scheduler-file", str(self.scheduler_file), "--host", "127.0.0.1", "--nthreads", "1",
                   "--no-dashboard", "--death-timeout", "60"]
        for name in ("worker-a", "worker-b"):
            self._start(name, [str(BIN / "dask"), "worker", *options, "--nworkers", "1", "--name", name,
                               "--local-directory", str(self.folder / name)])
        # Dask's worker command in a process whose sys.path lacks the checkout (no nanny: the worker is this process)
        self._start("worker-c", [sys.executable, "-c", WITHOUT_CHECKOUT, str(ROOT), *options, "--no-nanny",
                                 "--name", "worker-c", "--local-directory", str(self.folder / "worker-c")])
        from distributed import Client

        with Client(address, timeout=60) as client:
            client.wait_for_workers(3, timeout=120)
            workers = client.scheduler_info(n_workers=-1)["workers"]
            self.addresses = {info["name"]: worker for worker, info in workers.items()}
        return address

    def log(self, name: str) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def tree(self, name: str) -> list[psutil.Process]:
        """The processes of ``name`` now (itself and its descendants), remembered in :attr:`seen`."""
        try:
            top = psutil.Process(self.processes[name].pid)
            found = [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        with self._lock:
            for process in found:
                self.seen.setdefault(process.pid, process)
        return found

    def kill(self, name: str) -> None:
        try:
            os.killpg(self.processes[name].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        for name in self.processes:
            self.tree(name)
        for process in self.processes.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 20
        for name, process in self.processes.items():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(name)
                process.wait(10)
        # what outlived its group (a sandbox is in a session of its own; it dies with its worker): gone by now?
        deadline = time.monotonic() + 20
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        for process in self.alive():
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass

    def alive(self) -> list[psutil.Process]:
        with self._lock:
            seen = list(self.seen.values())
        alive = []
        for process in seen:
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except psutil.NoSuchProcess:
                pass
        return alive


def _is_sandbox(process: psutil.Process) -> bool:
    """A student's kernel in its sandbox (not the worker's start-up probe of bubblewrap)."""
    try:
        return process.name() == "bwrap" and any("ipykernel" in part for part in process.cmdline())
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def on_cluster(prepared):
    root = prepared["root"]
    work = root / "cluster"
    shutil.copytree(root / "base", work)  # the same secret as the local run: the same hidden cases
    folder = root / "dask"
    folder.mkdir()
    cluster = Cluster(folder)
    killed: dict = {}
    stop = threading.Event()

    def watch():
        # kill worker-a once a student's kernel runs in it (a task is under way there); keep noting every process
        while not stop.is_set():
            for name in ("scheduler", "worker-b", "worker-c"):
                cluster.tree(name)
            if not killed:
                processes = cluster.tree("worker-a")
                sandboxes = [p for p in processes if _is_sandbox(p)]
                if sandboxes:
                    cluster.kill("worker-a")
                    killed.update(at=time.monotonic(), sandboxes=[p.pid for p in sandboxes],
                                  processes=[p.pid for p in processes])
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    warnings = _Warnings()
    logging.getLogger("autograder").addHandler(warnings)
    try:
        assert (Path(sysconfig.get_paths()["purelib"]) / "decoder-course-checkout.pth").read_text().strip() \
            == str(ROOT), "this venv does not find the grading code from another folder: run ./course setup"
        address = cluster.start()
        watcher.start()
        started = time.monotonic()
        outcomes = grade_class.grade(prepared["incoming"], work, LESSONS, limits=LIMITS, scheduler=address,
                                  term_file=prepared["term"])
        seconds = time.monotonic() - started
        stop.set()
        watcher.join(10)
        logs = {name: cluster.log(name) for name in cluster.processes}
    finally:
        logging.getLogger("autograder").removeHandler(warnings)
        stop.set()
        cluster.stop()
    print(f"\ngraded on the cluster in {seconds:.1f} s (canaries included); worker-a killed "
          f"{killed.get('at', started) - started:.1f} s in")
    for o in outcomes:
        print(f"  {o.student}/{o.lesson}: {o.score:g}/{o.max_score:g}{'' if o.ok else ' NOT GRADED: ' + o.message}")
    return {"work": work, "outcomes": outcomes, "killed": killed, "cluster": cluster, "logs": logs,
            "address": address, "warnings": warnings.messages}


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


# -- the checks -------------------------------------------------------------------------------------------------
def _url(work: Path) -> str:
    return f"sqlite:///{work / 'gradebook.db'}"


def gradebook_rows(work: Path) -> dict:
    """Every row grading writes, by key: submissions (timestamp), grades (auto score, manual score, needs manual
    grade), comments (auto comment)."""
    with Gradebook(_url(work), pipeline.COURSE_ID) as gb:
        return {
            "submissions": sorted((s.student.id, s.assignment.name, str(s.timestamp))
                                  for s in gb.db.query(SubmittedAssignment).all()),
            "grades": sorted((g.student.id, g.assignment.name, g.name, g.auto_score, g.manual_score,
                              g.needs_manual_grade) for g in gb.db.query(Grade).all()),
            "comments": sorted((c.student.id, c.assignment.name, c.name, c.auto_comment)
                               for c in gb.db.query(Comment).all()),
        }


def test_a_worker_was_killed_while_it_graded(on_cluster):
    killed = on_cluster["killed"]
    assert killed, "worker-a never ran a student's kernel: the test killed nothing\n" + on_cluster["logs"]["worker-a"]
    assert killed["sandboxes"]
    # that kernel's notebook could not come back from worker-a: every outcome is graded (the next tests), so it
    # was graded again by worker-b
    assert on_cluster["cluster"].processes["worker-a"].returncode == -signal.SIGKILL


def test_every_notebook_is_graded_exactly_once_with_local_scores(prepared, local, on_cluster):
    want = [(o.student, o.lesson, o.raw_score, o.max_score, o.ok, o.late_penalty, o.score, o.due)
            for o in local["outcomes"]]
    assert all(o.ok for o in local["outcomes"]), [o.message for o in local["outcomes"]]
    got = [(o.student, o.lesson, o.raw_score, o.max_score, o.ok, o.late_penalty, o.score, o.due)
           for o in on_cluster["outcomes"] if o.student != pipeline.CANARY]
    assert sorted(got) == sorted(want)
    assert len({(o.student, o.lesson) for o in on_cluster["outcomes"] if o.student != pipeline.CANARY}) == len(want)
    notes = {(o.student, o.lesson): o.notes for o in local["outcomes"]}
    assert {(o.student, o.lesson): o.notes for o in on_cluster["outcomes"] if o.student != pipeline.CANARY} == notes
    for student, lesson, score, top, _, penalty, final, _ in want:  # agreeing locally means something only if right
        kind = MAKERS[(STUDENTS.index(student) + LESSONS.index(lesson)) % len(MAKERS)]
        expected = {samples.perfect: score == top, samples.untouched: score == 0}.get(kind, 0 < score < top)
        assert top > 0 and expected, (student, lesson, kind.__name__, score, top)
        # the term, on both: 01-masks is late by most of a year (capped at 50%), but for s0's extension
        late = lesson == LESSONS[1] and student != "s0"
        assert penalty == pytest.approx(score / 2 if late else 0.0) and final == pytest.approx(score - penalty)
    assert any(penalty > 0 for *_, penalty, _, _ in want)


def test_the_gradebook_has_the_rows_of_local_grading_once_each(prepared, local, on_cluster):
    want, got = gradebook_rows(local["work"]), gradebook_rows(on_cluster["work"])
    assert got == want
    assert len(got["submissions"]) == len(STUDENTS) * len(LESSONS)
    with Gradebook(_url(on_cluster["work"]), pipeline.COURSE_ID) as gb:
        assert sorted(s.id for s in gb.students) == STUDENTS  # the canary has its own gradebook
        n_items = sum(len(gb.find_notebook(lesson, lesson).grade_cells) for lesson in LESSONS)
    assert len(got["grades"]) == n_items * len(STUDENTS)
    assert {score for *_, score, _, _ in got["grades"]} != {0.0}
    (stamp,) = [t for s, lesson, t in got["submissions"] if (s, lesson) == ("s0", LESSONS[0])]
    assert stamp.startswith("2026-12-01 10:00:00"), stamp


def _shown(cell) -> list[str]:
    """What a cell's outputs say (the kernel may split one stream into messages differently from run to run; a
    warning names the kernel's per-process folder, ipykernel_<pid>, and a forked kernel's pid is not always the
    same)."""
    text = "".join(out.get("text", "") for out in cell.get("outputs", []) if out.get("output_type") == "stream")
    text = re.sub(r"/ipykernel_\d+/", "/ipykernel_<pid>/", text)
    return [text] + [out.get("ename", "") for out in cell.get("outputs", []) if out.get("output_type") == "error"]


def test_autograded_notebooks_and_feedback_come_back_into_the_work_folder(prepared, local, on_cluster):
    work = on_cluster["work"]
    for student, lesson, _ in prepared["jobs"]:
        for tree in ("autograded", "feedback"):
            here = sorted(p.name for p in (work / tree / student / lesson).iterdir())
            there = sorted(p.name for p in (local["work"] / tree / student / lesson).iterdir())
            assert here == there, (tree, student, lesson)
        assert (work / "feedback" / student / lesson / f"{lesson}.html").stat().st_size > 1000
        ours = nbformat.read(work / "autograded" / student / lesson / f"{lesson}.ipynb", as_version=4)
        theirs = nbformat.read(local["work"] / "autograded" / student / lesson / f"{lesson}.ipynb", as_version=4)
        assert [_shown(c) for c in ours.cells] == [_shown(c) for c in theirs.cells]
    side = work / "feedback" / "s0" / LESSONS[0]
    assert (side / "timestamp.txt").read_text().strip() == TIMESTAMP
    assert (work / "autograded" / "s0" / LESSONS[0] / "submission_secret.txt").read_text().strip() \
        == SUBMISSION_SECRET
    rows = (work / "grades.csv").read_text().splitlines()
    assert len(rows) == 1 + len(prepared["jobs"])


def test_nothing_of_the_cluster_is_left_running(on_cluster):
    cluster = on_cluster["cluster"]
    assert all(p.poll() is not None for p in cluster.processes.values())
    assert len(cluster.seen) >= 5  # scheduler, two worker commands and their worker processes, a sandbox
    assert any(_is_sandbox(p) or p.pid in on_cluster["killed"]["sandboxes"] for p in cluster.seen.values())
    assert cluster.alive() == [], [p.pid for p in cluster.alive()]
    folder = str(cluster.folder)
    for process in psutil.process_iter(["cmdline"]):
        assert not any(folder in part for part in process.info["cmdline"] or []), process


def test_a_worker_that_cannot_grade_is_named_with_its_fix_and_gets_no_notebook(on_cluster):
    address = on_cluster["cluster"].addresses["worker-c"]
    named = [m for m in on_cluster["warnings"] if "cannot grade" in m]
    assert len(named) == 1, on_cluster["warnings"]  # checked once, named once
    assert address in named[0] and "No module named 'autograder'" in named[0] and "./course worker" in named[0]
    assert "\n" not in named[0]
    # the others graded everything (the tests above); it ran nothing: no grading folder was ever made in it
    assert not list((on_cluster["cluster"].folder / "worker-c").rglob("course-grading-*"))
    for name in ("worker-a", "worker-b"):
        assert on_cluster["cluster"].addresses[name] not in " ".join(named)


class _FakeClient:
    """What :class:`distributed._Workers` asks of a Dask client: the workers there now, and a function run on some."""

    def __init__(self, answers: dict):
        self.answers, self.present, self.asked = answers, list(answers), []

    def nthreads(self):
        return dict.fromkeys(self.present, 1)

    def run(self, fn, *args, workers, on_error):
        self.asked.append(sorted(workers))
        return {address: self.answers[address] for address in workers}


def test_each_worker_is_checked_once_when_first_seen_and_one_that_cannot_grade_is_left_out(caplog):
    from distributed.comm import CommClosedError

    client = _FakeClient({"tcp://a:1": "", "tcp://b:1": ModuleNotFoundError("No module named 'autograder'"),
                          "tcp://gone:1": CommClosedError("left")})
    workers = distributed._Workers(client, LESSONS, "f" * 16, True)
    with caplog.at_level("WARNING", logger="autograder"):
        assert workers.usable() == ["tcp://a:1"]
        client.present.remove("tcp://gone:1")  # it left while it was asked: it was not given anything
        assert workers.usable() == ["tcp://a:1"]  # nothing new: nothing run again
        client.answers["tcp://c:1"] = "its checkout grades 00-setup differently from the instructor's (fingerprint)"
        client.answers["tcp://d:1"] = ""
        client.present += ["tcp://c:1", "tcp://d:1"]  # two join during the run
        assert workers.usable() == ["tcp://a:1", "tcp://d:1"]
    assert client.asked == [["tcp://a:1", "tcp://b:1", "tcp://gone:1"], ["tcp://c:1", "tcp://d:1"]]
    named = [r.getMessage() for r in caplog.records if "cannot grade" in r.getMessage()]
    assert len(named) == 2 and "tcp://b:1" in named[0] and "./course worker" in named[0]
    assert "tcp://c:1" in named[1] and "git pull" in named[1]
    assert "tcp://b:1" in workers.problems() and "tcp://a:1" not in workers.problems()


@pytest.mark.parametrize(("why", "fix"), [
    ("ModuleNotFoundError: No module named 'autograder'", "./course worker"),
    ("ImportError: cannot import name 'grade_one' from 'autograder.grading.pipeline'", "./course worker"),
    ("its checkout grades 01-masks differently from the instructor's (fingerprint)", "git pull"),
    ("bubblewrap (bwrap) is missing: grading runs student code inside it", "install bubblewrap"),
    ("OSError: [Errno 28] No space left on device", "./course setup"),
])
def test_each_kind_of_unusable_worker_gets_a_one_line_fix(why, fix):
    said = distributed.fix_for(why)
    assert fix in said and "\n" not in said


def test_the_secret_is_nowhere_on_the_workers(prepared, on_cluster):
    secret = (prepared["root"] / "base" / "secret").read_bytes()
    for path in on_cluster["cluster"].folder.rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), path


def test_a_worker_with_another_checkout_refuses_the_task(prepared):
    lesson = LESSONS[0]
    files = {f"{lesson}.ipynb": nbformat.writes(samples.perfect(lesson)).encode()}
    result = distributed.grade_remote({"student": "s9", "lesson": lesson, "files": files, "secret": b"x" * 32,
                                       "fingerprint": "0" * 16, "sandbox": True, "limits": {}, "verbose": False})
    outcome = pipeline.Outcome(**result["outcome"])
    assert not outcome.ok and "update its checkout" in outcome.message
    assert distributed.fingerprint([lesson]) == distributed.fingerprint([lesson])
    assert distributed.fingerprint([lesson]) != distributed.fingerprint(LESSONS)


def test_an_unreachable_scheduler_is_an_error_that_says_so_before_the_canaries(prepared, tmp_path, monkeypatch):
    work = tmp_path / "work"
    monkeypatch.setattr(distributed, "CONNECT_TIMEOUT", 2)
    with pytest.raises(distributed.ClusterUnavailable, match="cannot reach the Dask scheduler"):
        grade_class.grade(prepared["incoming"], work, LESSONS, limits=LIMITS, scheduler="tcp://127.0.0.1:9")
    assert not pipeline.canary_work(work).exists()
