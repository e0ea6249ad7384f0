"""Hidden checks of lesson 03-multi-head: every exercise is a spec; helpers lesson 04's CachedCrossAttention uses.

The four head exercises, ``MultiHeadAttention`` and ``causal_self_attention`` (find the bug, handed the student's
own ``MultiHeadAttention``) are rows of ``decoder_course/visible/l03_multi_head.py``. The helpers below judge an
``(out, weights)`` pair against ``nn.MultiheadAttention`` in float64 for lesson 04's ``CachedCrossAttention``.
"""
from __future__ import annotations

import numpy as np
import torch

from autograder.checks import spec
from autograder.checks.framework import Fail, Raised, Result, expect_close
from autograder.reference import multi_head as ref
from decoder_course import twins
from decoder_course.visible import l03_multi_head as visible

LESSON = "03-multi-head"

# float32 student code against float64 PyTorch: loose enough for rounding, far tighter than any real bug
RTOL, ATOL = 1e-4, 1e-4
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


# -- shared with lesson 04 ---------------------------------------------------------------------------------------
random_mha_state = visible.random_mha_state  # the spec's, shared with lesson 04


def torch_mha_expected(state, H, query, key, value, allowed=None) -> tuple[np.ndarray, np.ndarray]:
    """``nn.MultiheadAttention``'s (out, per-head weights), with the course's answer on fully blocked rows.

    PyTorch returns NaN for a query that may attend to nothing; the course's convention is zero weights, hence
    a zero attention output and an output row equal to ``out_proj.bias``. Rows blocked in some heads only are
    not supported here (PyTorch's NaN would cover the whole row): cases avoid them.

    Shape:
        query: (B, T, D), key/value: (B, S, D), allowed: bool broadcastable to (B, H, T, S) or None
        -> out: (B, T, D), weights: (B, H, T, S)
    """
    B, T, S = query.shape[0], query.shape[1], key.shape[1]
    attn_mask, empty = None, np.zeros((B, H, T), dtype=bool)
    if allowed is not None:
        full = np.broadcast_to(np.asarray(allowed, dtype=bool), (B, H, T, S))  # (B, H, T, S)
        empty = ~full.any(axis=-1)  # (B, H, T): queries with no allowed key
        # PyTorch's polarity is the opposite of ours (True = blocked): invert here, at the boundary only.
        attn_mask = torch.from_numpy(np.ascontiguousarray(~full).reshape(B * H, T, S))  # (B*H, T, S)
    theirs = twins.torch_twin(state, "attention", H, dtype=torch.float64)
    with torch.no_grad():
        out, weights = theirs(*(torch.from_numpy(np.array(a, dtype=np.float64)) for a in (query, key, value)),
                              attn_mask=attn_mask, need_weights=True, average_attn_weights=False)
    out, weights = out.numpy().copy(), weights.numpy().copy()  # (B, T, D), (B, H, T, S)
    rows = empty.all(axis=1)  # (B, T): blocked in every head
    if (empty.any(axis=1) & ~rows).any():
        raise RuntimeError("a case blocks a query in some heads only: torch_mha_expected cannot judge it")
    weights[empty] = 0.0
    out[rows] = state["out_proj.bias"]
    return out, weights


def module_error_hint(error: str) -> str:
    """A hint for the usual ways a module fails before computing anything."""
    if "state_dict" in error or "Missing key" in error or "Unexpected key" in error:
        return ("the grader loads weights by the contract's names: exactly q_proj, k_proj, v_proj, out_proj, "
                "each an nn.Linear(D, D) with bias, and no other parameters or buffers.")
    if "unexpected keyword argument 'allowed'" in error:
        return "the mask argument of forward is called `allowed` (True = this query may attend to this key)."
    return ""


def raise_module_error(result: Result, case_id: str) -> None:
    """Like ``result.raise_if_error``, with a hint about the contract when one applies."""
    error = result.error(case_id)
    if error is not None:
        hint = module_error_hint(error)
        raise Raised(f"your code raised an exception on a case with {result.cases[case_id].desc}:\n    "
                     f"{error.splitlines()[-1]}" + (f"\n{hint}" if hint else ""))


