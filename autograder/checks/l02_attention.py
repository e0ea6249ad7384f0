"""Hidden checks of lesson 02-attention (NumPy): softmax, masked softmax, scaled dot-product attention.

Inputs that do not hide bugs: B, H, T, S, Dh all different (and Dh != Dv), rows of very different scale, fully
masked rows, huge scores, one case each with B = 1 and H = 1 and without batch axes. Values are compared with
the reference computed here in float64, loosely enough for float32 answers; properties (blocked keys get no
weight, fully masked rows are zeros, rows sum to one, no future or padding leakage, inputs unchanged) are
judged first, because their messages say which idea broke.

``masked_softmax`` may call the student's ``softmax``, and attention their ``masked_softmax``: those items are
judged relative to the student's own answers (``uses``, :mod:`autograder.checks.relative`), so a wrong
``softmax`` costs ``softmax`` only.
"""

from __future__ import annotations

import math

import numpy as np

from autograder.checks import judges
from autograder.checks.find_the_bug import FindTheBug
from autograder.checks.framework import Case, Exercise, Fail, Result, exercise, expect_close
from autograder.reference import attention as ref

LESSON = "02-attention"
ATOL = 1e-6  # a weight this small counts as zero (blocked keys, fully masked rows)


def _tolerance(dtype: np.dtype) -> dict:
    """Loose enough for float32 answers, tight for float64."""
    return {"rtol": 1e-4, "atol": 1e-5} if np.dtype(dtype).itemsize < 8 else {"rtol": 1e-7, "atol": 1e-9}


def _scaled_rows(rng: np.random.Generator, shape: tuple[int, ...], scales=(0.01, 1.0, 30.0)) -> np.ndarray:
    """Normal values whose rows (last axis) differ in scale: one global max would underflow some rows."""
    row_scale = rng.choice(scales, size=shape[:-1] + (1,))
    row_scale.reshape(-1)[: len(scales)] = scales  # every scale appears at least once
    return rng.standard_normal(shape) * row_scale


def _random_allowed(rng: np.random.Generator, shape: tuple[int, ...], p: float = 0.6) -> np.ndarray:
    """A random mask with a fully masked row and a fully allowed row (when it has at least two rows)."""
    allowed = rng.random(shape) < p
    rows = allowed.reshape(-1, shape[-1])  # a view: (rows, S)
    rows[0] = True
    if rows.shape[0] > 1:
        rows[-1] = False
    return allowed


def _check_weights(w: np.ndarray, allowed: np.ndarray | None, what: str, desc: str) -> None:
    """Blocked keys get no weight, a fully masked row is all zeros, every other row sums to one."""
    w = w.astype(np.float64)
    full = np.broadcast_to(True if allowed is None else allowed, w.shape)  # (..., T, S)
    has_key = full.any(axis=-1)  # (..., T)
    if (w < -ATOL).any():
        raise Fail(f"{what} has negative weights ({desc}): softmax outputs are probabilities.")
    empty_rows = w[~has_key]  # (rows, S)
    if empty_rows.size and np.allclose(empty_rows, 1.0 / w.shape[-1], atol=1e-4):
        raise Fail(f"a fully masked row of {what} came out as a uniform average, 1/S on every key ({desc}): that is "
                   "what a large negative fill alone gives. The course's rule: a query with no allowed key gets "
                   "weights of exactly zero.")
    leaked = ~full & has_key[..., None] & (np.abs(w) > ATOL)
    if leaked.any():
        raise Fail(f"{what} gives weight to a blocked key ({desc}): mask the scores before the softmax, with the "
                   "course's polarity (True = this query may attend to this key).")
    if empty_rows.size and np.abs(empty_rows).max() > ATOL:
        raise Fail(f"a fully masked row of {what} is not all zeros ({desc}): a query with no allowed key gets "
                   "weights of exactly zero.")
    sums = w.sum(axis=-1)[has_key]
    if sums.size and not np.allclose(sums, 1.0, atol=1e-4):
        raise Fail(f"a row of {what} with allowed keys does not sum to 1 ({desc}). Zeroing blocked weights after a "
                   "plain softmax leaves the rest summing to less than one: mask the scores first, then normalise "
                   "over the keys (the last axis).")


