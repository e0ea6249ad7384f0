"""`decoder_course.harvest.collect` runs the hidden cases in a forked child: nothing the student's code keeps
comes back, a crash, an exit or a hang costs only the unfinished cases, and the outputs are those of the
in-process harvest. No kernel: collect runs in this process on a harvest folder written by the trusted side.
"""

from __future__ import annotations

import builtins
import importlib
import json
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from autograder.course import lessons, notebooks
from autograder.course.checks.exercises import run_judge
from autograder.course.checks.framework import write_cases
from autograder.judge import verdicts
from decoder_course import harvest

MASKS = "01-masks"


def _prepare(folder: Path, lesson: str, item: str, seed: int = 7):
    ex = verdicts.exercises_for(lesson)[item]()
    cases = ex.cases(np.random.default_rng(seed))
    write_cases(folder / "cases", item, cases)
    return ex, cases


def _outputs(folder: Path, item: str) -> tuple[dict, dict]:
    report = json.loads((folder / "outputs" / f"{item}.json").read_text())
    with np.load(folder / "outputs" / f"{item}.npz", allow_pickle=False) as npz:
        leaves = {key: npz[f"leaf{i}"] for i, key in enumerate(report["leaves"])}
    return report, leaves


def _children() -> list[tuple[int, str]]:
    """This process's children, zombies included (a zombie is a child nobody reaped)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid():
                found.append((int(name), fields[0]))
    return found


def _namespace(source: str) -> dict:
    """A notebook's globals: ``source`` run in a fresh namespace that already imported NumPy as np."""
    namespace = {"np": np, "__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)
    return namespace


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv(harvest.ENV_VAR, str(tmp_path))
    assert _children() == []
    yield tmp_path
    assert _children() == [], "collect left a child process behind"


STASHING = """
import builtins
seen = []
class Keeper:
    calls = []
def _make():
    kept = []
    def padding_mask(token_ids, pad_id):
        seen.append((token_ids.copy(), pad_id))
        kept.append(token_ids.copy())
        Keeper.calls.append(pad_id)
        np._stash = getattr(np, "_stash", []) + [token_ids.copy()]
        builtins._stash = token_ids.copy()
        print("hidden:", token_ids.tolist(), pad_id)
        os.write(1, b"C-level: " + token_ids.tobytes() + b"\\n")
        return token_ids != pad_id
    return padding_mask, kept
import os
padding_mask, kept = _make()
"""


def test_what_the_students_code_keeps_does_not_survive_collect(folder, capfd):
    ex, cases = _prepare(folder, MASKS, "padding_mask")
    ns = _namespace(STASHING)
    before = dict(ns)
    harvest.collect("padding_mask", ns)
    assert ns == before and ns["seen"] == [] and ns["kept"] == [] and ns["Keeper"].calls == []
    assert not hasattr(np, "_stash") and not hasattr(builtins, "_stash")
    assert capfd.readouterr() == ("", ""), "the child printed into this process's output"
    assert run_judge(ex, folder / "outputs", cases).passed


def _crash_on_second_call(action: str) -> dict:
    return _namespace(f"""
import ctypes, os, sys
calls = [0]
def causal_mask(T):
    calls[0] += 1
    if calls[0] == 2:
        {action}
    return np.tril(np.ones((T, T), dtype=bool))
""")


@pytest.mark.parametrize("action,error", [
    ("os._exit(3)", r"^Exited: your code ended the process running it on this case \(exit status 3"),
    ("ctypes.string_at(0)", r"^Crashed: .* killed by SIGSEGV \(a segmentation fault"),
    ("os.kill(os.getpid(), 9)", r"^Crashed: .* killed by SIGKILL"),
])
def test_a_child_that_dies_costs_only_its_unfinished_cases(folder, action, error):
    ex, cases = _prepare(folder, MASKS, "causal_mask")
    harvest.collect("causal_mask", _crash_on_second_call(action))
    report, leaves = _outputs(folder, "causal_mask")
    first, second, *rest = (report["cases"][case.id] for case in cases)
    assert "error" not in first and "c0/out" in leaves, "a case that finished lost its result"
    assert re.search(error, second["error"]), second["error"]
    assert rest and all(entry["error"].startswith("not run: an earlier hidden case") for entry in rest)
    verdict = run_judge(ex, folder / "outputs", cases)
    assert not verdict.passed and cases[1].desc in verdict.message, verdict.message


def test_an_interrupt_kills_a_hanging_child_and_is_raised_again(folder):
    ex, cases = _prepare(folder, MASKS, "causal_mask")
    ns = _namespace("def causal_mask(T):\n    while True:\n        pass\n")

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    started = time.perf_counter()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(KeyboardInterrupt):
            harvest.collect("causal_mask", ns)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.perf_counter() - started < 5
    report, _ = _outputs(folder, "causal_mask")
    errors = [report["cases"][case.id]["error"] for case in cases]
    assert errors[0].startswith("KeyboardInterrupt: interrupted"), errors
    assert all(e.startswith("not run") for e in errors[1:]), errors
    assert not run_judge(ex, folder / "outputs", cases).passed


def test_exceptions_exits_and_input_in_the_students_code_are_errors_of_their_case(folder):
    _, cases = _prepare(folder, MASKS, "causal_mask")
    ns = _namespace("""
import sys
def causal_mask(T):
    if T == 1:
        sys.exit(0)
    if T == 2:
        input("an answer? ")
    raise KeyboardInterrupt
""")
    harvest.collect("causal_mask", ns)
    report, _ = _outputs(folder, "causal_mask")
    errors = [report["cases"][case.id]["error"] for case in cases]
    assert errors[0] == "SystemExit: 0" and errors[1].startswith("EOFError: input() is not available")
    assert all(e == "KeyboardInterrupt" for e in errors[2:]), errors


def test_too_large_outputs_are_refused_as_before(folder):
    _, cases = _prepare(folder, MASKS, "causal_mask")
    ns = _namespace("def causal_mask(T):\n    return np.ones((T, T, (16 << 20) // (T * T) + 1), dtype=bool)\n")
    harvest.collect("causal_mask", ns)
    report, leaves = _outputs(folder, "causal_mask")
    assert leaves == {}
    assert all("MB that can be handed in" in report["cases"][case.id]["error"] for case in cases)


def test_planted_links_and_fifos_are_replaced_and_the_grader_refuses_them(folder, tmp_path):
    _, cases = _prepare(folder, MASKS, "causal_mask")
    out = folder / "outputs"
    out.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("s3cret")
    os.symlink(secret, out / "causal_mask.npz")
    os.mkfifo(out / "causal_mask.json")
    assert verdicts.unreadable_outputs(out, "causal_mask") == "causal_mask.json is not a plain file"
    (out / "causal_mask.json").unlink()
    (out / "causal_mask.json").write_text("{}")
    assert verdicts.unreadable_outputs(out, "causal_mask") == "causal_mask.npz is not a plain file"
    harvest.collect("causal_mask", _namespace("def causal_mask(T):\n    return np.tril(np.ones((T, T), bool))\n"))
    assert secret.read_text() == "s3cret" and not (out / "causal_mask.npz").is_symlink()
    assert verdicts.unreadable_outputs(out, "causal_mask") is None
    assert sorted(p.name for p in out.iterdir()) == ["causal_mask.json", "causal_mask.npz"], "a partial file left"


def test_without_fork_the_cases_run_in_process(folder, monkeypatch):
    ex, cases = _prepare(folder, MASKS, "padding_mask")
    monkeypatch.delattr(os, "fork")
    ns = _namespace(STASHING.replace('os.write(1, b"C-level: " + token_ids.tobytes() + b"\\n")', ""))
    try:
        harvest.collect("padding_mask", ns)
    finally:
        for owner in (np, builtins):
            if hasattr(owner, "_stash"):
                delattr(owner, "_stash")
    assert len(ns["seen"]) == len(cases), "in process, what the code keeps stays (no fork here)"
    assert run_judge(ex, folder / "outputs", cases).passed


def test_a_fork_that_fails_is_an_error_of_every_case(folder, monkeypatch):
    _, cases = _prepare(folder, MASKS, "causal_mask")

    def refuse():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refuse)
    harvest.collect("causal_mask", _namespace("def causal_mask(T):\n    return np.tril(np.ones((T, T), bool))\n"))
    report, _ = _outputs(folder, "causal_mask")
    errors = [report["cases"][case.id]["error"] for case in cases]
    assert errors[0].startswith("OSError: the grader could not start a process") and len(errors) == len(cases)


