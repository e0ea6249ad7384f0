"""Realistic wrong answers, per lesson: each must lose its own exercise's points and no others.

The tests prove every hidden check catches them (tests/test_hidden_checks.py); the demo's "typical mistakes"
student is built from them (autograder/samples.py). Instructors can read them as a list of common errors.

A mutant module defines ``MUTANTS``: a list of ``(item, description, replacement)`` where ``replacement`` is a dict
of names to bind in the lesson's namespace (usually the one wrong function or class). Build them with :func:`mutant`.
"""

from collections.abc import Callable

Mutant = tuple[str, str, dict]


def mutant(registry: list, item: str, description: str, name: str | None = None) -> Callable:
    """Decorator: register the decorated function/class as a wrong answer to ``item``."""

    def register(obj):
        registry.append((item, description, {name or obj.__name__: obj}))
        return obj

    return register