# ------------------------------------------------------------------------------------------------------------
# softmax
# ------------------------------------------------------------------------------------------------------------
@exercise(LESSON, "softmax")
class Softmax(Exercise):
    def cases(self, rng):
        cases = []
        # (shape, dtype, axis or None for the default, how axis is passed, huge scores)
        for i, (shape, dtype, axis, how, huge) in enumerate([
                ((3, 7), "float64", None, None, False), ((2, 3, 4, 5), "float32", None, None, False),
                ((4, 6), "float64", 0, "kwarg", False), ((2, 5, 3), "float32", 1, "positional", False),
                ((3, 6), "float32", -1, "kwarg", True), ((1, 9), "float64", None, None, True)]):
            if huge:
                x = rng.standard_normal(shape) * 1e4
                x[0] = 1e4  # a row of equal huge scores: exactly uniform
                x[-1] = 5e4 + rng.integers(0, 8, size=shape[-1])  # huge and close together
            else:
                x = _scaled_rows(rng, shape, scales=(0.01, 1.0, 1e3))  # exp(1e3) overflows even float64
            x = x.astype(dtype)
            desc = (f"x of shape {shape}, {dtype}, " + ("huge scores" if huge else "rows of very different scale")
                    + (f", axis={axis}" if axis is not None else " (default axis)"))
            case = Case(f"c{i}", desc, data={"x": x, "axis": -1 if axis is None else axis})
            case.let("x", case.array(x))
            args, kwargs = {"kwarg": ((), {"axis": axis}), "positional": ((axis,), {}), None: ((), {})}[how]
            case.call("softmax", {"ref": "x"}, *args, record="out", **kwargs)
            judges.record_after(case, ["x"])
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            x, axis = case.data["x"], case.data["axis"]
            got = result.get(case.id, "out", what="softmax(x)", kind="array", dtype="float", shape=x.shape,
                             finite=False)
            if not np.isfinite(got).all():
                raise Fail(f"softmax(x) contains NaN or inf ({case.desc}). exp overflows for large scores (exp(1000) = "
                           "inf, and inf / inf = NaN), and a max that is not the row's own underflows whole rows to "
                           "0 / 0. Subtract each row's own max (along `axis`) before exp.")
            if not np.allclose(got.astype(np.float64).sum(axis=axis), 1.0, atol=1e-4):
                raise Fail(f"softmax(x) does not sum to 1 along axis {axis} ({case.desc}): normalise along the axis "
                           "you are given, and keep that axis when summing (keepdims=True) so the division "
                           "broadcasts.")
            expect_close(got, ref.softmax(x.astype(np.float64), axis=axis), "softmax(x)", case.desc,
                         **_tolerance(x.dtype),
                         hint="softmax(x) = exp(x - max) / sum(exp(x - max)), max and sum taken along `axis`.")
            judges.unchanged(result, case.id, {"x": x}, "softmax")


