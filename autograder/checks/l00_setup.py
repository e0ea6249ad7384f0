"""Hidden checks of lesson 00-setup: the einops ``rearrange`` warm-ups on (B, T, D) arrays.

Every input holds distinct values, so a rearrangement that lands any entry in the wrong place is seen; B, T
and D differ in every case (a swapped axis cannot hide), and one case has B = 1 and one T = 1 (shape
generality).
"""

from __future__ import annotations

import numpy as np

from autograder.checks.framework import Case, Exercise, Fail, Result, exercise, expect_close
from autograder.reference import setup as ref

LESSON = "00-setup"


def _distinct(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Distinct float values in a random order: every misplaced entry shows."""
    n = int(np.prod(shape))
    return (rng.permutation(n) + rng.random(n)).reshape(shape)


def _get(result: Result, case: Case, what: str, want: tuple[int, ...], names: str, hint: str) -> np.ndarray:
    """The returned array, after a shape check whose message names the axes."""
    got = result.get(case.id, "out", what=what, kind="array")
    if got.shape != want:
        raise Fail(f"{what} should have shape ({names}) = {want}, got {got.shape} ({case.desc}). {hint}")
    return got


def _unchanged(result: Result, case: Case, x: np.ndarray, fn: str) -> None:
    after = result.get(case.id, "x_after", what="x after the call", kind="array")
    if after.shape != x.shape or not np.array_equal(after, x):
        raise Fail(f"{fn} changed the caller's array in place ({case.desc}): return a new arrangement "
                   "instead.")


class _Warmup(Exercise):
    """Shared case building: call ``self.name`` on distinct values, record the output and the input after."""

    shapes: list[tuple[int, int, int]] = []

    def extra_args(self, rng: np.random.Generator, shape: tuple[int, int, int]) -> list:
        return []

    def cases(self, rng):
        cases = []
        for i, shape in enumerate(self.shapes):
            x = _distinct(rng, shape)
            args = self.extra_args(rng, shape)
            B, T, D = shape
            desc = f"x of shape (B, T, D) = ({B}, {T}, {D})" + (f", H={args[0]}" if args else "")
            case = Case(f"c{i}", desc, data={"x": x, "args": args})
            case.let("x", case.array(x))
            case.call(self.name, {"ref": "x"}, *args, record="out")
            case.record("x_after", {"ref": "x"})
            cases.append(case)
        return cases


@exercise(LESSON, "flatten_batch")
class FlattenBatch(_Warmup):
    shapes = [(2, 3, 4), (3, 5, 2), (1, 4, 3), (4, 1, 5)]

    def judge(self, result: Result):
        for case in result.cases.values():
            x = case.data["x"]
            B, T, D = x.shape
            got = _get(result, case, "flatten_batch(x)", (B * T, D), "B * T, D",
                       "Merge the batch and time axes, and keep D as it is.")
            expect_close(got, ref.flatten_batch(x), "flatten_batch(x)", case.desc,
                         hint="Row b * T + t must be x[b, t]: all of sequence 0 first, then sequence 1, ... "
                              "In '(b t)' the first name varies slowest.")
            _unchanged(result, case, x, "flatten_batch")


@exercise(LESSON, "time_major")
class TimeMajor(_Warmup):
    shapes = [(2, 3, 4), (4, 2, 3), (1, 5, 2), (3, 1, 4), (3, 3, 2)]

    def judge(self, result: Result):
        for case in result.cases.values():
            x = case.data["x"]
            B, T, D = x.shape
            got = _get(result, case, "time_major(x)", (T, B, D), "T, B, D",
                       "Only the first two axes swap; D stays last.")
            expect_close(got, ref.time_major(x), "time_major(x)", case.desc,
                         hint="out[t, b] must be x[b, t]: the axes swap, the values move with them. A "
                              "reshape to (T, B, D) keeps the memory order and only relabels it: it is not "
                              "a transpose.")
            _unchanged(result, case, x, "time_major")


@exercise(LESSON, "split_last")
class SplitLast(_Warmup):
    shapes = [(2, 3, 12), (3, 2, 8), (1, 4, 10), (2, 5, 6), (2, 1, 6)]
    # H per shape: H >= 2 and Dh >= 2 and H != B, T except one H = 1 case (shape generality)
    heads = {(2, 3, 12): [4, 6], (3, 2, 8): [4], (1, 4, 10): [5], (2, 5, 6): [1], (2, 1, 6): [3]}

    def extra_args(self, rng, shape):
        return [int(rng.choice(self.heads[shape]))]

    def judge(self, result: Result):
        for case in result.cases.values():
            x, (H,) = case.data["x"], case.data["args"]
            B, T, D = x.shape
            hint = "D splits into H groups of Dh = D // H features; B and T stay where they are."
            meta = result.meta(case.id, "out")
            if len(meta.get("shape", [])) == 4 and meta["shape"][:2] == [B, T] and meta["shape"][2] != H:
                hint = (f"You made {meta['shape'][2]} groups, but H = {H}: use the H argument, not a fixed "
                        "number.")
            got = _get(result, case, "split_last(x, H)", (B, T, H, D // H), "B, T, H, Dh", hint)
            expect_close(got, ref.split_last(x, H), "split_last(x, H)", case.desc,
                         hint="Group h must hold the consecutive features h * Dh ... (h + 1) * Dh - 1 of "
                              "x[b, t]: in '(h dh)' h varies slowest, so each group is a consecutive slice.")
            _unchanged(result, case, x, "split_last")
