"""Grading that a student's code cannot fool or break: the sandbox, isolation, bad input, and what feedback shows.

One grading run (module fixture) of lesson 01-masks with tight limits grades honest controls (graded first, in
the middle and last), every attack in ``tests/adversarial/`` (each is the source of one exercise cell, put into
the perfect submission in place of that exercise) and the bad inputs built below. For every submission the tests
read the gradebook, the notes and the log. The first tests exercise the sandbox directly, without a kernel.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import html
import json
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbgrader.api import Gradebook

from autograder.course import lessons, notebooks, samples
from autograder.course.reference import masks as ref
from autograder.grading import grade_class, pipeline
from autograder.intake import submissions as intake
from autograder.judge import policy, verdicts
from autograder.judge.preprocessors import HIDDEN_BEGIN
from autograder.sandbox import launch as sandbox
from autograder.sandbox import uids as sandbox_uids
from tests.conftest import ROOT

LESSON = "01-masks"
ITEMS = ("causal_mask", "padding_mask", "combine_masks", "mask_to_bias")
ATTACKS_DIR = Path(__file__).parent / "adversarial"
CONTROLS = ("a-honest", "m-honest", "z-honest")  # graded before, among and after the attacks
# Tight limits so that hangs cost seconds; generous enough for the honest notebook on a loaded 2-core machine.
LIMITS = pipeline.Limits(cell_timeout=6, interrupt_grace=2, deadline=15, cpu_seconds=60, memory_bytes=1536 << 20,
                         processes=64, file_bytes=16 << 20, tmpfs_bytes=32 << 20, scratch_bytes=48 << 20,
                         output_bytes=2 << 20, cell_output_bytes=1 << 20, notebook_bytes=2 << 20,
                         sandbox_memory_bytes=2 << 30)  # above RLIMIT_AS: memory_bomb.py meets that first
UNIT = replace(LIMITS, cpu_seconds=2, memory_bytes=512 << 20, processes=24, tmpfs_bytes=4 << 20)

# -- the corpus ------------------------------------------------------------------------------------------------
@dataclass
class Attack:
    """One submission and what grading it must show."""

    student: str
    doc: str  # what the attack does
    target: str = ""  # the exercise whose cell it replaces
    zero: tuple[str, ...] = ()  # items that must score 0
    full: tuple[str, ...] = ()  # items that must keep full marks
    log: tuple[str, ...] = ()  # regexes the grading log for this student must match
    refused: str = ""  # a regex of the message when the notebook must not be graded at all
    source: str = ""  # the attack cell
    later: str = ""  # a cell appended at the end of the notebook (after a `# %% a later cell` line in the file)


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def load_attack(path: Path) -> Attack:
    """An attack file: the cell source; its docstring says the attack, then `key: value` lines say the outcome."""
    source, _, later = path.read_text().partition("\n# %% a later cell\n")
    doc = ast.get_docstring(ast.parse(source)) or ""
    fields = dict(re.findall(r"^(target|zero|full): *(.*)$", doc, re.M))
    return Attack(student=f"x-{path.stem.replace('_', '-')}", doc=doc.splitlines()[0], target=fields["target"],
                  zero=_names(fields.get("zero", "")), full=_names(fields.get("full", "")),
                  log=tuple(re.findall(r"^log: *(.*)$", doc, re.M)), source=source, later=later)


ATTACKS = [load_attack(path) for path in sorted(ATTACKS_DIR.glob("*.py"))]


def _cell(nb, grade_id: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _edit_meta(grade_id: str, **changes):
    def edit(nb):
        nb.cells[_cell(nb, grade_id)].metadata["nbgrader"].update(changes)
    return edit


def _delete_meta(nb):
    del nb.cells[_cell(nb, "causal_mask")].metadata["nbgrader"]


def _forge_cell(nb):
    nb.cells.append(nbformat.v4.new_code_cell("print('bonus')", metadata={"nbgrader": {
        "grade": True, "grade_id": "bonus", "points": 1000, "solution": False, "locked": False,
        "schema_version": 3, "task": False}}))


def _duplicate(grade_id: str, wrong_first: bool = False):
    def edit(nb):
        i = _cell(nb, grade_id)
        twin = copy.deepcopy(nb.cells[i])
        twin.id = twin.id[:-4] + "dup0"
        if wrong_first:  # the first copy is wrong, the last (graded) one right
            twin.source = "def causal_mask(T):\n    return np.ones((T, T), dtype=bool)"
        nb.cells.insert(i, twin)
    return edit


def _delete_cell(grade_id: str):
    def edit(nb):
        del nb.cells[_cell(nb, grade_id)]
    return edit


def _to_markdown(nb):
    cell = nb.cells[_cell(nb, "combine_masks")]
    nb.cells[_cell(nb, "combine_masks")] = nbformat.v4.new_markdown_cell(cell.source, metadata=cell.metadata)


def _kernel(nb):
    nb.metadata["kernelspec"] = {"name": "julia-1.9", "display_name": "Julia", "language": "julia"}


def _huge(nb):
    nb.cells[-1].outputs = [nbformat.v4.new_output("stream", text="x" * (3 << 20))]


# Bad input: (student, what, edit of the perfect notebook or raw bytes, file name, outcome)
BAD_INPUTS = [
    Attack("b-corrupt-json", "a notebook cut off mid-file", refused=r"invalid JSON at line \d+"),
    Attack("b-not-a-notebook", "valid JSON that is not a notebook", refused=r"not a notebook"),
    Attack("b-too-large", "a 3 MB notebook (outputs kept)", refused=r"over the 2 MB limit"),
    Attack("b-renamed", "the notebook saved under another name", full=ITEMS),
    Attack("b-metadata-edited", "another kernel named; a test cell made ungraded, another worth 100 points; a "
           "solution cell made graded; a new cell claiming 1000 points", full=ITEMS,
           log=(r"`causal_mask` was edited \(grade\)", r"`padding_mask` was edited \(points\)",
                r"`combine_masks_solution` was edited \(grade\)", r"unknown cell id 'bonus'")),
    Attack("b-metadata-deleted", "a test cell's grading metadata deleted", full=ITEMS,
           log=(r"grading metadata deleted: restored",)),
    Attack("b-duplicated-cells", "a test cell duplicated (nbgrader issue 1083); a solution cell duplicated, the "
           "first copy wrong", full=ITEMS, log=(r"duplicates `combine_masks`", r"duplicates `causal_mask_solution`")),
    Attack("b-deleted-test", "a test cell deleted (nbgrader puts the instructor's copy back)", full=ITEMS,
           log=(r"test cell `combine_masks` was deleted",)),
    Attack("b-test-made-markdown", "a test cell turned into markdown", full=ITEMS),
]
EDITS = {
    "b-metadata-edited": [_kernel, _edit_meta("causal_mask", grade=False), _edit_meta("padding_mask", points=100),
                          _edit_meta("combine_masks_solution", grade=True, points=100), _forge_cell],
    "b-metadata-deleted": [_delete_meta],
    "b-duplicated-cells": [_duplicate("combine_masks"), _duplicate("causal_mask_solution", wrong_first=True)],
    "b-deleted-test": [_delete_cell("combine_masks")], "b-test-made-markdown": [_to_markdown], "b-too-large": [_huge],
}
ALL = ATTACKS + BAD_INPUTS


def attack_notebook(attack: Attack) -> nbformat.NotebookNode:
    """The perfect submission with the attack's cell in place of its target exercise."""
    nb = samples.perfect(LESSON)
    for cell in nb.cells:
        if cell.metadata.get("course", {}).get("exercise") == [attack.target]:
            cell.source = attack.source
            if attack.later:
                nb.cells.append(nbformat.v4.new_code_cell(attack.later))
            return nb
    raise AssertionError(f"no exercise cell {attack.target!r} in {LESSON}")