# ------------------------------------------------------------------------------------------------------------
# masked_softmax
# ------------------------------------------------------------------------------------------------------------
@exercise(LESSON, "masked_softmax")
class MaskedSoftmax(Exercise):
    uses = ("softmax",)
    reference = ref

    def cases(self, rng):
        B, H, T, S = 2, 3, 4, 5
        causal = np.tril(np.ones((T, T), dtype=bool))  # (T, T)
        key_is_real = np.array([[True] * S, [True, True, False, False, False]])  # (B, S)
        specs = [  # (situation, scores, allowed)
            (f"scores (B, H, T, S) = {(B, H, T, S)}, allowed (B, 1, T, S) with a fully masked row",
             _scaled_rows(rng, (B, H, T, S)), _random_allowed(rng, (B, 1, T, S))),
            ("scores (T, S) = (5, 3), float32, allowed (T, S) with a fully masked row",
             _scaled_rows(rng, (5, 3)).astype(np.float32), _random_allowed(rng, (5, 3))),
            (f"scores (B, H, T, S) = {(B, 2, 3, S)}, key padding allowed (B, 1, 1, S)",
             _scaled_rows(rng, (B, 2, 3, S)), key_is_real[:, None, None, :]),
            (f"scores (B, H, T, S) = (1, 2, {T}, {T}), a causal (T, S) mask broadcast over B and H",
             _scaled_rows(rng, (1, 2, T, T)), causal),
            ("scores (B, T, S) = (3, 4, 6), float32, allowed=None (every key allowed)",
             _scaled_rows(rng, (3, 4, 6)).astype(np.float32), None),
            ("huge scores (B, H, T, S) = (2, 1, 3, 7), float32, allowed (B, H, T, S), a fully masked row",
             (rng.standard_normal((2, 1, 3, 7)) * 1e4).astype(np.float32), _random_allowed(rng, (2, 1, 3, 7))),
        ]
        cases = []
        for i, (desc, scores, allowed) in enumerate(specs):
            case = Case(f"c{i}", desc, data={"scores": scores, "allowed": allowed})
            case.let("scores", case.array(scores))
            case.let("allowed", case.array(allowed) if allowed is not None else None)
            case.call("masked_softmax", {"ref": "scores"}, {"ref": "allowed"}, record="out")
            judges.record_after(case, ["scores"] + (["allowed"] if allowed is not None else []))
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            scores, allowed = case.data["scores"], case.data["allowed"]
            what = "masked_softmax(scores, allowed)"
            got = result.get(case.id, "out", what=what, kind="array", dtype="float", shape=scores.shape)
            _check_weights(got, allowed, what, case.desc)
            expect_close(got, ref.masked_softmax(scores.astype(np.float64), allowed), what, case.desc,
                         **_tolerance(scores.dtype),
                         hint="Over the allowed keys of each row it is the softmax of their scores.")
            judges.unchanged(result, case.id, {"scores": scores, "allowed": allowed}, "masked_softmax")


# ------------------------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# ------------------------------------------------------------------------------------------------------------
def _attention(q, k, v, allowed, scale):
    """Attention with a chosen score scale, to recognise a wrong one (1 or 1/Dh instead of 1/sqrt(Dh))."""
    scores = q @ np.swapaxes(k, -1, -2) * scale  # (..., T, S)
    weights = ref.masked_softmax(scores, allowed)
    return weights @ v, weights


