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

import functools
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

