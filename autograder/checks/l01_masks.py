"""Hidden checks of lesson 01-masks (NumPy): each exercise is rows of (situation, arguments by name) fed to one
case maker; the masks are judged alike (bool, the reference's shape and values, inputs unchanged), the bias by the
properties its docstring states."""

from __future__ import annotations

import numpy as np

from autograder.checks import judges
from autograder.checks.framework import Case, Exercise, Fail, Result, exercise, expect_close
from autograder.reference import masks as ref

LESSON = "01-masks"


def _token_ids(rng: np.random.Generator, B: int, S: int, pad_id: int) -> np.ndarray:
    """``judges.token_ids`` on right padding (one row unpadded), for a ``pad_id`` that may lie among the ids: a
    real token never takes it."""
    is_real = judges.right_padded(rng, B, S)  # (B, S)
    ids = judges.token_ids(rng, B, S, 50, is_real, pad_id)  # (B, S)
    return np.where(is_real & (ids == pad_id), pad_id + 1, ids)


class _MaskExercise(Exercise):
    """Rows of (situation, arguments by name); judged as a bool array against the reference, inputs unchanged."""

    what = ""  # the call, as messages name it
    label = ""  # the result, as the comparison names it
    hint = ""
    keeps_inputs = True  # the docstring promises the caller's arrays unchanged

    def rows(self, rng: np.random.Generator) -> list[tuple[str, dict]]:
        raise NotImplementedError

    def cases(self, rng):
        cases = []
        for i, (desc, args) in enumerate(self.rows(rng)):
            case = Case(f"c{i}", desc, data={"args": args})
            arrays = [name for name, value in args.items() if isinstance(value, np.ndarray)]
            for name in arrays:
                case.let(name, case.array(args[name]))
            case.call(self.name, *({"ref": n} if n in arrays else v for n, v in args.items()), record="out")
            judges.record_after(case, arrays if self.keeps_inputs else [])
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            args = case.data["args"]
            want = getattr(ref, self.name)(*args.values())
            got = result.get(case.id, "out", what=self.what, kind="array", dtype="bool", shape=want.shape)
            expect_close(got, want, self.label, case.desc, hint=self.hint)
            judges.unchanged(result, case.id, {n: v for n, v in args.items() if isinstance(v, np.ndarray)},
                             self.name)


@exercise(LESSON, "causal_mask")
class CausalMask(_MaskExercise):
    what = label = "causal_mask(T)"
    hint = "Query t may see keys 0..t: True on and below the diagonal, False above it."

    def rows(self, rng):
        return [(f"T={T}", {"T": T}) for T in (1, 2, int(rng.integers(5, 9)), int(rng.integers(11, 17)))]


@exercise(LESSON, "padding_mask")
class PaddingMask(_MaskExercise):
    what, label = "padding_mask(...)", "is_real"
    hint = ("is_real is True for real tokens and False where token_ids == pad_id (the pad id is an argument: it "
            "need not be 0).")

    def rows(self, rng):
        sizes = [(3, 6, 0), (2, 5, int(rng.integers(3, 9))), (1, 4, 1), (4, 9, int(rng.integers(10, 40)))]
        return [(f"B={B}, S={S}, pad_id={pad_id}", {"token_ids": _token_ids(rng, B, S, pad_id), "pad_id": pad_id})
                for B, S, pad_id in sizes]


@exercise(LESSON, "combine_masks")
class CombineMasks(_MaskExercise):
    what, label = "combine_masks(...)", "allowed"
    hint = ("A pair is allowed only if the causal mask allows it AND the key is real; key_is_real is per key, so "
            "it lines up with the last axis (S), not with T.")

    def rows(self, rng):
        rows = []
        for i, (B, T, S) in enumerate([(2, 4, 4), (3, 3, 6), (1, 5, 2), (4, 6, 9)]):
            # odd rows a causal triangle cut to (T, S), even rows any pattern (True, False per query and key)
            causal = ref.causal_mask(max(T, S))[:T, :S] if i % 2 else rng.random((T, S)) < 0.6
            key_is_real = rng.random((B, S)) < 0.7
            key_is_real[0] = True
            rows.append((f"B={B}, T={T}, S={S}", {"causal": causal, "key_is_real": key_is_real}))
        return rows


@exercise(LESSON, "mask_to_bias")
class MaskToBias(_MaskExercise):
    keeps_inputs = False

    def rows(self, rng):
        rows = []
        for shape, dtype in [((4, 4), "float32"), ((2, 1, 3, 5), "float16"), ((3, 7), "float64"),
                             ((2, 1, 5, 4), "float32")]:
            allowed = rng.random(shape) < 0.5
            allowed.reshape(-1, shape[-1])[0] = True
            rows.append((f"shape {shape}, dtype {dtype}", {"allowed": allowed, "dtype": {"np_dtype": dtype}}))
        return rows

    def judge(self, result: Result):
        for case in result.cases.values():
            allowed, dtype = case.data["args"]["allowed"], np.dtype(case.data["args"]["dtype"]["np_dtype"])
            got = result.get(case.id, "out", what="mask_to_bias(...)", kind="ndarray", shape=allowed.shape,
                             finite=False)
            if got.dtype != dtype:
                raise Fail(f"mask_to_bias should return the dtype it was asked for ({dtype}), got {got.dtype}.")
            if not np.isfinite(got).all():
                raise Fail(f"mask_to_bias returned -inf or NaN for {dtype} ({case.desc}). -inf turns a fully masked "
                           "row into NaN, and -1e9 is not representable in float16 (largest magnitude 65504): use "
                           "np.finfo(dtype).min.")
            if np.any(got[allowed] != 0):
                raise Fail("where attention is allowed the bias must be exactly 0: it is added to the scores.")
            if np.any(got[~allowed] > np.finfo(dtype).min / 2):
                raise Fail(f"blocked entries must be very negative for {dtype}, the most negative finite value "
                           "(np.finfo(dtype).min), so that exp(score + bias) underflows to 0 whatever the scores.")