@exercise(LESSON, "scaled_dot_product_attention")
class ScaledDotProductAttention(Exercise):
    uses = ("masked_softmax", "softmax")
    reference = ref

    def cases(self, rng):
        cases: list[Case] = []

        def add(desc, q, k, v, allowed, **data) -> str:
            """One call; with q is k is v (self-attention) one array is passed as queries, keys and values."""
            same = k is q and v is q
            case = Case(f"c{len(cases)}", desc, data={"q": q, "k": k, "v": v, "allowed": allowed, "same_qkv": same,
                                                       **data})
            names = ["q"] if same else ["q", "k", "v"]
            for name in names:
                case.let(name, case.array(case.data[name]))
            kwargs = {}
            if allowed is not None:
                case.let("allowed", case.array(allowed))
                kwargs["allowed"] = {"ref": "allowed"}
            case.call("scaled_dot_product_attention", *([{"ref": "q"}] * 3 if same else [{"ref": n} for n in names]),
                      record="out", **kwargs)
            judges.record_after(case, names)
            cases.append(case)
            return case.id

        def normal(*shapes, dtype=np.float64):
            return [rng.standard_normal(shape).astype(dtype) for shape in shapes]

        # Batched multi-head, every size different, rows of different scale, a fully masked row.
        B, H, T, S, Dh, Dv = 2, 3, 4, 5, 8, 6
        add(f"(B, H, T, S, Dh, Dv) = {(B, H, T, S, Dh, Dv)}, allowed (B, 1, T, S) with a fully masked row",
            _scaled_rows(rng, (B, H, T, Dh), scales=(0.1, 1.0, 3.0)), *normal((B, H, S, Dh), (B, H, S, Dv)),
            _random_allowed(rng, (B, 1, T, S)))
        # No batch axes at all, float32, no mask.
        add("q (T, Dh) = (3, 6), k (S, Dh) = (5, 6), v (S, Dv) = (5, 2), float32, allowed=None",
            *normal((3, 6), (5, 6), (5, 2), dtype=np.float32), None)
        # Key padding, then the same with other values at the padded keys: the output must not move.
        B, T, S, Dh, Dv = 2, 4, 6, 3, 5
        is_real = np.array([[True] * S, [True, True, True, False, False, False]])  # (B, S)
        q, k, v = normal((B, T, Dh), (B, S, Dh), (B, S, Dv))
        desc = f"(B, T, S, Dh, Dv) = {(B, T, S, Dh, Dv)} without heads, key padding (B, 1, S)"
        pair = add(desc, q, k, v, is_real[:, None, :])
        k2, v2 = k.copy(), v.copy()
        k2[~is_real] += 5.0 * rng.standard_normal((int((~is_real).sum()), Dh))
        v2[~is_real] += 5.0 * rng.standard_normal((int((~is_real).sum()), Dv))
        add(f"{desc}, other values at the padded keys", q, k2, v2, is_real[:, None, :], pair=pair, leak="padding")
        # Causal self-attention, then the same with the future changed after position t0.
        B, H, T, Dh = 2, 2, 6, 4
        (x,) = normal((B, H, T, Dh))
        causal = np.tril(np.ones((T, T), dtype=bool))  # (T, T)
        desc = f"causal self-attention, q = k = v of shape (B, H, T, Dh) = {(B, H, T, Dh)}"
        pair = add(desc, x, x, x, causal)
        t0 = int(rng.integers(1, T - 2))
        x2 = x.copy()
        x2[..., t0 + 1:, :] += 3.0 * rng.standard_normal((B, H, T - t0 - 1, Dh))
        add(f"{desc}, positions after {t0} changed", x2, x2, x2, causal, pair=pair, leak="causal", t0=t0)
        # Huge scores in float64, B = 1, with a fully masked row.
        add("huge scores, (B, H, T, S, Dh, Dv) = (1, 2, 3, 5, 4, 4), a fully masked row",
            rng.standard_normal((1, 2, 3, 4)) * 1e3, rng.standard_normal((1, 2, 5, 4)) * 1e2,
            rng.standard_normal((1, 2, 5, 4)), _random_allowed(rng, (1, 2, 3, 5)))
        # One head, float32, a (T, S) mask broadcast over B and H.
        add("(B, H, T, S, Dh, Dv) = (2, 1, 5, 3, 2, 4), float32, allowed (T, S)",
            *normal((2, 1, 5, 2), (2, 1, 3, 2), (2, 1, 3, 4), dtype=np.float32), _random_allowed(rng, (5, 3)))
        return cases

    def _outputs(self, result: Result, case: Case) -> tuple[np.ndarray, np.ndarray]:
        meta = result.meta(case.id, "out")
        if meta.get("type") not in ("tuple", "list") or meta.get("len") != 2:
            raise Fail(f"scaled_dot_product_attention should return a tuple (out, weights), got "
                       f"`{meta.get('type', '?')}` ({case.desc}): end with `return out, weights`.")
        q, k, v = case.data["q"], case.data["k"], case.data["v"]
        lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        want_out, want_w = lead + (q.shape[-2], v.shape[-1]), lead + (q.shape[-2], k.shape[-2])  # (..., T, Dv/S)
        out = result.get(case.id, "out/0", what="out", kind="array", dtype="float")
        weights = result.get(case.id, "out/1", what="weights", kind="array", dtype="float")
        if out.shape == want_w and weights.shape == want_out and want_w != want_out:
            raise Fail(f"the outputs come in the wrong order ({case.desc}): return `out, weights`, the attention "
                       "output first.")
        if weights.shape != want_w:
            raise Fail(f"weights should have shape (..., T, S) = {want_w}, got {weights.shape} ({case.desc}): one "
                       "score per query and key, from q · kᵀ with k's last two axes swapped.")
        if out.shape != want_out:
            raise Fail(f"out should have shape (..., T, Dv) = {want_out}, got {out.shape} ({case.desc}): each "
                       "query's output is its weights times the values, weights @ v.")
        return out, weights

    def judge(self, result: Result):
        outputs = {}
        for case in result.cases.values():
            d = case.data
            out, weights = self._outputs(result, case)
            # first: a changed input would make every later comparison fail for a reason that is not its own
            judges.unchanged(result, case.id, {n: d[n] for n in (["q"] if d["same_qkv"] else ["q", "k", "v"])},
                             "scaled_dot_product_attention")
            _check_weights(weights, d["allowed"], "the attention weights", case.desc)
            if d["allowed"] is not None:
                has_key = np.broadcast_to(d["allowed"], weights.shape).any(axis=-1)  # (..., T)
                if np.abs(out[~has_key]).max(initial=0.0) > ATOL:
                    raise Fail(f"a query with no allowed key should output zeros ({case.desc}): its weights are "
                               "zero, so its weighted average of the values is zero.")
            outputs[case.id] = (out.astype(np.float64), weights)

        # leaks, at a tolerance for float64 (tighter than judges.leak's), naming the first position that moved
        for case in result.cases.values():
            if case.data.get("leak") is None:
                continue
            base, changed = outputs[case.data["pair"]][0], outputs[case.id][0]
            if case.data["leak"] == "causal":
                t0 = case.data["t0"]
                moved = ~np.isclose(changed[..., : t0 + 1, :], base[..., : t0 + 1, :], rtol=1e-7, atol=1e-9)
                if moved.any():
                    raise Fail(f"in causal self-attention, the output at position {int(np.argwhere(moved)[0][-2])} "
                               f"changed when only positions after {t0} were changed: the future leaks. Apply "
                               "`allowed` to the scores before the softmax (True = may attend).")
            elif not np.allclose(changed, base, rtol=1e-7, atol=1e-9):
                raise Fail("changing the keys and values at padded positions changed the output: padded keys leak "
                           "into real queries. Apply `allowed` to the scores before the softmax (True = may "
                           "attend).")

        for case in result.cases.values():
            out, weights = outputs[case.id]
            q, k, v = (case.data[name].astype(np.float64) for name in ("q", "k", "v"))
            allowed, Dh, tol = case.data["allowed"], q.shape[-1], _tolerance(case.data["q"].dtype)
            want_out, want_w = _attention(q, k, v, allowed, 1 / math.sqrt(Dh))
            if not np.allclose(weights, want_w, **tol):
                found = judges.diagnose(weights, {
                    "scores that were not divided by sqrt(Dh)": _attention(q, k, v, allowed, 1.0)[1],
                    "scores divided by Dh instead of sqrt(Dh)": _attention(q, k, v, allowed, 1.0 / Dh)[1]}, **tol)
                if found:
                    raise Fail(f"the attention weights are off on a case with {case.desc}. {found} With Dh = "
                               "q.shape[-1], scores = q · kᵀ / sqrt(Dh).")
            expect_close(weights, want_w, "the attention weights", case.desc, **tol,
                         hint="weights = masked_softmax(q · kᵀ / sqrt(Dh), allowed), with Dh = q.shape[-1] and k's "
                              "last two axes swapped.")
            expect_close(out, want_out, "out", case.desc, **tol, hint="Your weights are right: out = weights @ v.")


# ------------------------------------------------------------------------------------------------------------
# fixed_attention: find the bug (autograder.bugs), judged as scaled_dot_product_attention
# ------------------------------------------------------------------------------------------------------------
@exercise(LESSON, "fixed_attention")
class FixedAttention(FindTheBug, ScaledDotProductAttention):
    """The given attention normalised over the queries (axis -2): the attention's own cases and verdicts."""

    judged_as = "scaled_dot_product_attention"
