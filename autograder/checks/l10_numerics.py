"""Hidden checks of lesson 10-numerics (PyTorch): a fill value, a softmax and an attention that stay finite.

Expected values come from PyTorch in float64: ``torch.softmax`` over the allowed keys (fully masked rows set to
zeros, the course's convention) and ``F.scaled_dot_product_attention``, whose boolean mask has our polarity and
which returns zeros for a query with no allowed key. Inputs are rounded to the case's dtype first, so only the
student's arithmetic is judged, within that dtype's rounding. Autocast cases run the student's call inside
``torch.autocast("cpu", ...)`` (the harvest's ``autocast`` step option), where ``q @ kᵀ`` is half precision
although ``q`` is float32: the trap of a fill value taken from the inputs' dtype. ``robust_masked_softmax`` is a
spec (``decoder_course/visible/l10_numerics.py``): every dtype, the weights' properties shared with lesson 02, the
reference's values within the dtype's rounding, the dtype the kernel declared (bfloat16 stays bfloat16).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checks import judges, spec
from autograder.checks.framework import Case, Exercise, Fail, Raised, Result, exercise, expect_close
from autograder.reference import numerics as ref
from decoder_course.visible import l10_numerics as visible

LESSON = "10-numerics"
DTYPES = ("float16", "bfloat16", "float32", "float64")
# Largest error allowed against float64, per dtype: weights (at most 1) and outputs (|v| about 1). float64 inputs
# get float32's tolerance: working in float32 throughout is fine for this lesson.
WEIGHT_ATOL = {"float64": 1e-5, "float32": 1e-5, "float16": 3e-3, "bfloat16": 2e-2}
OUT_ATOL = {"float64": 2e-5, "float32": 2e-5, "float16": 2e-2, "bfloat16": 1.2e-1}


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _round(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` as the kernel will see it in ``dtype``, back in float64 (the grader's working precision)."""
    return torch.from_numpy(np.asarray(x, np.float64)).to(_torch_dtype(dtype)).double().numpy()


def _allowed(rng: np.random.Generator, shape: tuple, n_dead: int) -> np.ndarray:
    """A random mask of ``shape`` (..., T, S): every row has a key except ``n_dead`` fully masked rows."""
    allowed = rng.random(shape) < 0.6
    allowed[..., int(rng.integers(shape[-1]))] = True  # one key column always allowed ...
    rows = allowed.reshape(-1, shape[-1])
    for row in rng.choice(rows.shape[0], size=n_dead, replace=False):
        rows[row] = False  # ... except in these rows, where nothing is
    return rows.reshape(shape)


def _mask(rng: np.random.Generator, shape: tuple | None) -> np.ndarray | None:
    """:func:`_allowed` of ``shape`` with one fully masked row (two in a (B, 1, T, S) mask); None for None."""
    return None if shape is None else _allowed(rng, shape, n_dead=1 if len(shape) < 4 else 2)


def _scores_case(case_id: str, scores: np.ndarray, allowed: np.ndarray | None, dtype: str, what: str) -> Case:
    """A case binding ``scores`` in ``dtype`` as `scores` (robust_masked_softmax's and masked_logsumexp's)."""
    mask = "" if allowed is None else f"allowed {allowed.shape}, "
    case = Case(case_id, f"scores {scores.shape} in {dtype}, {mask}{what}",
                data={"scores": scores, "allowed": allowed, "dtype": dtype})
    case.let("scores", case.tensor(scores.astype(np.float32) if dtype != "float64" else scores, dtype=dtype))
    return case


def _unchanged(result: Result, case: Case, names, what: str, hint: str = "") -> None:
    """judges.unchanged on the case's own inputs ``names``; ``hint`` (lesson-local: judges.unchanged has none) says
    how this exercise makes a new tensor."""
    try:
        judges.unchanged(result, case.id, {name: case.data[name] for name in names}, what)
    except Raised:
        raise
    except Fail as fail:
        if not hint:
            raise
        raise Fail(f"{fail} {hint}") from None


def _scaled_rows(rng: np.random.Generator, shape: tuple, scales) -> np.ndarray:
    """Standard normal values whose query rows (axis -2) are on very different scales."""
    row_scale = np.resize(np.asarray(scales, np.float64), shape[-2])[:, None]  # (T, 1)
    return rng.standard_normal(shape) * row_scale


