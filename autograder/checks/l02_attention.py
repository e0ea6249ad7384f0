"""Hidden checks of lesson 02-attention (NumPy): softmax, masked softmax, scaled dot-product attention.

``softmax`` and ``masked_softmax`` are specs (``decoder_course/visible/l02_attention.py``). For attention, inputs
that do not hide bugs: B, H, T, S, Dh all different (and Dh != Dv), rows of very different scale, fully
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

from autograder.checks import judges, spec
from autograder.checks.find_the_bug import FindTheBug
from autograder.checks.framework import Case, Exercise, Fail, Result, exercise, expect_close
from autograder.reference import attention as ref
from decoder_course.visible import l02_attention as visible

LESSON = "02-attention"
spec.register(LESSON, visible.SPECS, ref)  # softmax, masked_softmax: rows, contracts, properties in the spec


def _tolerance(dtype: np.dtype) -> dict:
    """Loose enough for float32 answers, tight for float64."""
    return {"rtol": 1e-4, "atol": 1e-5} if np.dtype(dtype).itemsize < 8 else {"rtol": 1e-7, "atol": 1e-9}


def _check_weights(w: np.ndarray, allowed: np.ndarray | None, what: str, desc: str) -> None:
    with spec.shared():
        visible.check_weights(w, allowed, what, desc)


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
            visible.scaled_rows(rng, (B, H, T, Dh), scales=(0.1, 1.0, 3.0)), *normal((B, H, S, Dh), (B, H, S, Dv)),
            visible.random_allowed(rng, (B, 1, T, S)))
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
            rng.standard_normal((1, 2, 5, 4)), visible.random_allowed(rng, (1, 2, 3, 5)))
        # One head, float32, a (T, S) mask broadcast over B and H.
        add("(B, H, T, S, Dh, Dv) = (2, 1, 5, 3, 2, 4), float32, allowed (T, S)",
            *normal((2, 1, 5, 2), (2, 1, 3, 2), (2, 1, 3, 4), dtype=np.float32), visible.random_allowed(rng, (5, 3)))
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
                if np.abs(out[~has_key]).max(initial=0.0) > visible.ATOL:
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
