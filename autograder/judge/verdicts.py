"""Decide graded cells outside the kernel and write the verdicts where nbgrader reads them.

The flow for one notebook (see docs/ARCHITECTURE.md):

1. :func:`prepare` finds the graded test cells, builds each registered exercise's cases from a seed and writes them
   into ``scratch/cases``;
2. the notebook runs in a kernel with ``$DECODER_COURSE_HARVEST=scratch`` (``decoder_course.harvest.collect`` writes
   ``scratch/outputs``);
3. :func:`decide` judges each exercise from those outputs, and :func:`apply` rewrites each graded cell's outputs so
   that nbgrader's own ``determine_grade`` records exactly the trusted verdict: an error output when it failed,
   none when it passed. Whatever the kernel printed stays visible, but as plain text: a warning on stderr or a
   visible check's traceback can no longer zero a correct answer, and a student cannot forge a pass.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np
from nbformat import NotebookNode

from autograder.course import lessons
from autograder.course.checks import framework
from autograder.course.checks.exercises import run_judge
from autograder.course.checks.framework import REGISTRY, Case, Exercise, Result, Verdict, write_cases
from autograder.judge import policy
from decoder_course.guard import TAMPER
from decoder_course.text import without_escapes

# How verdicts.apply writes a verdict into a graded cell, and autograder.pages.feedback finds it again.
PASSED_PREFIX = "✓ Hidden checks: "  # a passed item's last output: a stdout stream, this and the message
FAILED_NAME = "HiddenCheckFailed"  # a failed item's verdict: the cell's only error output, by this name
# ... and beside it, as data for the instructor's class report (autograder.pages.report): cell.metadata.course.verdict =
# {"item", "passed", "kind", "mistake"}; every submitted copy of it is dropped before grading (RestoreGradingMetadata)
VERDICT_KEY = "verdict"


def exercises_for(lesson: str) -> dict[str, type[Exercise]]:
    """The hidden checks of ``lesson``'s exercises, in the lesson's order: the specs of its visible module
    (``SPECS``) and the ``Exercise`` classes of its checks module, if it has one (imported on first use)."""
    from autograder.course.checks import spec

    lessons.optional_module(lesson, "checks")
    spec.register(lesson, getattr(lessons.module(lesson, "visible"), "SPECS", {}), lessons.module(lesson, "reference"))
    registered = REGISTRY.get(lesson, {})
    return {name: registered[name] for name in lessons.exercises(lesson) if name in registered}


def derive_seed(secret: bytes, lesson: str, student: str, item: str, submission: str = "") -> int:
    """The per-run secret seed of one item: unguessable without the secret, the same on a re-grade.

    ``submission`` (a digest of the submitted code, see :func:`submission_digest`) makes a changed submission get
    new cases: hidden inputs a student carried out of one grading run into their feedback are of no use in the
    next one.
    """
    key = f"{lesson}\0{student}\0{item}" + (f"\0{submission}" if submission else "")
    digest = hashlib.sha256(secret + b"\0" + key.encode()).digest()
    return int.from_bytes(digest[:8], "little")


def submission_digest(nb: NotebookNode) -> str:
    """A digest of every code cell's source: the same submission re-graded gets the same cases."""
    h = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            h.update(cell.source.encode("utf-8", "replace") + b"\0")
    return h.hexdigest()


def graded_test_cells(nb: NotebookNode) -> list[NotebookNode]:
    """Autograded test cells: graded code cells that are not solution cells."""
    cells = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution") and meta.get("grade_id"):
            cells.append(cell)
    return cells


@dataclass
class Plan:
    """What was sent to the kernel, kept by the trusted process to judge the answers."""

    lesson: str
    scratch: Path
    items: dict[str, tuple[Exercise, list[Case]]]
    sources: dict[str, str] = field(default_factory=dict)  # item -> the submitted code of its solution cell(s)
    cells: list[str] = field(default_factory=list)  # every code cell of the submission, for the policy
    outputs: dict[str, tuple] = field(default_factory=dict)  # item -> outputs merged over answer rounds


def solved_in(cell: NotebookNode) -> set[str]:
    """The exercises whose solution ``cell`` holds (none for any other cell)."""
    if cell.cell_type != "code":
        return set()
    meta = cell.get("metadata", {})
    names = list(meta.get("course", {}).get("exercise", []))
    grade_id = meta.get("nbgrader", {}).get("grade_id", "")
    if meta.get("nbgrader", {}).get("solution") and grade_id.endswith("_solution"):
        names.append(grade_id[: -len("_solution")])
    return set(names)