def get_pair(result: Result, case_id: str, name: str, what: str) -> None:
    """Fail unless the recorded ``name`` is a tuple/list of two items (out, weights)."""
    meta = result.meta(case_id, name)
    if meta.get("type") not in ("tuple", "list") or meta.get("len") != 2:
        raise Fail(f"{what} should return a pair `(out, weights)`, but returned `{meta.get('type')}` "
                   f"({result.cases[case_id].desc}).")


def judge_attention_output(result: Result, case_id: str, name: str, state, H: int, query, key, value, allowed,
                           what: str, extra_hint: str = "", key_name: str = "key",
                           value_name: str = "value") -> tuple[np.ndarray, np.ndarray]:
    """Check one recorded (out, weights) in order: type, shape, finiteness, mask, rows, weights, output."""
    desc = result.cases[case_id].desc
    get_pair(result, case_id, name, what)
    (B, T, D), S = query.shape, key.shape[1]
    out = result.get(case_id, f"{name}/0", what=f"the output of {what}", kind="tensor", dtype="float")
    if out.shape != (B, T, D):
        raise Fail(f"the output of {what} should have shape (B, T, D) = {(B, T, D)}, got {out.shape} ({desc}).")
    weights = result.get(case_id, f"{name}/1", what=f"the weights of {what}", kind="tensor", dtype="float")
    if weights.shape != (B, H, T, S):
        averaged = " (per head: do not average over the heads)" if weights.shape == (B, T, S) else ""
        raise Fail(f"the weights of {what} should have shape (B, H, T, S) = {(B, H, T, S)}, got "
                   f"{weights.shape}{averaged} ({desc}).")
    w = weights.astype(np.float64)
    full = np.broadcast_to(True if allowed is None else np.asarray(allowed, dtype=bool), (B, H, T, S))
    if np.abs(w[~full]).max(initial=0.0) > 1e-6:
        raise Fail(f"{what} puts weight on keys the mask blocks ({desc}). The mask's polarity in this course is "
                   "True = this query may attend to this key (PyTorch's nn.MultiheadAttention reads True as "
                   "blocked: invert only when you call it); it must be applied before the softmax, in every head (a "
                   "(T, S) or (B, 1, 1, S) mask broadcasts to (B, H, T, S)).")
    empty = ~full.any(axis=-1)  # (B, H, T)
    sums = w.sum(axis=-1)  # (B, H, T)
    if np.abs(sums[empty]).max(initial=0.0) > 1e-6:
        raise Fail(f"a query whose keys are all blocked must get zero weights (and a zero attention output), never "
                   f"a uniform average ({desc}): zero its weights after the softmax.")
    if np.abs(sums[~empty] - 1).max(initial=0.0) > 1e-4:
        raise Fail(f"the weights of a query with allowed keys must sum to 1 over the keys ({desc}): is the softmax "
                   "over the last axis (S)?")
    want_out, want_w = torch_mha_expected(state, H, query, key, value, allowed)
    expect_close(w, want_w, f"the weight tensor of {what}", desc, rtol=RTOL, atol=ATOL,
                 hint="The weights are softmax(q·k / √Dh) per head, with Dh = D // H, q from the query through "
                      f"q_proj and k from the {key_name} through k_proj, split into heads before the product."
                      + extra_hint)
    expect_close(out.astype(np.float64), want_out, f"the output of {what}", desc, rtol=RTOL, atol=ATOL,
                 hint=f"The weights are right, so look after them: the values (the {value_name} through v_proj), "
                      "merging the heads back side by side (B, H, T, Dh) → (B, T, D), then out_proj." + extra_hint)
    return out, weights


# -- split / merge, MultiHeadAttention: specs (decoder_course/visible/l03_multi_head.py) ----------------------
spec.register(LESSON, visible.SPECS, ref)
