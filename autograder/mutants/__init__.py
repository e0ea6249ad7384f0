"""Realistic wrong answers, per lesson: each must lose its own exercise's points and no others.

The tests prove every hidden check catches them (tests/test_hidden_checks.py); the demo's "typical mistakes"
student is built from them (autograder/samples.py). Instructors can read them as a list of common errors.

A mutant module defines ``MUTANTS``: a list of ``(item, description, replacement)`` where ``replacement`` is a dict
of names to bind in the lesson's namespace (usually the one wrong function or class, or its source). Build them with
:func:`mutant`, and :func:`shown_bug` for the buggy version a find-the-bug exercise's release shows.
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
