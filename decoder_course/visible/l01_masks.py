"""Visible checks of lesson 01-masks."""

import numpy as np

from decoder_course.checks import check, expect_close, expect_dtype, expect_inputs_unchanged, expect_shape, expect_type


def check_causal_mask(causal_mask) -> None:
    """Worked example T=3, then the shape, dtype and "no future" property for a larger T."""
    with check("causal_mask(3) matches the worked example"):
        got = causal_mask(3)
        expect_type(got, np.ndarray, "causal_mask(3)")
        expect_shape(got, (3, 3), "causal_mask(3)")
        expect_dtype(got, np.bool_, "causal_mask(3)")
        want = np.array([[True, False, False], [True, True, False], [True, True, True]])
        expect_close(got, want, "causal_mask(3)",
                     hint="Row t is query t: True for keys 0..t (itself and the past), False for the future.")
    with check("causal_mask(7): no query sees a later key, every query sees itself"):
        got = causal_mask(7)
        expect_shape(got, (7, 7), "causal_mask(7)")
        future = np.triu(np.ones((7, 7), dtype=bool), k=1)
        if got[future].any():
            raise AssertionError("a query may attend to a later key: the future leaks (look above the diagonal).")
        if not np.diag(got).all():
            raise AssertionError("a query may not attend to itself: the diagonal must be True.")


def check_padding_mask(padding_mask) -> None:
    """A worked example with pad_id 0, then with a pad id that is not 0, and the caller's array untouched."""
    ids = np.array([[4, 5, 6, 0], [7, 0, 0, 0]])
    with check("padding_mask on a small batch (pad_id = 0)"):
        got = padding_mask(ids, 0)
        expect_shape(got, (2, 4), "is_real (B, S)")
        expect_dtype(got, np.bool_, "is_real")
        expect_close(got, ids != 0, "is_real", hint="is_real is True for real tokens, False for padding.")
    with check("padding_mask respects the pad id it is given (pad_id = 3) and leaves the input alone"):
        ids3 = np.array([[0, 1, 3, 3], [3, 3, 3, 3]])
        got = expect_inputs_unchanged(padding_mask, ids3, 3)  # the caller's array is not modified
        expect_close(got, ids3 != 3, "is_real with pad_id=3",
                     hint="Use the pad_id argument: token 0 is a real token in this vocabulary.")


def check_combine_masks(combine_masks) -> None:
    """Shape (B, 1, T, S) with T != S, and the key axis."""
    with check("combine_masks gives (B, 1, T, S) and masks keys, not queries"):
        causal = np.tril(np.ones((3, 5), dtype=bool), k=2)  # (T=3, S=5)
        key_is_real = np.array([[True, True, True, True, True], [True, True, False, False, False]])  # (B=2, S=5)
        got = combine_masks(causal, key_is_real)
        expect_shape(got, (2, 1, 3, 5), "combine_masks(...) (B, 1, T, S)")
        expect_dtype(got, np.bool_, "combine_masks(...)")
        if got[1, 0, :, 2:].any():
            raise AssertionError("sequence 1's keys 2..4 are padding, yet some query may attend to them: "
                                 "key_is_real must line up with the last axis (S).")
        expect_close(got[0, 0], causal, "sequence 0 (no padding)",
                     hint="Without padding the combined mask is just the causal mask.")


def check_mask_to_bias(mask_to_bias) -> None:
    """0 where allowed, a finite very negative number where blocked, in the requested dtype."""
    allowed = np.array([[True, False, True], [False, False, False]])
    for dtype in (np.float32, np.float16):
        name = np.dtype(dtype).name
        with check(f"mask_to_bias in {name}"):
            got = mask_to_bias(allowed, dtype)
            expect_shape(got, allowed.shape, "bias")
            expect_dtype(got, dtype, f"mask_to_bias(allowed, {name})")
            if not np.isfinite(got).all():
                raise AssertionError(f"the bias holds -inf or NaN in {name}: -inf makes fully blocked rows NaN, "
                                     "and -1e9 overflows to -inf in float16. Use np.finfo(dtype).min.")
            if (got[allowed] != 0).any():
                raise AssertionError("allowed entries must get a bias of exactly 0.")
            if (got[~allowed] > np.finfo(dtype).min / 2).any():
                raise AssertionError("blocked entries must be the most negative finite value, np.finfo(dtype).min.")
