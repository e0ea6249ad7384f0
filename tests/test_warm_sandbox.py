"""Warm sandboxes (autograder.sandbox.warm.WarmSandbox): one per student, a zygote that imported the libraries once
forks each notebook's kernel. A notebook must start from what a cold sandbox gives it, no two students may share
one, no kernel may stop its zygote, and the scores must be those of cold grading."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook
from nbgrader.apps import NbGraderAPI
from nbgrader.coursedir import CourseDirectory

from autograder.course import samples
from autograder.grading import pipeline
from autograder.sandbox import cgroups, warm
from autograder.sandbox import launch as sandbox

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ["01-masks", "05-decoder-layer"]

# A cell a student added: what the previous notebook left, then leave the same behind (files, a process).
PROBE = r'''
import os, subprocess
planted = "/home/student/.ipython/profile_default/startup/00-planted.py"
marks = [p for p in ("/tmp/mark", "/home/student/mark", "/dev/shm/mark", planted) if os.path.exists(p)]
marks += ["PLANTED ran"] if "PLANTED" in globals() else []
sleepers = [p for p in os.listdir("/proc") if p.isdigit() and b"sleep" in open(f"/proc/{p}/cmdline", "rb").read()]
parent_uid = os.stat(f"/proc/{os.getppid()}").st_uid
print("PROBE", {"marks": marks, "sleepers": len(sleepers), "uid": os.getuid(), "ppid_uid": parent_uid})
for p in ("/tmp/mark", "/home/student/mark", "/dev/shm/mark"):
    open(p, "w").write("left by the previous notebook")
os.makedirs("/home/student/.ipython/profile_default/startup", exist_ok=True)
open(planted, "w").write("PLANTED = 1")
subprocess.Popen(["sleep", "600"], start_new_session=True)
import matplotlib.pyplot as plt
plt.plot([0, 1], [1, 0]); plt.show()
'''


# A cell a student added: the IPC objects the previous notebook left, then leave some behind (SysV shared memory,
# a semaphore set, a message queue, a POSIX message queue and shared memory); what the kernel may not do.
IPC_PROBE = r'''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
left = {kind: open(f"/proc/sysvipc/{kind}").read().splitlines()[1:] for kind in ("shm", "sem", "msg")}
left["shmget by key"] = libc.shmget(0x5EC2E7, 0, 0)
left["mq_open"] = libc.mq_open(b"/stash", os.O_RDONLY, 0, None)
left["/dev/shm"] = os.listdir("/dev/shm")
made = [libc.shmget(0x5EC2E7, 64 << 20, 0o1600), libc.semget(0x5EC2E8, 1, 0o1600), libc.msgget(0x5EC2E9, 0o1600),
        libc.mq_open(b"/stash", os.O_CREAT | os.O_RDWR, 0o600, None)]
open("/dev/shm/stash", "w").write("withheld answers")
keyring = {"x86_64": 248, "aarch64": 217}[os.uname().machine]  # add_key
refused = {"unshare ipc": libc.unshare(0x08000000), "add_key": libc.syscall(keyring, b"user", b"stash", b"x", 1, -4)}
filters = [line.split()[1] for line in open("/proc/self/status") if line.startswith("Seccomp_filters:")]
print("IPC", {"left": left, "made": made, "refused": refused, "filters": filters,
              "namespace": os.readlink("/proc/self/ns/ipc")})
'''


def _with_cell(nb, source: str):
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    nb.cells.append(nbformat.v4.new_code_cell(source))
    return nb


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    sandbox.check_available()
    work = tmp_path_factory.mktemp("warm") / "work"
    pipeline.prepare(work, LESSONS)
    warm.retire_warm()  # the canary's
    cold_config = pipeline.nbgrader_config(work)
    cold_config.TrustedExecute.warm = False
    cold = NbGraderAPI(coursedir=CourseDirectory(config=cold_config), config=cold_config)
    yield {"work": work, "warm": pipeline.api(work), "cold": cold, "incoming": work.parent / "incoming"}
    warm.retire_warm()


def _grade(course, student: str, lesson: str, nb, which: str = "warm"):
    path = course["incoming"] / student / lesson / f"{lesson}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    outcome = pipeline.grade_one(course[which], course["work"], None, student, lesson, path)
    graded = nbformat.read(course["work"] / "autograded" / student / lesson / f"{lesson}.ipynb", as_version=4)
    return outcome, graded


def _probe(graded, prefix: str = "PROBE") -> dict:
    for cell in graded.cells:
        for out in cell.get("outputs", []):
            text = out.get("text", "")
            if out.get("output_type") == "stream" and text.startswith(prefix + " "):
                return eval(text[len(prefix) + 1:].strip())  # noqa: S307 - our own probe's dict literal
    raise AssertionError("the probe cell printed nothing")


def _has_image(graded) -> bool:
    return any("image/png" in out.get("data", {}) for cell in graded.cells for out in cell.get("outputs", []))


def test_warm_sandboxes_are_used_where_they_can_be(course):
    assert warm.warm_possible() == (os.geteuid() == 0)
    _grade(course, "w0", "01-masks", samples.perfect("01-masks"))
    box = getattr(warm._WARM, "box", None)
    if warm.warm_possible():
        assert isinstance(box, warm.WarmSandbox) and box.student == "w0" and box.alive()
    else:
        assert box is None, "without root every notebook gets a cold sandbox"


@pytest.mark.skipif(not warm.warm_possible(), reason="warm sandboxes need grading as root (cold ones are used)")
def test_a_students_next_notebook_starts_from_what_a_cold_sandbox_gives(course, monkeypatch):
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel draws inline, as for a student (conftest: Agg)
    nb = _with_cell(samples.perfect("01-masks"), PROBE)
    first, graded_first = _grade(course, "w1", "01-masks", nb)
    box = warm._WARM.box
    zygote, outer = box.zygote, box.outer
    second, graded_second = _grade(course, "w1", "05-decoder-layer", _with_cell(samples.perfect("05-decoder-layer"),
                                                                                PROBE))
    assert warm._WARM.box is box and box.zygote == zygote and box.outer is outer and box.notebooks == 2, (
        "the student's second notebook did not reuse the warm sandbox: this test would prove nothing")
    assert (first.score, first.max_score) == (4, 4) and (second.score, second.max_score) == (8, 8), (first, second)
    for graded in (graded_first, graded_second):
        seen = _probe(graded)
        assert seen["marks"] == [], f"a file of the previous notebook was still there: {seen['marks']}"
        assert seen["sleepers"] == 0, "a process of the previous notebook was still running"
        assert seen["uid"] == box.uid and seen["uid"] != 0, "the kernel does not run as the sandbox uid"
        assert seen["ppid_uid"] == 0, "the kernel's parent (the zygote) is not root: the kernel could signal it"
        assert _has_image(graded), "a plot in a cell the student added does not show (inline backend)"


@pytest.mark.skipif(not warm.warm_possible(), reason="warm sandboxes need grading as root (cold ones are used)")
def test_a_notebooks_ipc_objects_are_gone_in_the_next_notebook_of_its_warm_sandbox(course):
    """Each kernel the zygote forks has an IPC namespace of its own (SysV and POSIX objects go with the notebook,
    not with the sandbox), then runs under the kernel's syscall profile on top of the zygote's."""
    seen = []
    for lesson in ("01-masks", "01-masks", "05-decoder-layer"):
        outcome, graded = _grade(course, "w8", lesson, _with_cell(samples.perfect(lesson), IPC_PROBE))
        assert outcome.score == outcome.max_score, outcome
        seen.append(_probe(graded, "IPC"))
    box = warm._WARM.box
    assert box.student == "w8" and box.notebooks == 3, "the notebooks did not share a warm sandbox"
    for n, got in enumerate(seen):
        assert got["left"] == {"shm": [], "sem": [], "msg": [], "shmget by key": -1, "mq_open": -1, "/dev/shm": []}, (
            f"notebook {n + 1} found what the one before left: {got['left']}")
        assert all(made >= 0 for made in got["made"]), got["made"]
        assert got["refused"] == {"unshare ipc": -1, "add_key": -1}, got["refused"]
        assert got["filters"] == ["2"], "the kernel does not run under the zygote's profile and its own"
    # A namespace's inode number is reused once it is gone, so two kernels one after the other may show the same
    # number: what they left is checked above. The zygote's namespace lives on, and no kernel may be in it.
    zygote = os.readlink(f"/proc/{box.zygote}/ns/ipc")
    assert all(got["namespace"] != zygote for got in seen), "a kernel shared its zygote's IPC namespace"


@pytest.mark.skipif(not warm.warm_possible(), reason="warm sandboxes need grading as root (cold ones are used)")
def test_no_two_students_share_a_sandbox(course):
    _grade(course, "w2", "01-masks", samples.perfect("01-masks"))
    box = warm._WARM.box
    _grade(course, "w3", "01-masks", samples.perfect("01-masks"))
    other = warm._WARM.box
    assert other is not box and other.student == "w3" and other.pid_ns != box.pid_ns
    assert box.retired and box.outer.poll() is not None and not box.scratch.exists(), "w2's sandbox lives on"
    assert box._all() == [], "a process of w2's sandbox survived"


@pytest.mark.skipif(not warm.warm_possible(), reason="warm sandboxes need grading as root (cold ones are used)")
def test_a_kernel_that_kills_all_it_can_costs_its_own_item_and_not_the_next_notebook(course):
    attack = (ROOT / "tests" / "adversarial" / "kill_grader.py").read_text().split('"""', 2)[2]
    nb = samples.perfect("01-masks")
    for cell in nb.cells:
        if cell.cell_type == "code" and "def causal_mask" in cell.source:
            cell.source = "import numpy as np\n" + attack
    hit, _ = _grade(course, "w4", "01-masks", nb)
    box = warm._WARM.box
    after, _ = _grade(course, "w4", "01-masks", samples.perfect("01-masks"))
    assert (hit.score, after.score) == (3, 4), (hit, after)
    assert warm._WARM.box is box and box.notebooks == 2, "the kernel stopped its zygote (or the sandbox retired)"


