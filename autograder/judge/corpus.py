"""How the corpus of realistic mistakes (:mod:`autograder.course.mutants`) is caught, in-process: each wrong answer
through its item's visible test cell, as the student runs it before submitting, and through the hidden checks, as
graded. One source for the tests (tests/test_visible_catch_rate.py, tests/test_hidden_checks.py and the lessons'
promise tests) and the published rates (bench/catch_rate.py).
"""

import contextlib
import importlib
import io
import re
import warnings

from autograder.course import mutants, notebooks, samples
from autograder.judge import verdicts


def visible_test_cells(lesson: str) -> dict[str, str]:
    """Each graded item's visible test cell (``# %% test=<item>`` in ``solutions/<lesson>.py``), by item."""
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
        reference = importlib.import_module(f"autograder.course.reference.{module}")
        given.update({name: getattr(reference, name) for name in names.split(",")})
    return given


def run_visible(lesson: str, item: str, replacement: dict | None, cell: str | None = None) -> str | None:
    """Run ``item``'s visible test cell in a kernel-like namespace holding ``replacement`` (None: the reference)
    and the lesson's given cells, as the student runs it before submitting: the failure it raised, or None when it
    passed. The given cells are there so that a missing name is never mistaken for a caught mistake."""
    cell = visible_test_cells(lesson)[item] if cell is None else cell
    namespace = samples.notebook_namespace(lesson, replacement)
    for name, obj in _givens(lesson).items():
        namespace.setdefault(name, obj)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            exec(compile(cell, f"<{lesson} test={item}>", "exec"), namespace)  # noqa: S102 - our own cells
        except Exception as exc:  # noqa: BLE001 - any failure under the exercise is the student finding the bug
            return f"{type(exc).__name__}: {exc}"
    return None


def hidden_verdicts(lesson: str, replacement: dict | None, secret: bytes | None = None, **judge) -> dict:
    """The hidden checks' verdicts, by item, on the lesson's reference with ``replacement`` typed after it."""
    if secret is not None:
        judge["secret"] = secret
    return verdicts.judge_namespace(lesson, samples.notebook_namespace(lesson, replacement), **judge)


def catch(lesson: str, first_of_each: bool = False) -> list[dict]:
    """Each wrong answer of ``lesson`` through both layers of checks: its item, description, whether the hidden
    checks fail its item (``hidden``), the items they fail besides it (``others``), whether its visible test cell
    fails (``visible``), and the hidden message of its item (``message``). ``first_of_each``: only the first wrong
    answer of each item (a quick look)."""
    cells = visible_test_cells(lesson)
    found = []
    seen = set()
    for item, description, replacement in mutants.of(lesson):
        if first_of_each and item in seen:
            continue
        seen.add(item)
        decided = hidden_verdicts(lesson, replacement)
        found.append({"item": item, "description": description, "hidden": not decided[item].passed,
                      "others": sorted(other for other, v in decided.items() if other != item and not v.passed),
                      "visible": run_visible(lesson, item, replacement, cells[item]) is not None,
                      "message": decided[item].message})
    return found


def rates(caught: list[dict]) -> dict:
    """The published rates of a list of :func:`catch` records: ``visible`` (caught by the visible cell, among
    those the hidden checks catch), ``strict`` (those costing exactly their own item in the hidden grading, among
    all), with their counts."""
    hidden = [c for c in caught if c["hidden"]]
    visible = sum(c["visible"] for c in hidden)
    strict = sum(c["hidden"] and not c["others"] for c in caught)
    return {"mistakes": len(caught), "hidden": len(hidden), "visible": visible, "strict": strict,
            "visible_rate": visible / len(hidden) if hidden else 1.0,
            "strict_rate": strict / len(caught) if caught else 1.0}
