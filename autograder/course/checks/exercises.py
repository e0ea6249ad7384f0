"""Exercises by lesson: :func:`exercise` registers a check class, :func:`run_judge` judges one from the kernel's
outputs and turns any failure into a teaching verdict.

Above :mod:`~autograder.course.checks.framework` (cases, results, failures, verdicts) and
:mod:`~autograder.course.checks.relative` (an item judged relative to the student's own building blocks, which
builds on the framework): an exercise that ``uses`` other items goes through the latter, so this module is where
the two meet, and neither imports the other's caller.
"""

from __future__ import annotations

from pathlib import Path

from autograder.course import lessons
from autograder.course.checks import relative
from autograder.course.checks.framework import (
    _NAMED,
    NOT_ATTEMPTED,
    OTHER,
    PASSED_MESSAGE,
    RAISED,
    REGISTRY,
    WRONG_VALUES,
    Case,
    Exercise,
    Fail,
    Raised,
    Result,
    Unobservable,
    Verdict,
)


def exercise(lesson: str, name: str):
    """Register an exercise class under ``lesson`` and its graded cell id ``name`` (its points are the cell's, as
    the solution marks them: :func:`autograder.course.lessons.points`)."""

    def register(cls):
        cls.lesson, cls.name, cls.points = lesson, name, lessons.points(lesson).get(name, 1.0)
        REGISTRY.setdefault(lesson, {})[name] = cls
        if cls.uses:  # built on the student's other items: watch their calls (autograder.course.checks.relative)
            make_cases = cls.cases

            def cases(self, rng):
                return relative.watch(make_cases(self, rng), tuple(cls.uses))

            cls.cases = cases
        return cls

    return register


# -- building cases ---------------------------------------------------------------------------------------------
def _not_attempted(result: Result | None) -> bool:
    """Whether the student's code raised NotImplementedError on a case: the released stub, left as it was."""
    for case_id in (result.cases if result is not None else {}):
        try:
            error = result.error(case_id)
        except Fail:
            continue
        if error and error.strip().splitlines()[-1].startswith("NotImplementedError"):
            return True
    return False


def _quotes_an_error(result: Result | None, message: str) -> bool:
    """Whether a verdict quotes an exception the student's code raised on one of its cases."""
    for case_id in (result.cases if result is not None else {}):
        try:
            error = result.error(case_id)
        except Fail:
            continue
        if error and error.strip() and error.strip().splitlines()[-1] in message:
            return True
    return False


def run_judge(ex: Exercise, folder: Path, cases: list[Case], passed: dict[str, bool] | None = None,
              outputs: tuple | None = None) -> Verdict:
    """Judge one exercise from the kernel's outputs in ``folder``; any failure becomes a teaching verdict.

    ``passed`` holds the verdicts of the notebook's items judged before this one: an item built on the student's
    other items (``uses``) whose building blocks all passed their own checks is judged by its own checks alone."""
    result = None
    named: list[str] = []
    token = _NAMED.set(named)
    try:
        result = Result(folder, ex.name, cases, outputs)
        if ex.uses:
            relative.judge(ex, result, passed)
        else:
            ex.judge(result)
    except Fail as fail:
        raised = isinstance(fail, Raised) or _quotes_an_error(result, str(fail))
        mistake = "" if raised else fail.mistake or (named[-1] if named else "")
        kind = (NOT_ATTEMPTED if raised and _not_attempted(result) else RAISED if raised else
                WRONG_VALUES if fail.kind == OTHER and mistake else fail.kind)  # a property broken by a known mistake
        return Verdict(False, str(fail), raised=raised, unobservable=isinstance(fail, Unobservable), kind=kind,
                       mistake=mistake)
    except Exception as exc:  # a grader bug must not look like the student's fault; say so plainly
        return Verdict(False, f"the grader could not judge this exercise ({type(exc).__name__}: {exc}); "
                              "tell your instructor.", kind=OTHER)
    finally:
        _NAMED.reset(token)
    return Verdict(True, PASSED_MESSAGE.format(n=len(cases)))
