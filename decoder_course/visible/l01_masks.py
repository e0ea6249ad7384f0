"""Checks of lesson 01-masks, as specs (:mod:`decoder_course.spec`): the rows, contracts and properties below drive
the visible checks (on draws of a public seed, after each worked example) and the hidden ones (the same rows on
secret draws, plus the reference's values)."""

import numpy as np

from decoder_course.checks import CheckFailed, check, expect_close, expect_dtype, expect_inputs_unchanged, expect_shape
from decoder_course.spec import Spec, run


def _is_real(rng: np.random.Generator, B: int, S: int) -> np.ndarray:
    """(B, S): real tokens, then padding; row 0 unpadded."""
    lengths = rng.integers(1, S, size=B)
    lengths[0] = S
    return np.arange(S)[None, :] < lengths[:, None]


def _token_ids(rng: np.random.Generator, B: int, S: int, pad_id: int) -> np.ndarray:
    """Ids (B, S) in 3..49, pad_id after each row's length; a real token never takes pad_id, which may be 0 or not."""
    is_real = _is_real(rng, B, S)
    ids = rng.integers(3, 50, size=(B, S))
    ids[ids == pad_id] = pad_id + 1
    return np.where(is_real, ids, pad_id)


def _no_future(args: dict, got: np.ndarray, desc: str) -> None:
    future = np.triu(np.ones(got.shape, dtype=bool), k=1)  # above the diagonal: key s later than query t
    if got[future].any():
        raise CheckFailed(f"a query may attend to a later key ({desc}): the future leaks (look above the diagonal)")
    if not np.diag(got).all():
        raise CheckFailed(f"a query may not attend to itself ({desc}): the diagonal must be True")


def _combined(args: dict, got: np.ndarray, desc: str) -> None:
    if (got & ~args["causal"][None, None]).any():
        raise CheckFailed(f"a pair the causal mask blocks is allowed ({desc}): a pair is allowed only if the causal "
                          "mask allows it AND the key is real")
    if (got & ~args["key_is_real"][:, None, None, :]).any():
        raise CheckFailed(f"a padding key is allowed ({desc}): key_is_real is per key, so it lines up with the last "
                          "axis (S), not with T")


def _bias(args: dict, got: np.ndarray, desc: str) -> None:
    allowed, dtype = args["allowed"], np.dtype(args["dtype"])
    if not np.isfinite(got).all():
        raise CheckFailed(f"mask_to_bias gave -inf or NaN in {dtype} ({desc}): -inf turns a fully masked row into "
                          "NaN, and -1e9 is not representable in float16 (largest magnitude 65504): use "
                          "np.finfo(dtype).min")
    if (got[allowed] != 0).any():
        raise CheckFailed(f"where attention is allowed the bias must be exactly 0 ({desc}): it is added to the scores")
    if (got[~allowed] > np.finfo(dtype).min / 2).any():
        raise CheckFailed(f"blocked entries must be the most negative finite value of {dtype}, np.finfo(dtype).min "
                          f"({desc}), so that exp(score + bias) underflows to 0 whatever the scores")


def _combine_rows(rng):
    rows = []
    for i, (B, T, S) in enumerate([(2, 4, 4), (3, 3, 6), (1, 5, 2), (4, 6, 9)]):
        causal = rng.random((T, S)) < (0.8 if i % 2 else 0.5)  # any pattern: the AND is per pair
        key_is_real = rng.random((B, S)) < 0.7
        key_is_real[0] = True
        rows.append((f"B={B}, T={T}, S={S}", {"causal": causal, "key_is_real": key_is_real}))
    return rows


def _bias_rows(rng):
    rows = []
    for shape, dtype in [((4, 4), np.float32), ((2, 1, 3, 5), np.float16), ((3, 7), np.float64),
                         ((2, 1, 5, 4), np.float32)]:
        allowed = rng.random(shape) < 0.5
        allowed.reshape(-1, shape[-1])[0] = True
        rows.append((f"shape {shape}, dtype {np.dtype(dtype).name}", {"allowed": allowed, "dtype": dtype}))
    return rows


def _padding_rows(rng):
    sizes = [(3, 6, 0), (2, 5, int(rng.integers(3, 9))), (1, 4, 1), (4, 9, int(rng.integers(10, 40)))]
    return [(f"B={B}, S={S}, pad_id={pad_id}", {"token_ids": _token_ids(rng, B, S, pad_id), "pad_id": pad_id})
            for B, S, pad_id in sizes]


SPECS = {
    "causal_mask": Spec(
        "causal_mask", lambda rng: [(f"T={T}", {"T": T}) for T in (1, 2, int(rng.integers(5, 9)),
                                                                 int(rng.integers(11, 17)))],
        dtype=lambda a: np.bool_, shape=lambda a: (a["T"], a["T"]), properties=_no_future,
        hint="Query t may see keys 0..t: True on and below the diagonal, False above it."),
    "padding_mask": Spec(
        "padding_mask", _padding_rows, dtype=lambda a: np.bool_, shape=lambda a: a["token_ids"].shape,
        hint="is_real is True for real tokens and False where token_ids == pad_id (the pad id is an argument: it "
             "need not be 0)."),
    "combine_masks": Spec(
        "combine_masks", _combine_rows, dtype=lambda a: np.bool_,
        shape=lambda a: (len(a["key_is_real"]), 1, *a["causal"].shape), properties=_combined,
        hint="A pair is allowed only if the causal mask allows it AND the key is real; key_is_real is per key, so "
             "it lines up with the last axis (S), not with T."),
    "mask_to_bias": Spec(
        "mask_to_bias", _bias_rows, dtype=lambda a: a["dtype"], shape=lambda a: a["allowed"].shape,
        properties=_bias, keeps_inputs=False, compare=False),
}


def check_causal_mask(causal_mask) -> None:
    """The worked example T=3, then the spec's rows: shape, dtype and no future."""
    with check("causal_mask(3) matches the worked example"):
        want = np.array([[True, False, False], [True, True, False], [True, True, True]])
        expect_close(causal_mask(3), want, "causal_mask(3)",
                     hint="Row t is query t: True for keys 0..t (itself and the past), False for the future.")
    run(SPECS["causal_mask"], causal_mask)


def check_padding_mask(padding_mask) -> None:
    """A worked example with pad_id 0, then with a pad id that is not 0, then the spec's rows."""
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
    run(SPECS["padding_mask"], padding_mask)


def check_combine_masks(combine_masks) -> None:
    """A worked example with T != S, then the spec's rows: shape (B, 1, T, S), AND, keys on the last axis."""
    with check("combine_masks gives (B, 1, T, S) and masks keys, not queries"):
        causal = np.tril(np.ones((3, 5), dtype=bool), k=2)  # (T=3, S=5)
        key_is_real = np.array([[True, True, True, True, True], [True, True, False, False, False]])  # (B=2, S=5)
        got = combine_masks(causal, key_is_real)
        expect_shape(got, (2, 1, 3, 5), "combine_masks(...) (B, 1, T, S)")
        expect_close(got[0, 0], causal, "sequence 0 (no padding)",
                     hint="Without padding the combined mask is just the causal mask.")
    run(SPECS["combine_masks"], combine_masks)


def check_mask_to_bias(mask_to_bias) -> None:
    """The spec's rows: 0 where allowed, a finite very negative number where blocked, in the requested dtype."""
    run(SPECS["mask_to_bias"], mask_to_bias)
