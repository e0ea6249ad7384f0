"""Checks of lesson 00-setup, the einops warm-ups, as specs (:mod:`decoder_course.spec`).

Each visible check runs a worked example on an array whose values are their own positions, so a misplaced entry
says where it came from, then the defining property on a second shape with B, T and D all different, then the
spec's rows, which the hidden checks draw again in secret and compare with the reference's values: distinct
values (any misplaced entry shows), B, T and D different in every row, one row with B = 1 and one with T = 1.
"""

import numpy as np

from decoder_course.checks import check, expect_close, expect_inputs_unchanged, expect_shape, expect_type
from decoder_course.spec import Spec, run


def _distinct(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Distinct float values in a random order: every misplaced entry shows."""
    n = int(np.prod(shape))
    return (rng.permutation(n) + rng.random(n)).reshape(shape)


def _rows(shapes, heads=None):
    """Rows of distinct x (B, T, D), and an H drawn from ``heads[shape]`` when the warm-up takes one."""
    def rows(rng):
        out = []
        for B, T, D in shapes:
            args = {"x": _distinct(rng, (B, T, D))}
            if heads:
                args["H"] = int(rng.choice(heads[B, T, D]))
            out.append((f"x of shape (B, T, D) = ({B}, {T}, {D})" + (f", H={args['H']}" if heads else ""), args))
        return out
    return rows


def _groups_hint(args: dict, shape: tuple) -> str:
    B, T, _ = args["x"].shape
    if len(shape) == 4 and shape[:2] == (B, T) and shape[2] != args["H"]:
        return f"You made {shape[2]} groups, but H = {args['H']}: use the H argument, not a fixed number."
    return "D splits into H groups of Dh = D // H features; B and T stay where they are."


SPECS = {
    "flatten_batch": Spec(
        "flatten_batch", _rows([(2, 3, 4), (3, 5, 2), (1, 4, 3), (4, 1, 5)]),
        dtype=lambda a: a["x"].dtype, shape=lambda a: (a["x"].shape[0] * a["x"].shape[1], a["x"].shape[2]),
        axes="B*T, D", shape_hint="Merge the batch and time axes, and keep D as it is.",
        hint="Row b * T + t must be x[b, t]: all of sequence 0 first, then sequence 1, ... In '(b t)' the first name "
             "varies slowest."),
    "time_major": Spec(
        "time_major", _rows([(2, 3, 4), (4, 2, 3), (1, 5, 2), (3, 1, 4), (3, 3, 2)]),
        dtype=lambda a: a["x"].dtype, shape=lambda a: (a["x"].shape[1], a["x"].shape[0], a["x"].shape[2]),
        axes="T, B, D", shape_hint="Only the first two axes swap; D stays last.",
        hint="out[t, b] must be x[b, t]: the axes swap, the values move with them. A reshape to (T, B, D) keeps the "
             "memory order and only relabels it: it is not a transpose."),
    "split_last": Spec(
        # H per shape: H >= 2 and Dh >= 2 and H != B, T except one H = 1 row (shape generality)
        "split_last", _rows([(2, 3, 12), (3, 2, 8), (1, 4, 10), (2, 5, 6), (2, 1, 6)],
                            {(2, 3, 12): [4, 6], (3, 2, 8): [4], (1, 4, 10): [5], (2, 5, 6): [1], (2, 1, 6): [3]}),
        dtype=lambda a: a["x"].dtype, shape=lambda a: (*a["x"].shape[:2], a["H"], a["x"].shape[2] // a["H"]),
        axes="B, T, H, Dh", shape_hint=_groups_hint,
        hint="Group h must hold the consecutive features h * Dh ... (h + 1) * Dh - 1 of x[b, t]: in '(h dh)' h "
             "varies slowest, so each group is a consecutive slice."),
}


def _positions(B: int, T: int, D: int) -> np.ndarray:
    """x[b, t, d] = 100 * b + 10 * t + d: read an entry's value and you know where it came from."""
    b, t, d = np.meshgrid(np.arange(B), np.arange(T), np.arange(D), indexing="ij")  # each (B, T, D)
    return 100 * b + 10 * t + d


def _worked_example(fn, args: tuple, want: np.ndarray, call: str, names: str, hint: str) -> None:
    """``fn(*args)`` leaves its input alone and gives the NumPy array ``want`` (axes ``names``)."""
    got = expect_inputs_unchanged(fn, *args)
    expect_type(got, np.ndarray, call)
    expect_shape(got, want.shape, call, names=names)
    expect_close(got, want, call, hint=hint)


def check_flatten_batch(flatten_batch) -> None:
    """Worked example (B, T, D) = (2, 3, 4), then row b * T + t == x[b, t] on another shape."""
    with check("flatten_batch on the worked example: (2, 3, 4) -> (6, 4), sequence 0 first"):
        want = np.array([[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23],
                         [100, 101, 102, 103], [110, 111, 112, 113], [120, 121, 122, 123]])
        _worked_example(flatten_batch, (_positions(2, 3, 4),), want, "flatten_batch(x)", "B*T, D",
                        "row b * T + t is x[b, t] (value 100 b + 10 t + d): all of sequence 0, then sequence 1")
    with check("flatten_batch on (B, T, D) = (3, 5, 2): row b * T + t is x[b, t]"):
        x = np.random.default_rng(0).standard_normal((3, 5, 2))
        got = flatten_batch(x)
        expect_shape(got, (15, 2), "flatten_batch(x)", names="B*T, D")
        for b in range(3):
            for t in range(5):
                expect_close(got[b * 5 + t], x[b, t], f"row {b * 5 + t} of flatten_batch(x)",
                             hint=f"it should be x[{b}, {t}]: in '(b t)' the first name varies slowest")
    run(SPECS["flatten_batch"], flatten_batch)


def check_time_major(time_major) -> None:
    """Worked example (B, T, D) = (2, 3, 2), then out[t, b] == x[b, t] on another shape."""
    with check("time_major on the worked example: (2, 3, 4) -> (3, 2, 4)"):
        t, b, d = np.meshgrid(np.arange(3), np.arange(2), np.arange(4), indexing="ij")  # each (T, B, D)
        want = 100 * b + 10 * t + d  # (T, B, D): out[t, b, d] is x[b, t, d]
        _worked_example(time_major, (_positions(2, 3, 4),), want, "time_major(x)", "T, B, D",
                        "out[t, b] is x[b, t] (value 100 b + 10 t + d). Same shape but scrambled values? A reshape "
                        "only relabels the memory order; swapping axes needs a transpose (or rearrange)")
    with check("time_major on (B, T, D) = (4, 2, 3): out[t, b] is x[b, t]"):
        x = np.random.default_rng(1).standard_normal((4, 2, 3))
        got = time_major(x)
        expect_shape(got, (2, 4, 3), "time_major(x)", names="T, B, D")
        for t in range(2):
            for b in range(4):
                expect_close(got[t, b], x[b, t], f"time_major(x)[{t}, {b}]", hint=f"it should be x[{b}, {t}]")
    run(SPECS["time_major"], time_major)


def check_split_last(split_last) -> None:
    """Worked example D = 12 into H = 3 heads, then the same x into H = 2 and H = 4 (H is an argument)."""
    with check("split_last on the worked example: (1, 1, 12) into H = 3 groups of 4"):
        want = np.array([[[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]]])  # (B, T, H, Dh) = (1, 1, 3, 4)
        _worked_example(split_last, (np.arange(12).reshape(1, 1, 12), 3), want, "split_last(x, 3)", "B, T, H, Dh",
                        "group h holds the consecutive features h * Dh ... (h + 1) * Dh - 1. Interleaved (0, 3, 6, "
                        "9)? Then the pattern says (dh h) where it should say (h dh)")
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
    run(SPECS["split_last"], split_last)