def solution_sources(nb: NotebookNode) -> dict[str, str]:
    """The submitted code of each exercise's solution cell, keyed by exercise name."""
    sources: dict[str, str] = {}
    for cell in nb.cells:
        for name in solved_in(cell):
            sources[name] = sources.get(name, "") + "\n" + cell.source
    return sources


def policy_message(item: str, broken: dict[str, str]) -> str:
    """What the student reads when the exercise reaches what it must be written without."""
    uses = "; ".join(f"`{rule.rstrip('.')}` ({how})" if how else f"`{rule.rstrip('.')}`"
                     for rule, how in broken.items())
    libraries = [rule.rstrip(".") for rule in broken
                 if "." not in rule.rstrip(".") and rule not in policy.DYNAMIC and rule != TAMPER]
    if TAMPER in broken:
        why = ("the grader watches what an exercise with rules calls while its hidden cases run, and your code "
               "turned that off (sys.setprofile, or a thread or a program started around it): leave the grader's "
               "tools alone.")
    elif any(rule in policy.DYNAMIC for rule in broken):
        why = ("code run from a string (eval, exec, compile) hides what the exercise does from the grader: write "
               "the code itself.")
    elif libraries:
        why = (f"this exercise is written without {', '.join(libraries)} (NumPy alone for a NumPy exercise), to "
               "show that you can build it from the basic operations.")
    else:
        why = ("that does this exercise's work for you. The point of the exercise is to write it yourself from "
               "the operations it is made of; PyTorch's version is what we compare against.")
    return (f"your `{item}` reaches {uses}, in its own code or in code it calls anywhere in the notebook: {why}")


def policy_warning(item: str, seen: dict[str, str]) -> str:
    """The source reader's early word, added to a verdict it did not decide: what it read is named, not run."""
    uses = "; ".join(f"`{rule.rstrip('.')}` ({how})" if how else f"`{rule.rstrip('.')}`" for rule, how in seen.items())
    return (f"(A warning, which cost nothing: the code of your `{item}` names {uses}, which this exercise is "
            "written without. Only what runs on the hidden cases decides; leave it out so that it never runs.)")


# How the run-time guard's report reads in the message: the rule was used, not just named.
RUNTIME_HOW = "called while your code ran on the hidden cases"


def reached_at_run_time(ex: Exercise, report: object) -> dict[str, str]:
    """The item's rules that its run-time guard reported broken (:mod:`decoder_course.guard`), read from the
    kernel's report: only the item's own rule texts (and the guard's own), never a text of the kernel's."""
    said = report.get("policy") if isinstance(report, dict) else None
    if not isinstance(said, list) or not getattr(ex, "forbidden", ()):
        return {}
    known = {*ex.forbidden, TAMPER}
    return {rule: RUNTIME_HOW for rule in said[:16] if isinstance(rule, str) and rule in known}


def prepare(nb: NotebookNode, lesson: str, student: str, secret: bytes, scratch: Path) -> Plan:
    """Build and write the cases of every registered exercise that has a graded cell in ``nb``."""
    registered = exercises_for(lesson)
    items: dict[str, tuple[Exercise, list[Case]]] = {}
    digest = submission_digest(nb)
    for cell in graded_test_cells(nb):
        item = cell.metadata["nbgrader"]["grade_id"]
        if item in registered and item not in items:
            ex = registered[item]()
            cases = ex.cases(np.random.default_rng(derive_seed(secret, lesson, student, item, digest)))
            write_cases(scratch / "cases", item, cases, ex.forbidden)
            items[item] = (ex, cases)
    (scratch / "outputs").mkdir(parents=True, exist_ok=True)
    cells = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    return Plan(lesson, scratch, items, solution_sources(nb), cells)


MAX_OUTPUT_BYTES = framework.MAX_OUTPUT_BYTES  # the .npz: arrays plus their headers (harvest's cap + 16 MB)
MAX_LEAVES = framework.MAX_LEAVES


