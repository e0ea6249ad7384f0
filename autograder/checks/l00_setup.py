"""Hidden checks of lesson 00-setup: the einops ``rearrange`` warm-ups on (B, T, D) arrays.

Every input holds distinct values, so a rearrangement that lands any entry in the wrong place is seen; B, T
and D differ in every case (a swapped axis cannot hide), and one case has B = 1 and one T = 1 (shape
generality). One row per warm-up (its shapes, the output's axes, what a wrong shape and wrong values teach)
feeds the same cases and the same judge: the reference's shape, then its values, then the input unchanged.
"""

from __future__ import annotations

import numpy as np

from autograder.checks import judges
from autograder.checks.framework import Case, Exercise, Fail, Result, exercise, expect_close
from autograder.reference import setup as ref

LESSON = "00-setup"


def _distinct(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Distinct float values in a random order: every misplaced entry shows."""
    n = int(np.prod(shape))
    return (rng.permutation(n) + rng.random(n)).reshape(shape)


class _Warmup(Exercise):
    """Call ``self.name`` on distinct values of each shape; judge against the reference of that name."""

    shapes: list[tuple[int, int, int]] = []
    heads: dict[tuple[int, int, int], list[int]] = {}  # H to draw from, per shape (split_last only)
    axes = ""  # the output's axes, as the shape message names them
    shape_hint = ""
    value_hint = ""

    def cases(self, rng):
        cases = []
        for i, (B, T, D) in enumerate(self.shapes):
            x = _distinct(rng, (B, T, D))
            args = [int(rng.choice(self.heads[B, T, D]))] if self.heads else []
            desc = f"x of shape (B, T, D) = ({B}, {T}, {D})" + (f", H={args[0]}" if args else "")
            case = Case(f"c{i}", desc, data={"x": x, "args": args})
            case.let("x", case.array(x))
            case.call(self.name, {"ref": "x"}, *args, record="out")
            judges.record_after(case, ["x"])
            cases.append(case)
        return cases

    def hint_for_shape(self, result: Result, case: Case) -> str:
        return self.shape_hint

    def judge(self, result: Result):
        for case in result.cases.values():
            x, args = case.data["x"], case.data["args"]
            what = f"{self.name}({', '.join(['x'] + ['H'] * len(args))})"
            want = getattr(ref, self.name)(x, *args)
            got = result.get(case.id, "out", what=what, kind="array")
            if got.shape != want.shape:
                raise Fail(f"{what} should have shape ({self.axes}) = {want.shape}, got {got.shape} ({case.desc}). "
                           f"{self.hint_for_shape(result, case)}")
            expect_close(got, want, what, case.desc, hint=self.value_hint)
            judges.unchanged(result, case.id, {"x": x}, self.name)


@exercise(LESSON, "flatten_batch")
class FlattenBatch(_Warmup):
    shapes = [(2, 3, 4), (3, 5, 2), (1, 4, 3), (4, 1, 5)]
    axes = "B * T, D"
    shape_hint = "Merge the batch and time axes, and keep D as it is."
    value_hint = ("Row b * T + t must be x[b, t]: all of sequence 0 first, then sequence 1, ... In '(b t)' the "
                  "first name varies slowest.")


@exercise(LESSON, "time_major")
class TimeMajor(_Warmup):
    shapes = [(2, 3, 4), (4, 2, 3), (1, 5, 2), (3, 1, 4), (3, 3, 2)]
    axes = "T, B, D"
    shape_hint = "Only the first two axes swap; D stays last."
    value_hint = ("out[t, b] must be x[b, t]: the axes swap, the values move with them. A reshape to (T, B, D) "
                  "keeps the memory order and only relabels it: it is not a transpose.")


@exercise(LESSON, "split_last")
class SplitLast(_Warmup):
    shapes = [(2, 3, 12), (3, 2, 8), (1, 4, 10), (2, 5, 6), (2, 1, 6)]
    # H per shape: H >= 2 and Dh >= 2 and H != B, T except one H = 1 case (shape generality)
    heads = {(2, 3, 12): [4, 6], (3, 2, 8): [4], (1, 4, 10): [5], (2, 5, 6): [1], (2, 1, 6): [3]}
    axes = "B, T, H, Dh"
    shape_hint = "D splits into H groups of Dh = D // H features; B and T stay where they are."
    value_hint = ("Group h must hold the consecutive features h * Dh ... (h + 1) * Dh - 1 of x[b, t]: in '(h dh)' "
                  "h varies slowest, so each group is a consecutive slice.")

    def hint_for_shape(self, result, case):
        (B, T, _), (H,) = case.data["x"].shape, case.data["args"]
        shape = result.meta(case.id, "out").get("shape", [])
        if len(shape) == 4 and shape[:2] == [B, T] and shape[2] != H:
            return f"You made {shape[2]} groups, but H = {H}: use the H argument, not a fixed number."
        return self.shape_hint