@pytest.mark.skipif(not warm.warm_possible(), reason="warm sandboxes need grading as root (cold ones are used)")
def test_a_prestarted_sandbox_is_the_one_the_notebook_gets_and_never_another_students(course):
    warm.retire_warm()
    limits = sandbox.Limits(**course["warm"].config.TrustedExecute.limits)
    warm.prestart_warm("w6", limits)
    box = warm._WARM.box
    assert box.student == "w6" and not box.ready, "prestart_warm waited for the zygote: nothing overlaps it"
    warm.prestart_warm("w6", limits)
    assert warm._WARM.box is box, "a second prestart for the same student replaced the sandbox"
    warm.prestart_warm("w7", limits)
    assert warm._WARM.box is not box and box.retired, "another student's prestart kept w6's sandbox"
    outcome, _ = _grade(course, "w7", "01-masks", samples.perfect("01-masks"))
    assert warm._WARM.box.student == "w7" and warm._WARM.box.notebooks == 1 and outcome.score == 4, outcome


@pytest.mark.parametrize("lesson", LESSONS)
def test_warm_and_cold_grading_give_the_same_verdicts(course, lesson):
    for n, make in enumerate((samples.perfect, samples.typical_mistakes, samples.untouched)):
        nb = make(lesson)
        warm, warm_nb = _grade(course, f"same{n}", lesson, nb, "warm")
        warm_items = _item_scores(course, lesson, f"same{n}")
        cold, cold_nb = _grade(course, f"same{n}", lesson, nb, "cold")
        assert (warm.score, warm.max_score) == (cold.score, cold.max_score), (lesson, make.__name__, warm, cold)
        assert warm_items == _item_scores(course, lesson, f"same{n}") and warm_items, (lesson, make.__name__)
        assert _verdicts(warm_nb) == _verdicts(cold_nb), (lesson, make.__name__)


