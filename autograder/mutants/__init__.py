"""Realistic wrong answers, per lesson: each must lose its own exercise's points and no others.

The tests prove every hidden check catches them (tests/test_hidden_checks.py); the demo's "typical mistakes"
student is built from them (autograder/samples.py). Instructors can read them as a list of common errors.

A mutant module defines ``MUTANTS``: a list of ``(item, description, replacement)`` where ``replacement`` is a dict
of names to bind in the lesson's namespace (usually the one wrong function or class, or its source). Build them with
:func:`patched` (the reference's own code with a few lines changed: the usual form, since a realistic mistake is
one line), :func:`mutant` (a whole wrong function or class, where the mistake is a different structure), and
:func:`shown_bug` for the buggy version a find-the-bug exercise's release shows.
"""

from collections.abc import Callable

Mutant = tuple[str, str, dict]


def mutant(registry: list, item: str, description: str, name: str | None = None) -> Callable:
    """Decorator: register the decorated function/class as a wrong answer to ``item``."""

    def register(obj):
        registry.append((item, description, {name or obj.__name__: obj}))
        return obj

    return register


def shown_bug(registry: list, lesson: str, item: str, description: str) -> None:
    """Register what the release of a find-the-bug exercise shows (:mod:`autograder.bugs`) as a wrong answer to
    ``item``: the tests then prove that the untouched release loses that item and no other, and that its visible
    check finds the bug."""
    from autograder import notebooks

    registry.append((item, f"the bug the release shows: {description}", {item: notebooks.buggy_source(lesson, item)}))


def patched(registry: list, lesson: str, item: str, description: str, *edits: tuple[str, str],
            name: str | None = None) -> None:
    """Register the reference's code of ``name`` (default: ``item``) with each ``(old, new)`` edit applied, as the
    wrong answer to ``item``: a mutant is the one line a student got wrong, not a copy of the whole answer.

    Each ``old`` must occur exactly once in the reference's source (markers and bug blocks removed), so that a
    change to the reference that moves the mistaken line breaks the mutant loudly instead of silently making it
    correct. ``new`` may span several lines (keep the indentation of the line it replaces).
    """
    from autograder import notebooks

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
