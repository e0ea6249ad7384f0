"""Visible checks of lesson 00-setup: the einops warm-ups.

Each check runs a worked example on an array whose values are their own positions, so a misplaced entry says
where it came from, then the defining property on a second shape with B, T and D all different.
"""

import numpy as np

from decoder_course.checks import check, expect_close, expect_shape, expect_type, expect_unchanged, snapshot


def _positions(B: int, T: int, D: int) -> np.ndarray:
    """x[b, t, d] = 100 * b + 10 * t + d: read an entry's value and you know where it came from."""
    b, t, d = np.meshgrid(np.arange(B), np.arange(T), np.arange(D), indexing="ij")  # each (B, T, D)
    return 100 * b + 10 * t + d


def check_flatten_batch(flatten_batch) -> None:
    """Worked example (B, T, D) = (2, 3, 4), then row b * T + t == x[b, t] on another shape."""
    with check("flatten_batch on the worked example: (2, 3, 4) -> (6, 4), sequence 0 first"):
        x = _positions(2, 3, 4)
        before = snapshot(x)
        got = flatten_batch(x)
        expect_type(got, np.ndarray, "flatten_batch(x)")
        expect_shape(got, (6, 4), "flatten_batch(x)", names="B*T, D")
        want = np.array([[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23],
                         [100, 101, 102, 103], [110, 111, 112, 113], [120, 121, 122, 123]])
        expect_close(got, want, "flatten_batch(x)",
                     hint="row b * T + t is x[b, t] (value 100 b + 10 t + d): all of sequence 0, then "
                          "sequence 1")
        expect_unchanged(before, x, "x")
    with check("flatten_batch on (B, T, D) = (3, 5, 2): row b * T + t is x[b, t]"):
        x = np.random.default_rng(0).standard_normal((3, 5, 2))
        got = flatten_batch(x)
        expect_shape(got, (15, 2), "flatten_batch(x)", names="B*T, D")
        for b in range(3):
            for t in range(5):
                expect_close(got[b * 5 + t], x[b, t], f"row {b * 5 + t} of flatten_batch(x)",
                             hint=f"it should be x[{b}, {t}]: in '(b t)' the first name varies slowest")


def check_time_major(time_major) -> None:
    """Worked example (B, T, D) = (2, 3, 2), then out[t, b] == x[b, t] on another shape."""
    with check("time_major on the worked example: (2, 3, 4) -> (3, 2, 4)"):
        x = _positions(2, 3, 4)
        before = snapshot(x)
        got = time_major(x)
        expect_type(got, np.ndarray, "time_major(x)")
        expect_shape(got, (3, 2, 4), "time_major(x)", names="T, B, D")
        t, b, d = np.meshgrid(np.arange(3), np.arange(2), np.arange(4), indexing="ij")  # each (T, B, D)
        want = 100 * b + 10 * t + d  # (T, B, D): out[t, b, d] is x[b, t, d]
        expect_close(got, want, "time_major(x)",
                     hint="out[t, b] is x[b, t] (value 100 b + 10 t + d). Same shape but scrambled values? "
                          "A reshape only relabels the memory order; swapping axes needs a transpose (or "
                          "rearrange)")
        expect_unchanged(before, x, "x")
    with check("time_major on (B, T, D) = (4, 2, 3): out[t, b] is x[b, t]"):
        x = np.random.default_rng(1).standard_normal((4, 2, 3))
        got = time_major(x)
        expect_shape(got, (2, 4, 3), "time_major(x)", names="T, B, D")
        for t in range(2):
            for b in range(4):
                expect_close(got[t, b], x[b, t], f"time_major(x)[{t}, {b}]", hint=f"it should be x[{b}, {t}]")


def check_split_last(split_last) -> None:
    """Worked example D = 12 into H = 3 heads, then the same x into H = 2 and H = 4 (H is an argument)."""
    with check("split_last on the worked example: (1, 1, 12) into H = 3 groups of 4"):
        x = np.arange(12).reshape(1, 1, 12)
        before = snapshot(x)
        got = split_last(x, 3)
        expect_type(got, np.ndarray, "split_last(x, 3)")
        expect_shape(got, (1, 1, 3, 4), "split_last(x, 3)", names="B, T, H, Dh")
        want = np.array([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
        expect_close(got[0, 0], want, "split_last(x, 3)[0, 0]",
                     hint="group h holds the consecutive features h * Dh ... (h + 1) * Dh - 1. Interleaved "
                          "(0, 3, 6, 9)? Then the pattern says (dh h) where it should say (h dh)")
        expect_unchanged(before, x, "x")
    for H in (2, 4):
        with check(f"split_last on (B, T, D) = (2, 3, 12) with H = {H}: group h is x[b, t, h*Dh:(h+1)*Dh]"):
            x = _positions(2, 3, 12)
            Dh = 12 // H
            got = split_last(x, H)
            if getattr(got, "ndim", 0) == 4 and got.shape[:2] == (2, 3) and got.shape[2] != H:
                raise AssertionError(f"you made {got.shape[2]} groups, but H = {H}: use the argument H, not "
                                     "a fixed number")
            expect_shape(got, (2, 3, H, Dh), f"split_last(x, {H})", names="B, T, H, Dh")
            for h in range(H):
                expect_close(got[:, :, h], x[:, :, h * Dh:(h + 1) * Dh], f"group {h} of split_last(x, {H})",
                             hint=f"it should be x[:, :, {h * Dh}:{(h + 1) * Dh}]")