def unreadable_outputs(folder: Path, item: str, max_bytes: int = MAX_OUTPUT_BYTES) -> str | None:
    """Why the kernel's files for ``item`` must not be read (a link, a FIFO, too large, too many arrays, an array
    whose header claims more than its bytes, a compressed or object array), or None when they are plain harvest
    files (:func:`autograder.course.checks.framework.read_outputs`, which grading calls once per judgement)."""
    try:
        framework.read_outputs(folder, item, max_bytes)
    except framework.Unreadable as exc:
        return str(exc)
    return None


# Runs of an item's cases after the first, at most, with answers for building blocks that raised. Each run answers
# the calls the previous one recorded, so a chain of steps (a decoding loop on a wrong cache) goes one step further
# per run; a run that would answer nothing new is not made.
ANSWER_ROUNDS = 8


def answered_cases(ex: Exercise, cases: list[Case], folder: Path, outputs: tuple | None = None) -> list[Case] | None:
    """An item built on the student's other items whose building block raised on its cases: those cases again,
    with a correct building block's answers where the student's raised
    (:func:`autograder.course.checks.relative.answered`),
    to run once more in the same kernel; None when there is nothing to answer (or nothing readable to go by).
    ``outputs``: what the kernel handed in for these cases, when the caller has it (else read from ``folder``)."""
    if not getattr(ex, "uses", ()):
        return None
    from autograder.course.checks import relative

    try:
        outputs = outputs if outputs is not None else framework.read_outputs(folder, ex.name)
        return relative.answered(ex, Result(folder, ex.name, cases, outputs))
    except Exception:  # noqa: BLE001 - outputs the first run could not hand in: judged as they are
        return None


def answer_rounds(plan: Plan, item: str, folder: Path, run: Callable[[list[Case]], None]) -> None:
    """After ``item``'s cases ran once (their outputs in ``folder``): up to :data:`ANSWER_ROUNDS` more runs with a
    correct building block's answers where the student's raised (:func:`answered_cases`). Only the cases that carry
    new answers run again: ``run(cases)`` writes them for the kernel, runs them and leaves their outputs in
    ``folder``; every other case keeps the outputs of its last run. ``plan`` keeps the cases of the last run
    and those merged outputs (``plan.outputs``, which :func:`decide` judges); where a run's outputs cannot be read
    as the harvest writes them, the item is judged on what that run left in ``folder``, as it is."""
    ex, cases = plan.items[item]
    if not getattr(ex, "uses", ()):
        return
    try:
        outputs = plan.outputs[item] = framework.read_outputs(folder, item)
    except framework.Unreadable:
        return
    for _ in range(ANSWER_ROUNDS):
        again = answered_cases(ex, cases, folder, outputs)
        if again is None:
            return
        kept = {id(case) for case in cases}
        ran = [case for case in again if id(case) not in kept]  # the twins with new answers (relative.answered)
        run(ran)  # should it raise (a cell timeout), the last round's cases are judged on that round's outputs
        plan.items[item] = (ex, cases := again)
        try:
            outputs = plan.outputs[item] = _merged(outputs, framework.read_outputs(folder, item), ran)
        except (framework.Unreadable, ValueError, TypeError, KeyError):
            plan.outputs.pop(item, None)
            return


def _merged(previous: tuple, new: tuple, ran: list[Case]) -> tuple[dict, dict]:
    """Outputs as :func:`framework.read_outputs` gives them: ``new``'s for the cases ``ran``, ``previous``'s for
    every other case, in ``previous``'s order."""
    old, fresh = _outputs_by_case(previous), _outputs_by_case(new)
    rerun = {case.id for case in ran}
    report: dict = {"item": previous[0].get("item"), "cases": {}, "leaves": []}
    reached = [rule for outputs in (previous, new) if isinstance(said := outputs[0].get("policy"), list)
               for rule in said[:16]]  # a rule broken in any run stays broken
    if reached:
        report["policy"] = reached
    arrays: dict[str, np.ndarray] = {}
    for case_id in old:
        entry, recorded = (fresh if case_id in rerun else old).get(case_id, ({}, {}))
        report["cases"][case_id] = entry
        for name, array in recorded.items():
            arrays[f"leaf{len(report['leaves'])}"] = array
            report["leaves"].append(f"{case_id}/{name}")
    return report, arrays


