"""The visible checks catch what the hidden ones do: every mutant through its lesson's visible checks.

Each wrong answer (``autograder.mutants``) is typed into a kernel-like namespace (``samples.notebook_namespace``)
and its item's visible test cell (the ``# %% test=<item>`` cell of ``solutions/<lesson>.py``) is run there, as
the student would run it before submitting. The rate per lesson is printed; the test fails when the visible
checks catch fewer than 95 % of any lesson's mutants. A catch counts only when the reference passes the same
cell (``test_reference_passes_every_visible_check``), and the namespace holds the lesson's given cells too
(``# %% given=module:names``), so that a missing name is never mistaken for a caught mistake.
"""

import contextlib
import importlib
import io
import re
import warnings

import matplotlib
import pytest

from autograder import lessons, notebooks, samples, verdicts

matplotlib.use("Agg")
TARGET = 0.95


def _test_cells(lesson: str) -> dict[str, str]:
    source = (notebooks.ROOT / "solutions" / f"{lesson}.py").read_text()
    cells = {}
    for cell in re.split(r"(?m)^# %%", source):
        match = re.match(r" test=(\S+)", cell)
        if match:
            cells[match.group(1)] = cell.split("\n", 1)[1]
    return cells


def _givens(lesson: str) -> dict:
    """The objects of the lesson's ``# %% given=module:names`` cells (earlier lessons' reference code)."""
    source = (notebooks.ROOT / "solutions" / f"{lesson}.py").read_text()
    given = {}
    for module, names in re.findall(r"(?m)^# %% given=(\w+):(\S+)", source):
        reference = importlib.import_module(f"autograder.reference.{module}")
        given.update({name: getattr(reference, name) for name in names.split(",")})
    return given


def _namespace(lesson: str, replacement: dict | None = None) -> dict:
    namespace = samples.notebook_namespace(lesson, replacement)
    for name, obj in _givens(lesson).items():
        namespace.setdefault(name, obj)
    return namespace


def _run(lesson: str, item: str, replacement: dict | None, cell: str) -> str | None:
    """Run an item's visible test cell; the failure it raised, or None when it passed."""
    namespace = _namespace(lesson, replacement)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            exec(compile(cell, f"<{lesson} test={item}>", "exec"), namespace)  # noqa: S102 - our own cells
        except Exception as exc:  # noqa: BLE001 - any failure under the exercise is the student finding the bug
            return f"{type(exc).__name__}: {exc}"
    return None


def _caught(lesson: str, item: str, replacement: dict, cell: str) -> bool:
    return _run(lesson, item, replacement, cell) is not None


@pytest.mark.parametrize("lesson", list(lessons.ids()))
def test_reference_passes_every_visible_check(lesson):
    cells = _test_cells(lesson)
    failed = {item: _run(lesson, item, None, cells[item]) for item in verdicts.exercises_for(lesson)}
    failed = {item: why for item, why in failed.items() if why is not None}
    assert not failed, f"the reference fails its own visible checks in {lesson}: {failed}"


def test_visible_checks_catch_at_least_95_percent_of_each_lessons_mutants(capsys):
    caught_all = total = 0
    lines, missed, under = [], [], []
    for lesson in lessons.ids():
        cells = _test_cells(lesson)
        mutants = samples.mutants_of(lesson)
        caught = 0
        for item, description, replacement in mutants:
            if _caught(lesson, item, replacement, cells[item]):
                caught += 1
            else:
                missed.append(f"{lesson} {item}: {description}")
        caught_all, total = caught_all + caught, total + len(mutants)
        if caught < TARGET * len(mutants):
            under.append(f"{lesson} {caught}/{len(mutants)}")
        lines.append(f"{lesson:20s} {caught:3d}/{len(mutants):3d} = {100 * caught / len(mutants):5.1f} %")
    lines.append(f"{'all':20s} {caught_all:3d}/{total:3d} = {100 * caught_all / total:5.1f} %")
    with capsys.disabled():
        print("\nvisible checks, mutants caught per lesson:\n  " + "\n  ".join(lines))
        if missed:
            print("missed:\n  " + "\n  ".join(missed))
    assert not under, f"lessons whose visible checks catch under {TARGET:.0%} of the mutants: {under}; missed: {missed}"
    assert caught_all / total >= TARGET, f"the visible checks catch {caught_all}/{total}; missed: {missed}"


@pytest.mark.parametrize("lesson", list(lessons.ids()))
def test_every_graded_item_has_a_visible_test_cell(lesson):
    missing = set(verdicts.exercises_for(lesson)) - set(_test_cells(lesson))
    assert not missing, f"graded items without a visible test cell in solutions/{lesson}.py: {sorted(missing)}"