def _softmax64(scores: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    """PyTorch's softmax in float64 over the allowed keys; a row with no allowed key is zeros."""
    s = torch.from_numpy(np.asarray(scores, np.float64))
    if allowed is None:
        return s.softmax(-1).numpy()
    mask = torch.from_numpy(np.broadcast_to(allowed, s.shape).copy())
    return s.masked_fill(~mask, -math.inf).softmax(-1).nan_to_num(0.0).numpy()


def _is_uniform(w: np.ndarray) -> bool:
    return bool(np.allclose(w, 1.0 / w.shape[-1], atol=1e-2))


def _judge_weights(got: np.ndarray, scores: np.ndarray, allowed: np.ndarray | None, dtype: str, what: str,
                   desc: str, hint: str) -> None:
    """Finite, blocked keys exactly 0, fully masked rows zeros, then values against float64."""
    if np.isnan(got).any():
        raise Fail(f"{what} contains NaN ({desc}). A fully blocked row filled with -inf gives "
                   "-inf - (-inf) = NaN, and -1e9 becomes -inf in float16: fill with the most negative finite "
                   "number of the dtype you fill (mask_fill_value), then zero the blocked weights.")
    if not np.isfinite(got).all():
        raise Fail(f"{what} contains inf ({desc}): huge scores overflowed. Softmax in float32, after "
                   "replacing (not adding to) the blocked scores.")
    want = _softmax64(scores, allowed)
    if allowed is not None:
        mask = np.broadcast_to(allowed, got.shape)
        dead = ~mask.any(-1)  # (..., T)
        if dead.any() and np.abs(got[dead]).max() > 0:
            uniform = _is_uniform(got[dead])
            raise Fail(f"{what}: a query row with no allowed key must be all zeros, but yours "
                       f"{'is a uniform average over the blocked keys' if uniform else 'is not'} ({desc}). "
                       "A finite fill alone gives every blocked key the same weight; set the blocked weights "
                       "to 0 after the softmax.")
        if np.abs(got[~mask]).max(initial=0.0) > 0:
            raise Fail(f"{what}: a blocked key got a nonzero weight ({desc}). Apply the mask with True = "
                       "\"this query may attend to this key\", and make the blocked weights exactly 0.")
    expect_close(got, want, what, desc, rtol=0, atol=WEIGHT_ATOL[dtype], hint=hint)


def _raise_overflow(result: Result, case: Case) -> None:
    """A fill PyTorch refused: say which idea it is before the generic exception message."""
    error = result.error(case.id) or ""
    if "without overflow" in error:
        raise Fail(f"your code raised an exception on a case with {case.desc}:\n    {error.splitlines()[-1]}\n"
                   f"{visible.OVERFLOW}")


# -- mask_fill_value -----------------------------------------------------------------------------------------------
@exercise(LESSON, "mask_fill_value")
class MaskFillValue(Exercise):
    def cases(self, rng):
        cases = []
        for i, name in enumerate(rng.permutation(DTYPES)):
            case = Case(f"c{i}", f"dtype torch.{name}", data={"dtype": str(name)})
            case.call("mask_fill_value", {"torch_dtype": str(name)}, record="out")
            cases.append(case)
        return cases

    def judge(self, result: Result):
        # float16 first: its range is where most wrong fills fail, and its message teaches the most
        for case in sorted(result.cases.values(), key=lambda c: DTYPES.index(c.data["dtype"])):
            name = case.data["dtype"]
            info = torch.finfo(_torch_dtype(name))
            got = result.get(case.id, "out", what=f"mask_fill_value(torch.{name})", finite=False)
            if got.size != 1:
                raise Fail(f"mask_fill_value(torch.{name}) should return one number, got shape {got.shape}.")
            value = float(got.reshape(-1)[0])
            if math.isnan(value) or value == -math.inf:
                raise Fail(f"mask_fill_value(torch.{name}) returned {value}: a row whose keys are all blocked "
                           "becomes -inf - (-inf) = NaN. The fill must be finite.")
            as_dtype = torch.tensor(value, dtype=torch.float64).to(_torch_dtype(name))
            if not bool(torch.isfinite(as_dtype)):
                raise Fail(f"mask_fill_value(torch.{name}) returned a number that {name} cannot hold: it becomes "
                           f"-inf in {name} (float16 ends at ±65504, bfloat16 just below float32's range). "
                           "Take the value from the dtype you are given.")
            if value >= 0:
                raise Fail(f"mask_fill_value(torch.{name}) is not negative: blocked keys need the most negative "
                           "score, so that exp() makes their weight 0.")
            if as_dtype.item() != info.min:
                raise Fail(f"mask_fill_value(torch.{name}) is finite but not {name}'s most negative finite "
                           "number: torch.finfo knows it for every dtype.")


# -- robust_masked_softmax: a spec (decoder_course/visible/l10_numerics.py) ------------------------------------
spec.register(LESSON, visible.SPECS, ref)


# -- robust_attention ------------------------------------------------------------------------------------------------
def _attention_inputs(rng, B, H, T, S, Dh):
    q = _scaled_rows(rng, (B, H, T, Dh), rng.permutation([0.1, 1.0, 2.0, 0.4, 1.5]))
    return q, rng.standard_normal((B, H, S, Dh)), rng.standard_normal((B, H, S, Dh))


def _sdpa64(q, k, v, allowed) -> np.ndarray:
    mask = None if allowed is None else torch.from_numpy(allowed)
    q, k, v = (torch.from_numpy(np.asarray(x, np.float64)) for x in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).numpy()


@exercise(LESSON, "robust_attention")
class RobustAttention(Exercise):
    """Against float64 F.scaled_dot_product_attention in four dtypes and under autocast; the float16 overflow of an
    unscaled q @ kᵀ; zeros for fully masked rows; finite float16 gradients; the caller's inputs unchanged."""

    uses = ("mask_fill_value", "robust_masked_softmax")  # the reference calls both
    reference = ref
    forbidden = ("F.scaled_dot_product_attention",)  # the answer we compare with

    def cases(self, rng):
        cases = []
        rows = [  # (id, dtype, autocast, (B, H, T, S, Dh), mask, situation, with a backward pass)
            ("f32", "float32", None, (2, 3, 4, 6, 8), "B1TS", "fully masked rows", False),
            ("bf16", "bfloat16", None, (1, 2, 5, 3, 4), "TS", "B=1, T > S, a fully masked row", False),
            ("f64", "float64", None, (2, 1, 3, 5, 6), None, "H=1, allowed=None", False),
            ("ac_bf16", "float32", "bfloat16", (2, 2, 3, 7, 8), "B1TS",
             "float32 inputs under torch.autocast('cpu', dtype=torch.bfloat16)", False),
            ("ac_f16", "float32", "float16", (3, 2, 4, 5, 8), "B1TS",
             "float32 inputs under torch.autocast('cpu', dtype=torch.float16)", False),
            # float16 with gradients: backward through the fully masked rows
            ("grad16", "float16", None, (2, 2, 4, 5, 8), "B1TS", "backward pass", True),
        ]
        for case_id, dtype, autocast, (B, H, T, S, Dh), mask_kind, what, grad in rows:
            q, k, v = _attention_inputs(rng, B, H, T, S, Dh)
            allowed = _mask(rng, {"TS": (T, S), "B1TS": (B, 1, T, S)}.get(mask_kind))
            grad_w = rng.standard_normal((B, H, T, Dh)) if grad else None
            cases.append(self._case(case_id, dtype, autocast, q, k, v, allowed, f"(B, H, T, S, Dh) = "
                                    f"{(B, H, T, S, Dh)} in {dtype}, {what}", grad_w=grad_w))
        # float16, entries of q and k ±40 with Dh = 64: q·k reaches 102400 > 65504 unless q is scaled first
        B, H, T, S, Dh = 2, 2, 3, 5, 64
        q = rng.choice([-40.0, 40.0], size=(B, H, T, Dh))
        k = rng.choice([-40.0, 40.0], size=(B, H, S, Dh))
        k[..., 0, :] = q[..., 0, :]  # key 0 aligned with query 0: their product is the largest possible
        v = rng.standard_normal((B, H, S, Dh))
        allowed = _allowed(rng, (T, S), 1)
        allowed[0] = True  # query 0 sees every key, the aligned one included
        cases.append(self._case("overflow16", "float16", None, q, k, v, allowed,
                                f"(B, H, T, S, Dh) = {(B, H, T, S, Dh)} in float16, q and k entries ±40"))
        return cases

    @staticmethod
    def _case(case_id, dtype, autocast, q, k, v, allowed, desc, grad_w=None) -> Case:
        q, k, v = (_round(x, dtype) for x in (q, k, v))
        case = Case(case_id, desc, data={"q": q, "k": k, "v": v, "allowed": allowed, "dtype": dtype,
                                         "autocast": autocast, "grad": grad_w is not None})
        for name, x in (("q", q), ("k", k), ("v", v)):
            case.let(name, case.tensor(x, dtype=dtype, requires_grad=grad_w is not None))
        mask = None if allowed is None else case.tensor(allowed)
        case.call("robust_attention", {"ref": "q"}, {"ref": "k"}, {"ref": "v"}, mask, let="res")
        if autocast:
            case.steps[-1]["autocast"] = autocast  # the call runs inside torch.autocast("cpu", dtype=...)
        case.record("out", {"ref": "res"})
        if grad_w is None:
            judges.record_after(case, ["q", "k", "v"])
        else:
            case.let("out0", {"index": ["res", 0]})
            case.backward("out0", grad_w)
            for name in ("q", "k", "v"):
                case.record(f"grad_{name}", {"grad": name})
        return case

    def judge(self, result: Result):
        for case in result.cases.values():
            d = case.data
            q, k, v, allowed, dtype = d["q"], d["k"], d["v"], d["allowed"], d["dtype"]
            T, S, Dv = q.shape[-2], k.shape[-2], v.shape[-1]
            lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
            _raise_overflow(result, case)
            error = result.error(case.id)
            if error is not None:
                raise Fail(f"your code raised an exception on a case with {case.desc}:\n    {error.splitlines()[-1]}\n"
                           "robust_attention runs your robust_masked_softmax (and mask_fill_value): if one of their "
                           "checks fails, fix it first.")
            meta = result.meta(case.id, "out")
            if meta.get("type") not in ("tuple", "list") or meta.get("len") != 2:
                raise Fail(f"robust_attention should return a pair (out, weights), got {meta.get('type')} "
                           f"({case.desc}).")
            out, weights = (result.get(case.id, f"out/{i}", what=name, kind="tensor", dtype="float", shape=shape,
                                       finite=False)
                            for i, (name, shape) in enumerate((("out", (*lead, T, Dv)), ("weights", (*lead, T, S)))))
            for i, name in enumerate(("out", "weights")):
                declared = result.meta(case.id, f"out/{i}").get("dtype")
                if not d["autocast"] and declared != f"torch.{dtype}":
                    raise Fail(f"robust_attention returned {name} as {declared} for {dtype} inputs ({case.desc}): "
                               "keep the inputs' dtype.")
            if not np.isfinite(out).all() or not np.isfinite(weights).all():
                hint = ("q @ kᵀ overflowed float16 (65504) before the division by √Dh: scale q first"
                        if case.id == "overflow16" else
                        "inside autocast the scores are half precision although q is float32: take the fill "
                        "from the scores' dtype, or work on a float32 copy" if d["autocast"] else
                        "a fully blocked row filled with -inf gives NaN: use robust_masked_softmax")
                raise Fail(f"robust_attention returned NaN or inf ({case.desc}): {hint}.")
            work = "bfloat16" if d["autocast"] == "bfloat16" else "float16" if d["autocast"] else dtype
            scores = (q / math.sqrt(q.shape[-1])) @ np.swapaxes(k, -1, -2)  # (..., T, S) float64
            _judge_weights(weights.astype(np.float64), scores, allowed, work, "robust_attention's weights",
                           case.desc, hint="Expected robust_masked_softmax((q / √Dh) @ kᵀ, allowed): the scores "
                                           "are divided by the square root of the head width Dh = q.shape[-1].")
            if allowed is not None:
                dead = ~np.broadcast_to(allowed, weights.shape).any(-1)  # (..., T)
                if dead.any() and np.abs(out[dead]).max() > 0:
                    raise Fail(f"robust_attention: a query with no allowed key must output zeros ({case.desc}).")
            expect_close(out, _sdpa64(q, k, v, allowed), "robust_attention's out (vs PyTorch's "
                         "F.scaled_dot_product_attention)", case.desc, rtol=0, atol=OUT_ATOL[work],
                         hint="scores = (q / √Dh) @ kᵀ over the last two axes, weights = "
                              "robust_masked_softmax(scores, allowed), out = weights @ v.")
            if not d["grad"]:
                _unchanged(result, case, ["q", "k", "v"], "robust_attention")
                continue
            for name in ("q", "k", "v"):
                grad = result.get(case.id, f"grad_{name}", what=f"the gradient of {name}", kind="tensor", finite=False)
                if not np.isfinite(grad).all():
                    raise Fail(f"the float16 gradient of {name} holds NaN or inf ({case.desc}): a -inf (or an "
                               "overflow) inside the softmax poisons the backward pass even when the output was "
                               "zeroed afterwards. Use a finite fill.")


# -- masked_logsumexp: find the bug (autograder.bugs), judged relative to the student's mask_fill_value --------------
def _lse_variants(scores: np.ndarray, allowed: np.ndarray | None, dtype: str) -> dict[str, np.ndarray]:
    """What the shown bug and the usual wrong fixes compute, in the working dtype, for the diagnosis."""
    work = torch.from_numpy(scores).to(torch.promote_types(_torch_dtype(dtype), torch.float32))
    if allowed is not None:
        work = work.masked_fill(~torch.from_numpy(np.broadcast_to(allowed, scores.shape).copy()),
                                torch.finfo(work.dtype).min)
    out = {}
    for name, top in (("tensor", work.amax()), ("matrix", work.amax(dim=(-2, -1), keepdim=True))):
        out[name] = (top + (work - top).exp().sum(-1, keepdim=True).log()).squeeze(-1).numpy()
    out["no_max"] = work.exp().sum(-1).log().numpy()
    return out


# what each variant of _lse_variants subtracts, for the diagnosis
LSE_MISTAKES = {"tensor": "subtracts one max shared by many queries (the largest score of the whole tensor, or of "
                          "each (T, S) matrix)",
                "matrix": "subtracts the largest score of each (T, S) matrix",
                "no_max": "subtracts no max at all"}


@exercise(LESSON, "masked_logsumexp")
class MaskedLogSumExp(Exercise):
    """The given log-sum-exp subtracts a max before exp; the shown bug takes the whole tensor's. Against float64
    torch.logsumexp over the allowed keys on rows of very different scale, fully masked rows (the result dtype's
    most negative finite number), huge half precision scores, T = S, allowed=None; float32 for half precision
    scores; scores unchanged."""

    uses = ("mask_fill_value",)  # the given code fills the blocked keys with it
    reference = ref

    def cases(self, rng):
        rows = [
            # (id, scores shape, mask shape or None, causal mask, dtype, row offsets, situation)
            ("f32", (2, 3, 5, 7), (2, 1, 5, 7), False, "float32", [0.0, 250.0, -120.0, 40.0, 0.0],
             "rows far apart (offsets up to 250), two fully masked rows"),
            ("f16", (2, 2, 4, 6), (4, 6), False, "float16", [0.0, 20000.0, -20000.0, 5000.0],
             "scores up to ±20000, a (T, S) mask broadcast over B and H, a fully masked row"),
            ("bf16", (3, 5), (3, 5), False, "bfloat16", [0.0, 300.0, -300.0], "rows far apart, a fully masked row"),
            ("square", (2, 6, 6), (6, 6), True, "float32", [0.0, 0.0, 150.0, 0.0, -150.0, 0.0],
             "T = S = 6 with a causal mask, rows far apart"),
            ("f64", (1, 4, 6), None, False, "float64", [0.0, 1500.0, -1500.0, 0.0], "allowed=None, rows 1500 apart"),
        ]
        cases = []
        for case_id, shape, mask_shape, causal, dtype, offsets, what in rows:
            scores = _round(rng.standard_normal(shape) * 3 + np.asarray(offsets)[:, None], dtype)  # (..., T, S)
            allowed = np.tril(np.ones(mask_shape, bool)) if causal else _mask(rng, mask_shape)
            case = _scores_case(case_id, scores, allowed, dtype, what)
            if allowed is not None:  # first without the mask: mask_fill_value is not reached, the max is on trial
                case.call("masked_logsumexp", {"ref": "scores"}, None, record="plain")
            case.call("masked_logsumexp", {"ref": "scores"}, None if allowed is None else case.tensor(allowed),
                      record="out")
            judges.record_after(case, ["scores"])
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            scores, allowed, dtype = case.data["scores"], case.data["allowed"], case.data["dtype"]
            _raise_overflow(result, case)
            if allowed is not None:
                self._judge_one(result, case, "plain", scores, None, dtype, "masked_logsumexp(scores, None)")
            self._judge_one(result, case, "out", scores, allowed, dtype, "masked_logsumexp(scores, allowed)")
            _unchanged(result, case, ["scores"], "masked_logsumexp")

    @staticmethod
    def _judge_one(result: Result, case: Case, name: str, scores: np.ndarray, allowed: np.ndarray | None, dtype: str,
                   what: str) -> None:
        """One recorded log-sum-exp against float64 torch.logsumexp: dtype, NaN and infinities, fully masked rows."""
        got = result.get(case.id, name, what=what, kind="tensor", dtype="float", shape=scores.shape[:-1],
                         finite=False).astype(np.float64)
        kept = "float64" if dtype == "float64" else "float32"
        declared = result.meta(case.id, name).get("dtype")
        if declared != f"torch.{kept}":
            raise Fail(f"{what} returned {declared} for {dtype} scores ({case.desc}): the result is float32 for "
                       "float16, bfloat16 and float32 scores, float64 for float64 ones.")
        mask = np.ones(scores.shape, bool) if allowed is None else np.broadcast_to(allowed, scores.shape)
        dead = ~mask.any(-1)  # (..., T): queries with no allowed key
        s = torch.from_numpy(np.asarray(scores, np.float64))
        want = s.masked_fill(~torch.from_numpy(mask.copy()), -np.inf).logsumexp(-1).numpy()
        want[dead] = torch.finfo(_torch_dtype(kept)).min
        variants = _lse_variants(scores, allowed, dtype)
        own_row = "each query must subtract the max of its own row of scores (amax over the last axis, keepdim=True)"
        hint = judges.diagnose(got, {f"a version that {idea}: {own_row}": variants[variant]
                                     for variant, idea in LSE_MISTAKES.items()}, rtol=1e-5, atol=1e-4) or (
            "Subtract each query's own largest score (the max over the last axis, keepdim) before exp.")
        if np.isnan(got).any():
            raise Fail(f"{what} contains NaN ({case.desc}): a fill of -inf gives -inf - (-inf) = NaN; the "
                       "given code fills with mask_fill_value, which must be finite. " + hint)
        if np.isposinf(got).any():
            raise Fail(f"{what} contains +inf ({case.desc}): exp of a large score overflowed. " + hint)
        wrong_dead = dead & (got != want)
        if wrong_dead.any():
            index = tuple(int(i) for i in np.argwhere(wrong_dead)[0])
            raise Fail(f"query {index} has no allowed key and gave {got[index]:.6g}, not {kept}'s most negative "
                       f"finite number ({case.desc}): its filled scores minus the max it subtracts must be 0, "
                       "so that the row sums to S terms of exp(0) = 1. " + hint)
        lost = np.isneginf(got) & ~dead
        if lost.any():
            index = tuple(int(i) for i in np.argwhere(lost)[0])
            raise Fail(f"{what}: query {index} has allowed keys but gave -inf ({case.desc}): each of its terms "
                       "exp(score - max) underflowed to 0, because its scores are far below the max the code "
                       "subtracted, so log(0) = -inf. A query's log-sum-exp depends on its own row only. " + hint)
        expect_close(got, want, f"{what} (vs torch.logsumexp in float64 over the allowed keys)", case.desc,
                     rtol=1e-5, atol=1e-4 if kept == "float64" else 2e-3, hint=hint)