def write_submissions(folder: Path) -> None:
    def put(student: str, content, name: str = LESSON) -> None:
        path = folder / student / LESSON / f"{name}.ipynb"
        path.parent.mkdir(parents=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            nbformat.write(content, path)

    for student in CONTROLS:
        put(student, samples.perfect(LESSON))
    for attack in ATTACKS:
        put(attack.student, attack_notebook(attack))
    perfect = nbformat.writes(samples.perfect(LESSON)).encode()
    put("b-corrupt-json", perfect[: len(perfect) // 2])
    put("b-not-a-notebook", b'["cells"]')
    put("b-renamed", samples.perfect(LESSON), name="my homework (final)")
    for student, edits in EDITS.items():
        nb = samples.perfect(LESSON)
        for edit in edits:
            edit(nb)
        put(student, nb)
    (folder / "b-no-notebook" / LESSON).mkdir(parents=True)
    (folder / "b-no-notebook" / LESSON / "answers.txt").write_text("I did it on paper")


# -- processes ---------------------------------------------------------------------------------------------------
def _descendants(root: int) -> list[int]:
    """Live (not zombie) descendants of ``root``, read from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] not in "ZX":
                children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _of_uid(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid and \
                    open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX":
                pids.append(int(name))
        except OSError:
            continue
    return pids


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the sandbox without a kernel --------------------------------------------------------------------------------
def _run_boxed(tmp_path: Path, code: str, limits=UNIT, timeout: float = 60) -> subprocess.CompletedProcess:
    box = sandbox.Sandbox(tmp_path / "box", limits)
    box.prepare()
    box.seal()
    try:
        return subprocess.run(box.command([sys.executable, "-c", code]), env=box.outer_env(), cwd=box.scratch,
                              capture_output=True, text=True, timeout=timeout)
    finally:
        box.release()


def test_the_sandbox_sees_only_what_the_kernel_needs(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret")
    code = f"""
import json, os, socket, sys
seen = {{p: os.path.exists(p) for p in {[str(ROOT / "autograder"), str(ROOT / "solutions"), str(ROOT / ".grading"),
                                        str(ROOT / "tests"), str(secret), "/root/.ssh", "/etc/shadow"]!r}}}
import decoder_course.harvest
try:
    import autograder
    seen["import autograder"] = True
except ImportError:
    seen["import autograder"] = False
def writable(path):
    try:
        open(path, "a").close()
        return True
    except OSError:
        return False
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    net = True
except OSError:
    net = False
print(json.dumps({{"seen": seen, "uid": os.getuid(), "net": net, "cwd": os.getcwd(),
                  "harvest_writable": writable(decoder_course.harvest.__file__),
                  "venv_writable": writable(os.path.join(sys.prefix, "pyvenv.cfg")),
                  "home_writable": writable("notes.txt"), "pids": sorted(os.listdir("/proc"))[:3],
                  "env": sorted(os.environ)}}))
"""
    done = _run_boxed(tmp_path, code)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert not any(got["seen"].values()), f"the sandbox shows what it must hide: {got['seen']}"
    assert got["net"] is False, "the sandbox reached the network"
    assert sandbox_uids.is_sandbox_uid(got["uid"]) if os.geteuid() == 0 else got["uid"] == os.geteuid()
    assert got["cwd"] == sandbox.HOME and got["home_writable"]
    assert not got["harvest_writable"] and not got["venv_writable"], "the course package or venv is writable"
    assert "DECODER_COURSE_SECRET_FILE" not in got["env"] and "PATH" in got["env"]


def test_a_fork_bomb_stops_at_the_process_limit(tmp_path):
    code = """
import os, time
made = 0
try:
    while True:
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        made += 1
except OSError:
    print(made)
"""
    started = time.perf_counter()
    done = _run_boxed(tmp_path, code)
    assert done.stdout.strip().isdigit(), f"the bomb never met the process limit (exit {done.returncode})"
    made = int(done.stdout.strip())
    # The limit counts every process and thread of the sandbox uid: the launcher-turned-interpreter is one.
    assert 0 < made < UNIT.processes, f"{made} children under a limit of {UNIT.processes}"
    assert time.perf_counter() - started < 30, "the bomb's children outlived their sandbox"


def test_cpu_limit_kills_and_file_size_limit_refuses(tmp_path):
    done = _run_boxed(tmp_path / "cpu", "while True: pass")
    assert done.returncode == 128 + signal.SIGXCPU, (done.returncode, done.stderr[-300:])
    # Python ignores SIGXFSZ: past RLIMIT_FSIZE a write fails (EFBIG) and the kernel lives on.
    code = "open('big', 'wb').write(b'0' * (32 << 20))"  # 32 MB into a 16 MB limit (the tmpfs holds 64 MB)
    done = _run_boxed(tmp_path / "fsize", code, replace(UNIT, tmpfs_bytes=64 << 20))
    assert done.returncode == 1 and "[Errno 27] File too large" in done.stderr, done.stderr[-300:]


def test_memory_and_tmpfs_limits_raise_instead_of_taking_the_machine(tmp_path):
    code = """
import errno
blocks = []
try:
    while True:
        blocks.append(bytearray(32 << 20))
except MemoryError:
    print("memory", len(blocks) * 32)
blocks.clear()
for folder in ("/tmp", "/dev/shm", "."):
    try:
        with open(folder + "/fill", "wb") as handle:
            while True:
                handle.write(b"0" * (1 << 20))
    except OSError as exc:
        print(folder, exc.errno == errno.ENOSPC)
"""
    done = _run_boxed(tmp_path, code)
    lines = done.stdout.split("\n")
    assert lines[0].startswith("memory") and int(lines[0].split()[1]) < UNIT.memory_bytes >> 20, (
        f"exit {done.returncode}: {done.stdout[-300:]!r} {done.stderr[-600:]!r}")
    assert lines[1:4] == ["/tmp True", "/dev/shm True", ". True"], done.stdout + done.stderr


def test_kill_ends_every_process_of_the_sandbox_and_the_deadline_holds(tmp_path):
    code = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(600)
    os._exit(0)
time.sleep(600)
"""
    box = sandbox.Sandbox(tmp_path / "box", replace(UNIT, deadline=1.5, cpu_seconds=60))
    box.prepare()
    box.seal()
    process = subprocess.Popen(box.command([sys.executable, "-c", code]), env=box.outer_env(), cwd=box.scratch)
    box.started(process)
    started = time.perf_counter()
    process.wait(timeout=30)
    box.join(timeout=10)
    assert time.perf_counter() - started < 10, "the watchdog did not stop the sandbox at its deadline"
    assert any("deadline" in event for event in box.events), box.events
    assert box.survivors() == [] and _descendants(os.getpid()) == []
    if os.geteuid() == 0:
        assert _of_uid(box.uid) == []
    box.release()


def test_without_bubblewrap_grading_refuses_clearly(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "bwrap", lambda: None)
    sandbox._probe.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="bubblewrap is not available: install it, or pass "
                                                             r"--no-sandbox to grade without one \(unsafe\)"):
            grade_class.grade(tmp_path / "none", tmp_path / "work", [LESSON])
        from autograder.__main__ import main
        assert main(["grade", str(tmp_path), "--work", str(tmp_path / "work"), "--lessons", LESSON]) == 2
    finally:
        sandbox._probe.cache_clear()


# -- one grading run of the corpus -------------------------------------------------------------------------------
class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    sandbox.check_available()  # without bubblewrap, fail with its message (./course setup installs it)
    base = tmp_path_factory.mktemp("adversarial")
    write_submissions(base / "incoming")
    watched = [ROOT / "decoder_course" / "harvest.py", notebooks.solution_path(LESSON),
               ROOT / "autograder" / "course" / "reference" / "masks.py"]
    before = {path: _sha(path) for path in watched}
    records = _Records()
    logger = logging.getLogger("autograder")
    logger.addHandler(records)
    level = logger.level
    logger.setLevel(logging.INFO)
    started = time.perf_counter()
    try:
        outcomes = grade_class.grade(base / "incoming", base / "work", [LESSON], limits=LIMITS)
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    return {"work": base / "work", "incoming": base / "incoming", "outcomes": outcomes,
            "seconds": time.perf_counter() - started, "log": records.lines, "before": before,
            "after": {path: _sha(path) for path in watched}, "left": _descendants(os.getpid()),
            "left_uid": [pid for uid in sandbox_uids.ever_leased() for pid in _of_uid(uid)]}


def _outcome(run, student):
    return next(o for o in run["outcomes"] if o.student == student)


def _scores(run, student) -> dict[str, float]:
    with Gradebook(f"sqlite:///{run['work'] / 'gradebook.db'}", pipeline.COURSE_ID) as gb:
        nb = gb.find_submission_notebook(LESSON, LESSON, student)
        return {grade.name: grade.score for grade in nb.grades}


def _log(run, student) -> str:
    return "\n".join(line for line in run["log"] if line.startswith(f"{student}/") or f"{student} " in line)


def test_the_corpus_covers_the_issue():
    assert len(ATTACKS) >= 30 and len(ALL) >= 50
    for attack in ALL:
        assert set(attack.zero + attack.full) <= set(ITEMS) and not set(attack.zero) & set(attack.full)
        assert attack.zero or attack.full or attack.refused, f"{attack.student} asserts nothing"


@pytest.mark.parametrize("student", CONTROLS)
def test_honest_controls_score_full_marks(run, student):
    outcome = _outcome(run, student)
    assert outcome.ok and outcome.score == outcome.max_score == len(ITEMS), outcome
    assert _scores(run, student) == dict.fromkeys(ITEMS, 1.0)
    assert not outcome.notes, f"an honest notebook got notes: {outcome.notes}"


@pytest.mark.parametrize("attack", ALL, ids=[a.student for a in ALL])
def test_each_submission_costs_exactly_what_it_should(run, attack):
    outcome = _outcome(run, attack.student)
    if attack.refused:
        assert not outcome.ok and re.search(attack.refused, outcome.message), outcome
        assert re.search(attack.refused, _log(run, attack.student)), "the log does not say why it was refused"
        return
    assert outcome.ok, f"{attack.student}: {attack.doc}: grading failed: {outcome.message}"
    assert outcome.max_score == len(ITEMS), "the points of the notebook changed"
    scores = _scores(run, attack.student)
    assert set(scores) == set(ITEMS), f"gradebook items {sorted(scores)}"
    log = _log(run, attack.student)
    for item in attack.zero:
        assert scores[item] == 0, f"{attack.student}: {attack.doc}: {item} scored {scores[item]}:\n{log}"
    for item in attack.full:
        assert scores[item] == 1, f"{attack.student}: {attack.doc}: {item} lost its point:\n{log}"
    for pattern in attack.log:
        assert re.search(pattern, log), f"{attack.student}: the log does not say {pattern!r}:\n{log}"


def test_the_run_completes_and_reports_every_submission(run):
    graded = {o.student for o in run["outcomes"]}
    assert graded == {pipeline.CANARY, *CONTROLS, *(a.student for a in ALL)}
    with open(run["work"] / "grades.csv") as handle:
        rows = {row.split(",")[0] for row in handle.read().splitlines()[1:]}
    assert rows == graded - {pipeline.CANARY}
    problems = json.loads((run["work"] / "problems.json").read_text())
    assert any("b-no-notebook" in p for p in problems), problems
    # No notebook outlives its deadline: the run is bounded by the limits, whatever the attacks do (a loose bound,
    # not a timing: 10 s a notebook for starting and judging on a loaded machine)
    bound = (len(ALL) + len(CONTROLS) + 1) * (LIMITS.deadline + 10)
    assert run["seconds"] < bound, f"the corpus took {run['seconds']:.0f} s, over {bound:.0f} s"


def test_the_gradebook_is_intact(run):
    db = run["work"] / "gradebook.db"
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with Gradebook(f"sqlite:///{db}", pipeline.COURSE_ID) as gb:
        students = {s.id for s in gb.students}
        graded = {o.student for o in run["outcomes"] if o.ok} - {pipeline.CANARY}
        assert graded <= students
        assert pipeline.CANARY not in students, "the canary is a student of the class gradebook"
        for student in graded:
            assert len(gb.find_submission_notebook(LESSON, LESSON, student).grades) == len(ITEMS)
        assert gb.find_submission(LESSON, CONTROLS[0]).score == len(ITEMS), "a classmate's score changed"


def test_nothing_is_left_running_and_no_shared_file_changed(run):
    assert run["left"] == [], f"processes left running by the grading run: {run['left']}"
    assert run["left_uid"] == [], f"processes of the sandbox uid left running: {run['left_uid']}"
    assert run["before"] == run["after"], "a file every student shares was changed"


def test_regrading_the_same_submission_gives_the_same_scores(run):
    grader = pipeline.api(run["work"], limits=LIMITS)
    for student in (CONTROLS[0], "x-patch-allclose"):
        notebook = next((run["incoming"] / student / LESSON).glob("*.ipynb"))
        before = _scores(run, student)
        again = pipeline.grade_one(grader, run["work"], None, student, LESSON, notebook)
        assert again.ok and _scores(run, student) == before, student


def test_hidden_cases_depend_on_the_submission():
    nb = samples.perfect(LESSON)
    same = verdicts.submission_digest(copy.deepcopy(nb))
    nb.cells[_cell(nb, "causal_mask_solution")].source += "\n# resubmitted"
    assert verdicts.submission_digest(nb) != same
    seeds = {verdicts.derive_seed(b"k", LESSON, "s", "causal_mask", digest) for digest in (same, "x", "")}
    assert len(seeds) == 3


# -- what the release and the feedback show --------------------------------------------------------------------
def _renderings(array: np.ndarray) -> set[str]:
    """Ways a printed array would appear in a notebook (repr, str, a list), for arrays large enough to matter."""
    if array.size < 6:
        return set()
    forms = {repr(array), str(array), str(array.tolist()), json.dumps(array.tolist())}
    return {form for form in forms if len(form) >= 12}


def _tree(run, student: str) -> Path:
    """The nbgrader tree a student's notebook was graded in (the canary has its own)."""
    return pipeline.canary_work(run["work"]) if student == pipeline.CANARY else run["work"]


def _hidden_values(run, student: str) -> set[str]:
    """Hidden inputs and reference values of ``student``'s grading, recomputed from the secret."""
    path = _tree(run, student) / "autograded" / student / LESSON / f"{LESSON}.ipynb"
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:  # undo the verdicts: the digest is of the code that ran
        cell.pop("outputs", None)
    secret = (run["work"] / "secret").read_bytes()
    digest = verdicts.submission_digest(nb)
    found = {secret.hex()}
    for item, ex in verdicts.exercises_for(LESSON).items():
        seed = verdicts.derive_seed(secret, LESSON, student, item, digest)
        found.add(str(seed))
        for case in ex().cases(np.random.default_rng(seed)):
            for array in case.arrays.values():
                found |= _renderings(np.asarray(array))
            args = case.data["args"]  # the call's arguments by name (autograder/course/checks/spec.py)
            if item in ("padding_mask", "combine_masks", "mask_to_bias"):
                found |= _renderings(getattr(ref, item)(*args.values()))
    return found


def _solution_lines(lesson: str) -> set[str]:
    """Lines a student must write in ``lesson`` (between the solution markers of its exercises' references)."""
    lines = set()
    for name in lessons.exercises(lesson):
        inside = False
        for line in notebooks.reference_source(lesson, name).splitlines():
            if "BEGIN SOLUTION" in line or "END SOLUTION" in line:
                inside = "BEGIN" in line
            elif inside and len(line.strip()) > 30 and not line.strip().startswith("#"):
                lines.add(line.strip())
    return lines


def _hidden_test_lines() -> set[str]:
    """Code of the lesson's hidden checks (not their teaching messages, which feedback shows on purpose)."""
    source = "".join((ROOT / "autograder" / "course" / "checks" / name).read_text()
                     for name in ("spec.py", "judges.py"))
    return {line.strip() for line in source.splitlines()
            if len(line.strip()) > 25 and not re.search(r"[\"'#]", line)}


def _text(path: Path) -> str:
    """What a reader sees: an HTML page without its tags (code is split into highlighting spans), unescaped."""
    text = path.read_text()
    return html.unescape(re.sub(r"<[^>]+>", "", text)) if path.suffix == ".html" else text


def _own_code(run, student: str) -> str:
    if student == pipeline.CANARY:
        return notebooks.solution_path(LESSON).read_text()
    return next((run["incoming"] / student / LESSON).glob("*.ipynb")).read_text(errors="replace")


def test_feedback_and_release_hide_solutions_hidden_tests_and_hidden_values(run):
    solution, hidden_code = _solution_lines(LESSON), _hidden_test_lines()
    feedback = sorted([*(run["work"] / "feedback").glob(f"*/{LESSON}/*.html"),
                       *(pipeline.canary_work(run["work"]) / "feedback").glob(f"*/{LESSON}/*.html")])
    assert {p.parts[-3] for p in feedback} == {o.student for o in run["outcomes"] if o.ok}
    assert solution and hidden_code
    # The scan can fail: the canary's feedback shows its own code, which is the solution.
    canary = _text(pipeline.canary_work(run["work"]) / "feedback" / pipeline.CANARY / LESSON / f"{LESSON}.html")
    assert all(line in canary for line in solution)
    for path in feedback:
        text, student = _text(path), path.parts[-3]
        own = json.loads(_own_code(run, student))
        own = "\n".join("".join(c.get("source", "")) for c in own.get("cells", []))  # what the student wrote
        for marker in (HIDDEN_BEGIN, "### END HIDDEN TESTS", "from decoder_course.harvest import collect"):
            assert marker not in text, f"{path} shows hidden-test text {marker!r}"
        for line in hidden_code - {line for line in hidden_code if line in own}:  # a line the student wrote too
            assert line not in text, f"{path} shows hidden-check code {line!r}"
        for line in solution - {line for line in solution if line in own}:
            assert line not in text, f"{path} shows the solution line {line!r}"
        values = _hidden_values(run, student)
        assert len(values) > 10
        for value in values:
            assert value not in text, f"{path} shows a hidden input or reference value: {value[:80]!r}"
    # Every released lesson: no hidden-test text. This lesson's release: no solution line, no hidden-check code
    # (tests/test_notebooks.py holds every lesson's release to its own solutions).
    released = sorted((ROOT / "lessons").glob("*/*.ipynb"))
    assert ROOT / "lessons" / LESSON / f"{LESSON}.ipynb" in released
    for path in released:
        text = path.read_text()
        for marker in (HIDDEN_BEGIN, "### END HIDDEN TESTS", "from decoder_course.harvest import collect"):
            assert marker not in text, f"{path} shows hidden-test text {marker!r}"
        if path.parent.name == LESSON:
            leaked = [line for line in solution | hidden_code if json.dumps(line)[1:-1] in text]
            assert not leaked, f"{path} shows solution or hidden-check lines: {leaked[:3]}"


def test_feedback_shows_the_verdicts_and_the_visible_checks(run):
    text = _text(run["work"] / "feedback" / "x-patch-allclose" / LESSON / f"{LESSON}.html")
    assert "Hidden checks for `causal_mask`" in text
    assert "visible.check_causal_mask(causal_mask)" in text


def test_an_item_printing_its_hidden_inputs_still_passes_and_shows_none(run):
    notebook = nbformat.read(run["work"] / "autograded" / "x-print-hidden-inputs" / LESSON / f"{LESSON}.ipynb",
                             as_version=4)
    test_cell = notebook.cells[_cell(notebook, "padding_mask")]
    printed = "".join(out.get("text", "") for out in test_cell.outputs)
    assert "token_ids:" in printed, "the visible check's calls should still print"
    for value in _hidden_values(run, "x-print-hidden-inputs"):
        assert value not in printed


def test_hidden_inputs_kept_by_a_correct_function_are_gone_in_later_cells(run):
    """A correct padding_mask keeps its arguments (globals, closure, class, module and builtins attributes); the
    hidden cases ran in a forked child, so a later cell finds only what the visible checks passed it."""
    student = "x-stash-hidden-inputs"
    assert _scores(run, student)["padding_mask"] == 1
    path = run["work"] / "autograded" / student / LESSON / f"{LESSON}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    later = "".join(out.get("text", "") for out in notebook.cells[-1].get("outputs", []))
    sizes = re.search(r"stash sizes: \[(\d+), \1, \1, \1, \1\]", later)
    assert sizes and "kept:" in later, f"the later cell did not print what was kept: {later[:300]!r}"
    shown = [out.get("text", "") + out.get("evalue", "") + "".join(out.get("traceback", []))
             + "".join(v if isinstance(v, str) else "".join(map(str, v)) for v in out.get("data", {}).values())
             for cell in notebook.cells for out in cell.get("outputs", [])]
    shown.append(_text(run["work"] / "feedback" / student / LESSON / f"{LESSON}.html"))
    values = _hidden_values(run, student)
    assert len(values) > 10
    for value in values:
        assert not any(value in text for text in shown), f"a hidden input or reference value was shown: {value[:80]!r}"


def test_the_sandbox_uid_can_read_what_plotting_needs(tmp_path):
    """/etc entries the kernel needs are readable by the sandbox uid: no fontconfig error in students' cells."""
    code = ("import os, subprocess; print(os.access('/etc/fonts/fonts.conf', os.R_OK), os.access('/etc/passwd', "
            "os.R_OK)); print(repr(subprocess.run(['fc-list'], capture_output=True, text=True).stderr))")
    result = _run_boxed(tmp_path, code)
    assert result.stdout.splitlines() == ["True True", "''"], result.stdout + result.stderr


def test_matplotlib_finds_its_font_list_and_cannot_change_it(tmp_path):
    """The font list is built once outside (autograder.sandbox.launch.font_cache), not again in every kernel; the
    kernel can read it but not rewrite it for the next student (each sandbox binds it read-only)."""
    code = ("import os, time; t = time.perf_counter(); import matplotlib.font_manager as fm; "
            "d = os.environ['MPLCONFIGDIR']; names = sorted(os.listdir(d)); print(names); "
            "print(os.access(os.path.join(d, names[0]), os.W_OK)); print(len(fm.fontManager.ttflist) > 0)")
    result = _run_boxed(tmp_path, code)
    lines = result.stdout.splitlines()
    assert lines[0] == repr([sandbox.font_cache().name]) and lines[1:] == ["False", "True"], (
        result.stdout + result.stderr)
    assert "building the font cache" not in result.stderr


# -- issue 10: the paths around the sandbox ----------------------------------------------------------------------
def _put(root: Path, rel: str, nb) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def test_a_planted_nested_notebook_impersonates_nobody(tmp_path):
    """Hole 1: aa plants aa/01-masks/zz/01-masks/01-masks.ipynb; zz's own notebook is graded, no phantom student."""
    root = tmp_path / "in"
    real = _put(root, f"zz/{LESSON}/{LESSON}.ipynb", samples.perfect(LESSON))
    own = _put(root, f"aa/{LESSON}/{LESSON}.ipynb", samples.perfect(LESSON))
    _put(root, f"aa/{LESSON}/zz/{LESSON}/{LESSON}.ipynb", samples.untouched(LESSON))
    _put(root, f"aa/{LESSON}/deeper/{LESSON}/x/{LESSON}.ipynb", samples.untouched(LESSON))
    _put(root, f"aa/{LESSON}.ipynb", samples.untouched(LESSON))  # a notebook outside a lesson folder
    collected = intake.collect_submissions(root, [LESSON], tmp_path / "scratch")
    assert collected.found == {"zz": {LESSON: real}, "aa": {LESSON: own}}, collected.found
    assert not collected.refused
    planted = [p for p in collected.problems if "not in the layout student/lesson/notebook.ipynb" in p]
    assert len(planted) == 3 and any(p.startswith(f"aa/{LESSON}/zz/{LESSON}/") for p in planted), planted


def test_ids_that_differ_only_by_case_are_refused_and_reported(tmp_path):
    root = tmp_path / "in"
    for student in ("Bob", "bob", "alice"):
        _put(root, f"{student}/{LESSON}/{LESSON}.ipynb", samples.perfect(LESSON))
    collected = intake.collect_submissions(root, [LESSON], tmp_path / "scratch")
    assert set(collected.found) == {"alice"}
    assert set(collected.refused) == {"Bob", "bob"}
    assert all("differ only by case" in why for why in (collected.refused["Bob"][LESSON],
                                                          collected.refused["bob"][LESSON]))


def _disk_usage(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_zip_bomb_is_judged_before_and_while_extracting(tmp_path):
    """Hole 2: a 256 MB notebook of zeros packs into a few hundred kB; at most the limit (+1 byte) reaches disk."""
    import zipfile

    bomb = tmp_path / "export.zip"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        archive.writestr(f"honest/{LESSON}/{LESSON}.ipynb", nbformat.writes(samples.perfect(LESSON)))
        with archive.open(f"bomber/{LESSON}/{LESSON}.ipynb", "w", force_zip64=True) as entry:
            block = b"0" * (1 << 20)
            for _ in range(256):
                entry.write(block)
        for i in range(40):  # each under the limit, together over the archive's cap
            archive.writestr(f"s{i:02d}_{LESSON}.ipynb", b" " * (1536 << 10))
    assert bomb.stat().st_size < 4 << 20
    limit = 2 << 20
    collected = intake.collect_submissions(bomb, [LESSON], tmp_path / "scratch", max_bytes=limit,
                                             archive_bytes=24 << 20)
    assert _disk_usage(tmp_path / "scratch") <= 24 << 20, "the archive's cap did not hold"
    assert "over the 2 MB limit" in collected.refused["bomber"][LESSON]
    assert "honest" in collected.found
    assert any("entries from" in p and "were not extracted" in p for p in collected.problems), collected.problems


def test_kernel_text_is_escaped_in_the_terminal_the_log_and_the_csv(run):
    """Hole 5: escape sequences the kernel wrote reach the instructor only as visible \\x1b text."""
    outcome = _outcome(run, "x-terminal-escape")
    text = "\n".join(outcome.notes)
    assert "\\x1b[2J" in text and "\x1b" not in text and "\x07" not in text, text
    raw = (run["work"] / "grades.csv").read_bytes()
    assert b"\x1b" not in raw and b"\x07" not in raw and b"\\x1b[2J" in raw
    assert not any("\x1b" in line or "\x07" in line for line in run["log"])
    from decoder_course.text import csv_cell, shown
    assert shown("a\x1b]0;t\x07\u202eb\nc") == "a\\x1b]0;t\\x07\\u202eb\\x0ac"
    assert csv_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)" and csv_cell(2.5) == 2.5


# A process's peak resident memory, for the scripts below. Not ru_maxrss: Linux keeps the parent's peak in it
# across fork and exec, so a child of this (large) test process would report the test's own peak.
PEAK_KB = """
def peak_kb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
"""
RSS_SCRIPT = PEAK_KB + """
import json, os, shutil, sys
from pathlib import Path
import nbformat, numpy as np
from autograder.course import notebooks
from autograder.judge import verdicts
from autograder.course.reference import masks
from decoder_course.harvest import ENV_VAR, collect
step, lesson, folder, attack = sys.argv[1:5]
folder = Path(folder)
nb = nbformat.read(notebooks.solution_path(lesson), as_version=4)
plan = verdicts.prepare(nb, lesson, "s", b"secret", folder / step)
if step == "make":  # another process: what it costs to write the files must not count
    os.environ[ENV_VAR] = str(folder / step)
    for item in plan.items:
        collect(item, vars(masks))
    outputs = folder / step / "outputs"
    if attack == "json":  # the issue's attack: 40 MB of {},{},... in place of the report
        with open(outputs / "padding_mask.json", "w") as handle:
            handle.write("[{}")
            for _ in range(40):
                handle.write(",{}" * (1 << 19))
            handle.write("]")
    elif attack == "npz":  # the largest arrays the grader still reads, in place of honest ones
        np.savez(outputs / "causal_mask.npz", leaf0=np.ones(verdicts.MAX_OUTPUT_BYTES // 8 - 4096))
else:
    shutil.rmtree(folder / step / "outputs")
    shutil.copytree(folder / "make" / "outputs", folder / step / "outputs")
    decided = verdicts.decide(plan)
    print(json.dumps({"peak_kb": peak_kb(),
                      "passed": {k: v.passed for k, v in decided.items()}}))
"""


def test_the_trusted_side_parses_only_bounded_files(tmp_path):
    """Hole 6: forged outputs cost the grading process no more than 1.5x the memory of an honest run."""
    got = {}
    for attack in ("honest", "json", "npz"):
        for step in ("make", "judge"):
            done = subprocess.run([sys.executable, "-c", RSS_SCRIPT, step, LESSON, str(tmp_path / attack), attack],
                                  cwd=ROOT, capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
            assert done.returncode == 0, done.stderr[-2000:]
        got[attack] = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(got["honest"]["passed"].values()), got["honest"]
    assert got["json"]["passed"]["padding_mask"] is False and got["npz"]["passed"]["causal_mask"] is False
    print("peak RSS kB:", {attack: result["peak_kb"] for attack, result in got.items()})
    for attack in ("json", "npz"):
        assert got[attack]["peak_kb"] <= 1.5 * got["honest"]["peak_kb"], (attack, got)


# The grading process itself, grading the perfect notebook, then each attack that floods it with messages.
GRADER_RSS_SCRIPT = PEAK_KB + """
import json, sys
from pathlib import Path
import nbformat
from autograder.grading import pipeline
from autograder.course import samples
from autograder.sandbox.warm import retire_warm
from tests.test_adversarial import ATTACKS, LESSON, LIMITS, attack_notebook
work, folder = Path(sys.argv[1]), Path(sys.argv[2])
grader, _ = pipeline.prepare(work, [LESSON], sandbox=True, limits=LIMITS)
def grade(student, nb):
    path = folder / student / f"{LESSON}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    outcome = pipeline.grade_one(grader, work, None, student, LESSON, path)
    return {"score": outcome.score, "peak_kb": peak_kb(), "notes": outcome.notes}
got = {"honest": grade("a-honest", samples.perfect(LESSON))}
for attack in ATTACKS:
    if attack.student.startswith("x-output-"):
        got[attack.student] = grade(attack.student, attack_notebook(attack))
retire_warm()
print(json.dumps(got))
"""


def test_the_grading_process_memory_is_bounded_whatever_the_kernel_sends(tmp_path):
    """Issue 30, point 2: the grading process's peak RSS while it grades every ``output_*`` attack (floods of
    every kind of message, one 200 MB message, a 64 MB reply) stays within 1.5x what grading an honest notebook
    takes, in the same process: an honest notebook first, then the attacks (a peak only grows)."""
    done = subprocess.run([sys.executable, "-c", GRADER_RSS_SCRIPT, str(tmp_path / "work"), str(tmp_path / "in")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    attacks = [a for a in ATTACKS if a.student.startswith("x-output-")]
    assert len(attacks) >= 8 and set(got) == {"honest", *(a.student for a in attacks)}
    print("peak RSS kB:", {student: result["peak_kb"] for student, result in got.items()})
    assert got["honest"]["score"] == len(ITEMS), got["honest"]
    for attack in attacks:
        assert got[attack.student]["score"] == len(attack.full), (attack.student, got[attack.student])
    peak = max(result["peak_kb"] for result in got.values())
    assert peak <= 1.5 * got["honest"]["peak_kb"], got


def _swap_exercise(nb, name: str, source: str, extra: str = "") -> None:
    """Put ``source`` in ``name``'s solution cell, and ``extra`` in a new cell before it."""
    for index, cell in enumerate(nb.cells):
        if cell.metadata.get("course", {}).get("exercise") == [name]:
            cell.source = source
            if extra:
                nb.cells.insert(index, nbformat.v4.new_code_cell(extra))
            return
    raise AssertionError(f"no exercise cell {name}")


@pytest.mark.parametrize("lesson, item, source, extra", [
    ("10-numerics", "robust_attention",
     "def robust_attention(*args, **kwargs):\n    return _attend(*args, **kwargs)\n",
     "from torch.nn.functional import scaled_dot_product_attention as _attend"),
    ("10-numerics", "robust_attention",
     "def robust_attention(q, k, v, allowed=None):\n    return getattr(F, 'scaled_dot_product_attention')(q, k, v)\n",
     ""),
    ("05-decoder-layer", "numpy_decoder_layer",
     "def numpy_decoder_layer(x, memory, params, *args, **kwargs):\n"
     "    layer = DecoderLayer(x.shape[-1], 4, 128, dropout=0.0)\n"
     "    return layer(torch.as_tensor(x), torch.as_tensor(memory)).detach().numpy()\n", ""),
], ids=["alias-in-another-cell", "getattr", "torch-in-numpy-exercise"])
def test_policy_holes_are_closed(tmp_path, lesson, item, source, extra):
    """Hole 7: SDPA through an alias imported in another cell, or getattr; torch in a NumPy-only exercise. The
    source reader still names each (its early warning); run on the hidden cases, each loses its item, and only it
    (issue 36: what ran decides, never what the source reader read)."""
    nb = samples.perfect(lesson)
    _swap_exercise(nb, item, source, extra)
    plan = verdicts.prepare(nb, lesson, "s", b"k", tmp_path)
    assert policy.violations(plan.cells, [plan.sources[item]], [item], tuple(plan.items[item][0].forbidden))
    namespace = samples.notebook_namespace(lesson)
    for cell in ("import torch\nimport torch.nn.functional as F", extra, source):  # the notebook's imports first
        exec(compile(cell, "<attack cell>", "exec"), namespace)  # noqa: S102 - the test's own attack
    decided = verdicts.judge_namespace(lesson, namespace)
    assert not decided[item].passed and "reaches" in decided[item].message, decided[item]
    assert verdicts.RUNTIME_HOW in decided[item].message, decided[item]
    assert all(v.passed for k, v in decided.items() if k != item), "the policy cost another item"
    honest = verdicts.decide(verdicts.prepare(samples.perfect(lesson), lesson, "s", b"k", tmp_path / "honest"))
    assert honest[item].passed or "reaches" not in honest[item].message


def _nbgrader(run, *args: str) -> subprocess.CompletedProcess:
    """nbgrader's own command line, from the repository root: its nbgrader_config.py points at ``run``'s tree."""
    env = {**os.environ, "DECODER_COURSE_WORK": str(run["work"])}
    return subprocess.run([str(Path(sys.executable).parent / "nbgrader"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_nbgraders_own_tools_keep_the_course_grading(run):
    """Hole 8: nbgrader autograde (the CLI formgrader's button runs) on the course's tree grades in the sandbox
    with the hidden verdicts; generate_feedback hides the hidden tests; export knows no canary."""
    student = "x-leaks-for-long-sequences"
    before = _scores(run, student)
    assert before["causal_mask"] == 0 and before["padding_mask"] == 1
    done = _nbgrader(run, "autograde", LESSON, "--student", student, "--force")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert _scores(run, student) == before, "nbgrader's autograde changed the course's scores"
    graded = nbformat.read(run["work"] / "autograded" / student / LESSON / f"{LESSON}.ipynb", as_version=4)
    verdict_lines = [out.get("traceback", [""])[0] for cell in graded.cells for out in cell.get("outputs", [])
                     if out.get("ename") == "HiddenCheckFailed"]
    assert any("causal_mask" in line for line in verdict_lines), "the autograde ran without the hidden verdicts"
    done = _nbgrader(run, "generate_feedback", LESSON, "--student", student, "--force")
    assert done.returncode == 0, done.stderr[-2000:]
    html_text = _text(run["work"] / "feedback" / student / LESSON / f"{LESSON}.html")
    assert HIDDEN_BEGIN not in html_text and "from decoder_course.harvest import collect" not in html_text
    export = run["work"] / "export.csv"
    done = _nbgrader(run, "export", "--to", str(export))
    assert done.returncode == 0, done.stderr[-2000:]
    students = {line.split(",")[3] for line in export.read_text().splitlines()[1:]}
    assert student in students and pipeline.CANARY not in students, students


def test_nbgrader_stops_before_reading_an_oversized_notebook(tmp_path):
    """nbgrader's own autograde reads a notebook whole: the course's pre-convert hook stops it first, naming
    the command that refuses the notebook and grades the others."""
    big = tmp_path / f"{LESSON}.ipynb"
    with open(big, "wb") as handle:
        handle.truncate(pipeline.Limits().notebook_bytes + 1)
    with pytest.raises(SystemExit, match=r"over the 16 MB limit.*\./course grade"):
        pipeline.refuse_oversized(LESSON, "s", [str(big)])
    small = tmp_path / "small.ipynb"
    small.write_text("{}")
    pipeline.refuse_oversized(LESSON, "s", [str(small)])  # a notebook within the limit goes on to nbgrader
    config = pipeline.tools_config(pipeline.Config(), tmp_path / "work")
    assert config.Autograde.pre_convert_hook is pipeline.refuse_oversized
    assert config.TrustedExecute.sandbox is True