def _outputs_by_case(outputs: tuple) -> dict[str, tuple[dict, dict]]:
    """A harvest report and its arrays (:func:`framework.read_outputs`) as case id -> (entry, name -> array)."""
    report, arrays = outputs
    keys = report["leaves"]
    if set(arrays) != {f"leaf{i}" for i in range(len(keys))}:
        raise ValueError("the report and the arrays do not match")
    by_case = {str(case_id): (entry, {}) for case_id, entry in dict(report["cases"]).items()}
    for i, key in enumerate(keys):
        case_id, _, name = str(key).partition("/")
        by_case[case_id][1][name] = arrays[f"leaf{i}"]
    return by_case


_TIME_ADVICE = ("Time this cell on your own machine: a Python loop over elements where one tensor operation would "
                "do, or work repeated on every call, is the usual cause.")


def timed_out_cell(seconds: float, how: str = "") -> str:
    """The verdict of an item whose cell ran past the cell limit
    (``how``: :func:`autograder.sandbox.launch.stretch_note`)."""
    return (f"timed out: this cell ran past its {seconds:g} s time limit{how} before your code finished on the "
            f"hidden cases, so they could not be judged. {_TIME_ADVICE}")


def timed_out_solution(seconds: float, how: str = "") -> str:
    """The verdict of an item whose own solution cell ran past the cell limit (its test cell then failed)."""
    return (f"timed out: the cell with your code for this exercise ran past its {seconds:g} s time limit{how}, so "
            f"the exercise could not be judged. {_TIME_ADVICE}")


def timed_out_notebook(seconds: float, how: str = "") -> str:
    """The verdict of an item whose cell was running, or not reached yet, when the notebook's deadline came."""
    return (f"timed out: the notebook ran past its {seconds:g} s time limit{how} before this cell finished, so "
            f"its hidden cases could not be judged. {_TIME_ADVICE}")


def out_of_memory(limit_bytes: int) -> str:
    """The verdict of an item whose cell was running, or not reached yet, when the notebook's sandbox reached its
    memory limit (every process of it together: see :mod:`autograder.sandbox.cgroups`) and was stopped."""
    return (f"stopped: your notebook's processes together used more than the {limit_bytes / 2**20:g} MB of memory "
            "a notebook may use (arrays, shared memory and files in /tmp, /dev/shm and your home folder all count) "
            "before this cell finished, so the kernel was stopped and its hidden cases could not be judged. Free "
            "what you no longer need (del, smaller arrays, fewer processes) and run the notebook again.")


def not_run_after_timeout(cell: str) -> str:
    """The verdict of an item after a timed-out cell whose kernel had to be stopped."""
    return (f"not run: {cell} timed out and did not stop when interrupted, so the kernel was stopped before this "
            "cell ran. Make that cell faster; this one was not judged.")


def decide(plan: Plan, unfinished: dict[str, str] | None = None) -> dict[str, Verdict]:
    """Judge every planned exercise: first the run-time policy's report (what the guard saw run on the hidden
    cases), then its outputs. The source reader decides nothing: what it finds is a warning added to the message
    (an unused ``import torch`` in a NumPy-only answer's cell costs no point).

    ``unfinished``: items a time limit stopped, with why (``TrustedExecute`` knows which). One that fails says
    that, not what its unfinished cases look like: a slow answer is not a wrong one (and a correct one on a slow
    machine must not read as wrong). One whose cases all finished before the limit is judged as usual."""
    unfinished = unfinished or {}
    decided: dict[str, Verdict] = {}
    sound: dict[str, bool] = {}
    for item, (ex, cases) in plan.items.items():
        own = plan.sources.get(item, "")
        seen = policy.violations(plan.cells or [own], [own], [item], tuple(getattr(ex, "forbidden", ())))
        try:
            outputs, unreadable = plan.outputs.get(item) or framework.read_outputs(plan.scratch / "outputs", item), None
        except framework.Unreadable as exc:
            outputs, unreadable = None, str(exc)
        broken = reached_at_run_time(ex, outputs[0]) if outputs else {}
        if broken:
            decided[item] = Verdict(False, policy_message(item, broken), kind=framework.POLICY)
        elif unreadable:
            decided[item] = Verdict(False, (
                f"the grader refused to read what your notebook handed in for `{item}` ({unreadable}): it was not "
                "written by the course's hidden checks. Do not write into the grading folder."), kind=framework.OTHER)
        else:
            decided[item] = run_judge(ex, plan.scratch / "outputs", cases, sound, outputs)
            if item in unfinished and not decided[item].passed:
                decided[item] = Verdict(False, unfinished[item], kind=framework.TIMED_OUT)
        if seen and not broken:
            decided[item] = replace(decided[item], message=f"{decided[item].message} {policy_warning(item, seen)}")
        # sound: passed, and so did everything it is built on (an item judged relative to a wrong building block
        # can pass while the pieces it calls are wrong: what calls it must not take it for right)
        sound[item] = decided[item].passed and all(sound.get(name, False) for name in getattr(ex, "uses", ()))
    return decided


