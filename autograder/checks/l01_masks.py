"""Hidden checks of lesson 01-masks (NumPy)."""

from __future__ import annotations

import numpy as np

from autograder.checks.framework import Case, Exercise, Fail, Result, exercise, expect_close
from autograder.reference import masks as ref

LESSON = "01-masks"


def _token_ids(rng: np.random.Generator, B: int, S: int, pad_id: int) -> np.ndarray:
    """Random ids that avoid pad_id, padded at the end to random lengths (one row unpadded)."""
    ids = rng.integers(0, 50, size=(B, S))
    ids[ids == pad_id] = pad_id + 1
    lengths = rng.integers(1, S + 1, size=B)
    lengths[0] = S  # one full row: padding must not be assumed everywhere
    for b, n in enumerate(lengths):
        ids[b, n:] = pad_id
    return ids


@exercise(LESSON, "causal_mask")
class CausalMask(Exercise):
    def cases(self, rng):
        cases = []
        for i, T in enumerate([1, 2, int(rng.integers(5, 9)), int(rng.integers(11, 17))]):
            case = Case(f"c{i}", f"T={T}", data={"T": T})
            case.call("causal_mask", T, record="out")
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            T = case.data["T"]
            got = result.get(case.id, "out", what="causal_mask(T)", kind="array", dtype="bool", shape=(T, T))
            expect_close(got, ref.causal_mask(T), "causal_mask(T)", case.desc,
                         hint="Query t may see keys 0..t: True on and below the diagonal, False above it.")


@exercise(LESSON, "padding_mask")
class PaddingMask(Exercise):
    def cases(self, rng):
        cases = []
        for i, (B, S, pad_id) in enumerate([(3, 6, 0), (2, 5, int(rng.integers(3, 9))), (1, 4, 1),
                                            (4, 9, int(rng.integers(10, 40)))]):
            ids = _token_ids(rng, B, S, pad_id)
            case = Case(f"c{i}", f"B={B}, S={S}, pad_id={pad_id}", data={"ids": ids, "pad_id": pad_id})
            case.let("ids", case.array(ids))
            case.call("padding_mask", {"ref": "ids"}, pad_id, record="out")
            case.record("ids_after", {"ref": "ids"})
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            ids, pad_id = case.data["ids"], case.data["pad_id"]
            got = result.get(case.id, "out", what="padding_mask(...)", kind="array", dtype="bool", shape=ids.shape)
            expect_close(got, ref.padding_mask(ids, pad_id), "is_real", case.desc,
                         hint="is_real is True for real tokens and False where token_ids == pad_id "
                              "(the pad id is an argument: it need not be 0).")
            after = result.get(case.id, "ids_after", what="token_ids after the call", kind="array")
            if not np.array_equal(after, ids):
                raise Fail("padding_mask changed the caller's token_ids in place: build a new array instead.")


@exercise(LESSON, "combine_masks")
class CombineMasks(Exercise):
    def cases(self, rng):
        cases = []
        for i, (B, T, S) in enumerate([(2, 4, 4), (3, 3, 6), (1, 5, 2), (4, 6, 9)]):
            causal = ref.causal_mask(max(T, S))[:T, :S] if i % 2 else rng.random((T, S)) < 0.6
            key_is_real = rng.random((B, S)) < 0.7
            key_is_real[0] = True
            case = Case(f"c{i}", f"B={B}, T={T}, S={S}", data={"causal": causal, "key_is_real": key_is_real})
            case.call("combine_masks", case.array(causal), case.array(key_is_real), record="out")
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            causal, key_is_real = case.data["causal"], case.data["key_is_real"]
            (T, S), B = causal.shape, key_is_real.shape[0]
            got = result.get(case.id, "out", what="combine_masks(...)", kind="array", dtype="bool",
                             shape=(B, 1, T, S))
            expect_close(got, ref.combine_masks(causal, key_is_real), "allowed", case.desc,
                         hint="A pair is allowed only if the causal mask allows it AND the key is real; "
                              "key_is_real is per key, so it lines up with the last axis (S), not with T.")


@exercise(LESSON, "mask_to_bias")
class MaskToBias(Exercise):
    def cases(self, rng):
        cases = []
        for i, (shape, dtype) in enumerate([((4, 4), "float32"), ((2, 1, 3, 5), "float16"),
                                            ((3, 7), "float64"), ((2, 1, 5, 4), "float32")]):
            allowed = rng.random(shape) < 0.5
            allowed.reshape(-1, shape[-1])[0] = True
            case = Case(f"c{i}", f"shape {shape}, dtype {dtype}", data={"allowed": allowed, "dtype": dtype})
            case.call("mask_to_bias", case.array(allowed), {"np_dtype": dtype}, record="out")
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            allowed, dtype = case.data["allowed"], np.dtype(case.data["dtype"])
            got = result.get(case.id, "out", what="mask_to_bias(...)", kind="ndarray", shape=allowed.shape,
                             finite=False)
            if got.dtype != dtype:
                raise Fail(f"mask_to_bias should return the dtype it was asked for ({dtype}), got {got.dtype}.")
            if not np.isfinite(got).all():
                raise Fail(
                    f"mask_to_bias returned -inf or NaN for {dtype} ({case.desc}). -inf turns a fully masked "
                    "row into NaN, and -1e9 is not representable in float16 (largest magnitude 65504): use "
                    "np.finfo(dtype).min."
                )
            if np.any(got[allowed] != 0):
                raise Fail("where attention is allowed the bias must be exactly 0: it is added to the scores.")
            if np.any(got[~allowed] > np.finfo(dtype).min / 2):
                raise Fail(
                    f"blocked entries must be very negative for {dtype}, the most negative finite value "
                    "(np.finfo(dtype).min), so that exp(score + bias) underflows to 0 whatever the scores."
                )