def test_outside_grading_collect_does_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(harvest.ENV_VAR, raising=False)
    harvest.collect("causal_mask", {})
    assert _children() == []


def _reference_namespace(lesson: str) -> dict:
    module = importlib.import_module(f"autograder.course.reference.{notebooks.REFERENCE_MODULES[lesson]}")
    return dict(vars(module))


def _comparable(report: dict) -> dict:
    for entry in report["cases"].values():
        entry.pop("seconds")
    return report


@pytest.mark.parametrize("lesson", [lesson for lesson in lessons.ids() if lesson != "00-setup"])
def test_outputs_are_those_of_the_in_process_harvest(folder, lesson):
    """Seeds, generators, autocast and torch's thread pool behave in the child as they did in the kernel."""
    torch = pytest.importorskip("torch")
    ns = _reference_namespace(lesson)
    for item in verdicts.exercises_for(lesson):
        _prepare(folder, lesson, item)
        got = {}
        for how in ("in process", "forked"):
            torch.manual_seed(1234)
            np.random.seed(1234)
            if how == "forked":
                harvest.collect(item, ns)
            else:
                harvest._collect_in_process(item, ns, folder)
            got[how] = _outputs(folder, item)
        (report_a, leaves_a), (report_b, leaves_b) = got.values()
        assert _comparable(report_a) == _comparable(report_b), f"{lesson} {item}: the reports differ"
        assert leaves_a.keys() == leaves_b.keys()
        for key, array in leaves_a.items():
            same = array.dtype == leaves_b[key].dtype and np.array_equal(array, leaves_b[key], equal_nan=True)
            # What differs between two in-process runs too: unseeded draws (fresh entropy), memory addresses.
            assert same or key.split("/")[0].startswith("unseeded") or "/ptr_" in key, f"{lesson} {item} {key}"
        assert run_judge(verdicts.exercises_for(lesson)[item](), folder / "outputs",
                         verdicts.exercises_for(lesson)[item]().cases(np.random.default_rng(7))).passed