def _as_text(output: NotebookNode) -> NotebookNode | None:
    """Keep what the kernel showed, but as stdout text that cannot change a grade."""
    if output.output_type == "stream":
        return NotebookNode(output_type="stream", name="stdout", text=output.text)
    if output.output_type == "error":
        lines = [without_escapes(line) for line in output.get("traceback", [])]
        last = lines[-1] if lines else f"{output.get('ename')}: {output.get('evalue')}"
        return NotebookNode(output_type="stream", name="stdout", text=f"[visible check] {last}\n")
    if output.output_type == "execute_result":
        # An execute_result would be read by nbgrader as partial credit: show it as display data instead.
        return NotebookNode(output_type="display_data", data=output.get("data", {}), metadata={})
    return output


def apply(nb: NotebookNode, verdicts: dict[str, Verdict]) -> None:
    """Rewrite graded test cells' outputs so that nbgrader records the trusted verdict and only that."""
    for cell in graded_test_cells(nb):
        item = cell.metadata["nbgrader"]["grade_id"]
        kept = [out for out in (_as_text(o) for o in cell.get("outputs", [])) if out is not None]
        verdict = verdicts.get(item)
        if verdict is None:
            verdict = Verdict(False, "this cell has no hidden checks registered; tell your instructor.",
                              kind=framework.OTHER)
        course = cell.setdefault("metadata", NotebookNode()).setdefault("course", NotebookNode())
        course[VERDICT_KEY] = NotebookNode(item=item, passed=verdict.passed,
                                           kind="" if verdict.passed else verdict.kind or framework.OTHER,
                                           mistake="" if verdict.passed else verdict.mistake)
        if verdict.passed:
            kept.append(NotebookNode(output_type="stream", name="stdout", text=f"{PASSED_PREFIX}{verdict.message}\n"))
        else:
            message = f"✗ Hidden checks for `{item}`: {verdict.message}"
            kept.append(NotebookNode(output_type="error", ename=FAILED_NAME, evalue=verdict.message,
                                     traceback=[message]))
        cell.outputs = kept


def judge_namespace(lesson: str, namespace: dict, secret: bytes = b"in-process", student: str = "test",
                    items: list[str] | None = None) -> dict[str, Verdict]:
    """Judge objects in a Python namespace directly, without a notebook or kernel (tests and authoring).

    The same cases, harvest and verdicts as a grading run; only the kernel is replaced by this process.
    """
    import tempfile

    from decoder_course.harvest import ENV_VAR, collect

    registered = exercises_for(lesson)
    names = items or list(registered)
    with tempfile.TemporaryDirectory(prefix="judge-") as tmp:
        scratch = Path(tmp)
        plan_items = {}
        for item in names:
            ex = registered[item]()
            cases = ex.cases(np.random.default_rng(derive_seed(secret, lesson, student, item)))
            write_cases(scratch / "cases", item, cases, ex.forbidden)
            plan_items[item] = (ex, cases)
        plan = Plan(lesson, scratch, plan_items)
        previous = os.environ.get(ENV_VAR)
        os.environ[ENV_VAR] = str(scratch)
        try:
            for item in names:
                collect(item, namespace)
                answer_rounds(plan, item, scratch / "outputs",
                              partial(_run_in_process, scratch, item, namespace, registered[item].forbidden))
        finally:
            if previous is None:
                os.environ.pop(ENV_VAR, None)
            else:
                os.environ[ENV_VAR] = previous
        return decide(plan)


def _run_in_process(scratch: Path, item: str, namespace: dict, forbidden: tuple[str, ...], cases: list[Case]) -> None:
    """:func:`judge_namespace`'s kernel: write ``cases`` and collect them in this process."""
    from decoder_course.harvest import collect

    write_cases(scratch / "cases", item, cases, forbidden)
    collect(item, namespace)
