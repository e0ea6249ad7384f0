"""Realistic wrong answers, per lesson: each must lose its own exercise's points and no others.

The tests prove every hidden check catches them, and that the visible checks catch them too
(tests/test_hidden_checks.py, tests/test_visible_catch_rate.py); the hidden checks name the one a student's values
match; the demo's "typical mistakes" student is built from them (autograder/course/samples.py). Instructors can read
them
as a list of common errors.

A lesson's wrong answers (:func:`of`) are ``(item, description, replacement)``, ``replacement`` a dict of names to
bind in the lesson's namespace (the one wrong function or class, or its source). Most are a line or two of the
reference changed: its module's ``MISTAKES`` table, beside the code it patches, ``(item, description, (old, new),
...)`` applied by :func:`patched`; ``(item, description)`` alone is the bug a find-the-bug exercise's release shows
(:func:`shown_bug`). A mistake of another structure altogether is written whole, as a student would type it, in
the lesson's optional mutants module (``mNN_<slug>.py``, its ``MUTANTS`` built with :func:`mutant`).
"""

import contextlib
import functools
import importlib
import io
import re
import warnings
from collections.abc import Callable

Mutant = tuple[str, str, dict]


def mutant(registry: list, item: str, description: str, name: str | None = None) -> Callable:
    """Decorator: register the decorated function/class as a wrong answer to ``item``."""

    def register(obj):
        registry.append((item, description, {name or obj.__name__: obj}))
        return obj

    return register


def shown_bug(registry: list, lesson: str, item: str, description: str) -> None:
    """Register what the release of a find-the-bug exercise shows (:mod:`autograder.course.bugs`) as a wrong answer to
    ``item``: the tests then prove that the untouched release loses that item and no other, and that its visible
    check finds the bug."""
    from autograder.course import notebooks

    registry.append((item, f"the bug the release shows: {description}", {item: notebooks.buggy_source(lesson, item)}))


def patched(registry: list, lesson: str, item: str, description: str, *edits: tuple[str, str],
            name: str | None = None) -> None:
    """Register the reference's code of ``name`` (default: ``item``) with each ``(old, new)`` edit applied, as the
    wrong answer to ``item``: a mutant is the one line a student got wrong, not a copy of the whole answer.

    Each ``old`` must occur exactly once in the reference's source (markers and bug blocks removed), so that a
    change to the reference that moves the mistaken line breaks the mutant loudly instead of silently making it
    correct. ``new`` may span several lines (keep the indentation of the line it replaces).
    """
    from autograder.course import notebooks

    source = notebooks.reference_source(lesson, name or item, keep_markers=False)
    for old, new in edits:
        count = source.count(old)
        if count != 1:
            raise ValueError(f"mutant {item!r} ({description}): {old!r} occurs {count} times in the reference's "
                             f"{name or item}, not once: make it longer so that it names one place")
        source = source.replace(old, new)
    if source == notebooks.reference_source(lesson, name or item, keep_markers=False):
        raise ValueError(f"mutant {item!r} ({description}) changes nothing")
    registry.append((item, description, {name or item: source}))


@functools.cache
def of(lesson: str) -> tuple[Mutant, ...]:
    """Every known wrong answer of ``lesson``, in the order of its exercises: for each, the reference's ``MISTAKES``
    (patches of its code, in the table's order), then the whole wrong answers of the mutants module, if any."""
    from autograder.course import lessons

    found: list = []
    for item, description, *edits in getattr(lessons.module(lesson, "reference"), "MISTAKES", ()):
        if edits:
            patched(found, lesson, item, description, *edits)
        else:
            shown_bug(found, lesson, item, description)
    extra = lessons.optional_module(lesson, "mutants")
    found += extra.MUTANTS if extra is not None else []
    order = {name: i for i, name in enumerate(lessons.exercises(lesson))}
    unknown = [item for item, _, _ in found if item not in order]
    if unknown:
        raise ValueError(f"{lesson}: wrong answers to {sorted(set(unknown))}, which are not exercises of the lesson")
    return tuple(sorted(found, key=lambda m: order[m[0]]))  # stable: each item's mistakes keep their order


# How the corpus is caught: the visible test cells and the hidden checks, in-process. One source for the tests
# (tests/test_visible_catch_rate.py, tests/test_hidden_checks.py) and the published rates (bench/catch_rate.py).


def visible_test_cells(lesson: str) -> dict[str, str]:
    """Each graded item's visible test cell (``# %% test=<item>`` in ``solutions/<lesson>.py``), by item."""
    from autograder.course import notebooks

    source = (notebooks.ROOT / "solutions" / f"{lesson}.py").read_text()
    cells = {}
    for cell in re.split(r"(?m)^# %%", source):
        match = re.match(r" test=(\S+)", cell)
        if match:
            cells[match.group(1)] = cell.split("\n", 1)[1]
    return cells


def _givens(lesson: str) -> dict:
    """The objects of the lesson's ``# %% given=module:names`` cells (earlier lessons' reference code)."""
    from autograder.course import notebooks

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
    from autograder.course import samples

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
    from autograder.course import samples
    from autograder.judge import verdicts

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
    for item, description, replacement in of(lesson):
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
