"""Hidden checks of find-the-bug exercises (:mod:`autograder.course.bugs`): the checks of the exercise with that
contract.

A fixed implementation keeps the contract of one of the lesson's exercises (``judged_as``), so it is judged by that
exercise's own cases and verdicts, with no check code copied: a subclass of the existing check class with this
mixin first calls the fixed name where the cases called the original, and names it in the messages::

    @exercise(LESSON, "fixed_attention")
    class FixedAttention(FindTheBug, ScaledDotProductAttention):
        judged_as = "scaled_dot_product_attention"

The given implementation calls nothing the student writes (it is self-contained), so the item is judged on its
own (``uses = ()``): the original's watched calls are dropped from its cases.
"""

from __future__ import annotations

import re

from autograder.course.checks.framework import Fail, Result


def _renamed(value, old: str, new: str):
    if isinstance(value, dict):
        if value.get("global") == old and len(value) == 1:
            return {"global": new}
        return {key: _renamed(item, old, new) for key, item in value.items()}
    if isinstance(value, list):
        return [_renamed(item, old, new) for item in value]
    return value


def _unwatched(steps: list[dict]) -> list[dict]:
    """A case's steps without the spy that ``uses`` put around them (autograder.course.checks.relative.watch)."""
    if len(steps) == 1 and "spy" in steps[0]:
        return steps[0]["steps"]
    return steps


class FindTheBug:
    """Mixin (first base) for a find-the-bug exercise judged by the checks of the exercise ``judged_as``."""

    judged_as: str = ""  # the exercise whose contract, cases and verdicts this one shares
    uses: tuple[str, ...] = ()  # the given implementation is self-contained

    def cases(self, rng):
        cases = super().cases(rng)
        for case in cases:
            case.steps = _renamed(_unwatched(case.steps), self.judged_as, self.name)
        return cases

    def judge(self, result: Result) -> None:
        try:
            super().judge(result)
        except Fail as fail:
            raise Fail(re.sub(rf"\b{re.escape(self.judged_as)}\b", self.name, str(fail))) from None