def test_torch_threads_in_the_child_do_not_deadlock(folder):
    """The parent's intra-op pool is busy before the fork; the child's matmuls finish (torch runs it on one)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(512, 512)
        for _ in range(5):
            x = torch.tanh(x @ x)  # the pool's threads exist now
        y = np.random.default_rng(0).standard_normal((512, 512))
        y = y @ y  # and NumPy's BLAS threads
        _, cases = _prepare(folder, MASKS, "causal_mask")
        ns = _namespace("""
import torch
def causal_mask(T):
    a = torch.randn(384, 384)
    for _ in range(3):
        a = torch.tanh(a @ a)
    b = np.ones((384, 384)) @ np.ones((384, 384))
    assert torch.get_num_threads() == 1 and b[0, 0] == 384
    return np.tril(np.ones((T, T), dtype=bool)) & bool(torch.isfinite(a).all())
""")
        started = time.perf_counter()
        harvest.collect("causal_mask", ns)
        assert time.perf_counter() - started < 60
        report, _ = _outputs(folder, "causal_mask")
        assert all("error" not in report["cases"][case.id] for case in cases), report
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("version", [None, (1, 0), (2, 0), (3, 0)])
def test_the_fast_array_header_reader_reads_what_numpys_does(version):
    """framework._npy_header matches np.save's headers itself (numpy's reader evaluates them as literals):
    whatever it reads must be what numpy reads, and a header it does not match goes to numpy's reader."""
    import io

    from autograder.course.checks import framework

    arrays = [np.zeros(()), np.arange(5), np.ones((2, 3), np.float32), np.asfortranarray(np.ones((3, 4))),
              np.zeros((0, 3), bool), np.ones((2, 1, 3, 5), np.float16), np.array(["ab", "c"]),
              np.arange(6).astype(">i4"), np.zeros(2, dtype=[("a", "<f4"), ("b", "<i2")])]
    fast = 0
    for array in arrays:
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, array, version=version)
        data = bytearray(buffer.getvalue())
        head = io.BytesIO(bytes(data))
        major = np.lib.format.read_magic(head)
        read = np.lib.format.read_array_header_1_0 if major == (1, 0) else np.lib.format.read_array_header_2_0
        assert framework._npy_header(data, 0, len(data)) == (*read(head), head.tell()), (array.dtype, version)
        fast += framework._NPY_HEADER.fullmatch(bytes(data[8 + (2 if major == (1, 0) else 4): head.tell()])) is not None
    assert fast == len(arrays) - 1, "only the structured dtype should need numpy's reader"