def _item_scores(course, lesson: str, student: str) -> dict[str, float]:
    with Gradebook(f"sqlite:///{course['work'] / 'gradebook.db'}", pipeline.COURSE_ID) as gb:
        return {g.name: g.score for g in gb.find_submission_notebook(lesson, lesson, student).grades}


def _verdicts(graded) -> list[str]:
    """What each graded test cell says: the sealed verdict's message, failed or passed."""
    return [out.get("evalue", "") + "".join(out.get("text", "")) for cell in graded.cells
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade") for out in cell.get("outputs", [])
            if out.get("output_type") == "error" or "Hidden checks" in "".join(out.get("text", ""))]


def test_nothing_of_a_warm_sandbox_outlives_it(course):
    _grade(course, "w5", "01-masks", samples.perfect("01-masks"))
    box = getattr(warm._WARM, "box", None)
    warm.retire_warm()
    assert getattr(warm._WARM, "box", None) is None
    if box is not None:
        assert box.outer.poll() is not None and box._all() == [] and not box.scratch.exists()


# SysV segments that no process holds, past the sandbox's memory (768 MB below), under every rlimit.
SHM_HOG = (ROOT / "tests" / "adversarial" / "memory_sysv_shm.py").read_text().split('"""', 2)[2]


@pytest.mark.skipif(not warm.warm_possible(), reason="warm sandboxes need grading as root (cold ones are used)")
def test_a_notebook_past_its_sandboxs_memory_costs_its_items_and_the_next_notebook_gets_a_fresh_sandbox(course):
    limits = sandbox.Limits(**course["warm"].config.TrustedExecute.limits)
    course["tight"] = pipeline.api(course["work"], limits=replace(limits, sandbox_memory_bytes=768 << 20))
    nb = samples.perfect("01-masks")
    for cell in nb.cells:
        if cell.cell_type == "code" and "def combine_masks" in cell.source:
            cell.source = SHM_HOG + cell.source
    hit, graded = _grade(course, "w8", "01-masks", nb, "tight")
    box = warm._WARM.box
    assert box.retired and box.cgroup is None, "the sandbox that hit its memory limit was kept, or its group"
    assert _item_scores(course, "01-masks", "w8") == {"causal_mask": 1.0, "padding_mask": 1.0, "combine_masks": 0.0,
                                                       "mask_to_bias": 0.0}, hit
    assert any("used more than the 768 MB of memory" in verdict for verdict in _verdicts(graded))
    assert any("reached the sandbox's memory limit" in note for note in hit.notes), hit.notes
    after, _ = _grade(course, "w8", "01-masks", samples.perfect("01-masks"), "tight")
    fresh = warm._WARM.box
    assert after.score == 4 and fresh is not box and fresh.notebooks == 1, "the next notebook got no fresh sandbox"
    memory = cgroups.hierarchy().parents["memory"]

    def left_over() -> list:
        mine = f"{cgroups.PREFIX}{os.getpid()}-"
        return [folder for folder in memory.iterdir()
                if folder.name.startswith(mine) and folder != fresh.cgroup.folders["memory"]]

    # A killed process leaves its group once the kernel has freed what it held, which a loaded machine can take a
    # while: the group must go then (cgroups.reap_unremoved, run before every new group and at exit), not stay.
    deadline = time.monotonic() + 30
    while left_over() and time.monotonic() < deadline:
        cgroups.reap_unremoved()
        time.sleep(0.5)
    stuck = {folder.name: {name: (folder / name).read_text().split()[:6] for name in
                           ("cgroup.procs", "memory.limit_in_bytes", "memory.max_usage_in_bytes", "memory.oom_control")
                           if (folder / name).exists()} for folder in left_over()}
    why = [group.refused for group in cgroups._UNREMOVED]
    assert not stuck, f"a retired sandbox's group is still there: {stuck}; {why}"
    assert fresh.cgroup.folders["memory"].is_dir()
