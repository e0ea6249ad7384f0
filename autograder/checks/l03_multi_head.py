"""Hidden checks of lesson 03-multi-head: head split/merge (einops and reshape), then MultiHeadAttention.

Expected values of ``MultiHeadAttention`` come from PyTorch's own ``nn.MultiheadAttention`` (float64, eval mode)
with the same weights copied in; its masks use the opposite polarity (True = blocked), so ``allowed`` is inverted
in :func:`torch_mha_expected` and nowhere else. Split/merge are judged against the reference (itself proven
against ``view`` + ``transpose`` in tests/test_reference_layers.py), on NumPy arrays and torch tensors alike.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from autograder.checks.framework import Case, Exercise, Fail, Raised, Result, exercise, expect_close
from autograder.reference import masks as ref_masks
from autograder.reference import multi_head as ref
from decoder_course import twins

LESSON = "03-multi-head"

# float32 student code against float64 PyTorch: loose enough for rounding, far tighter than any real bug
RTOL, ATOL = 1e-4, 1e-4
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


# -- shared with lesson 04 ---------------------------------------------------------------------------------------
def random_mha_state(rng: np.random.Generator, D: int) -> dict[str, np.ndarray]:
    """Random float32 weights under the contract's names; biases far from 0 so a dropped bias shows."""
    state = {}
    for name in PROJECTIONS:
        state[f"{name}.weight"] = (rng.normal(size=(D, D)) / np.sqrt(D)).astype(np.float32)
        state[f"{name}.bias"] = (0.5 * rng.normal(size=D)).astype(np.float32)
    return state


def _t64(a) -> torch.Tensor:
    return torch.from_numpy(np.array(a, dtype=np.float64))


def torch_mha(state: dict[str, np.ndarray], H: int) -> nn.MultiheadAttention:
    """PyTorch's module in float64, eval mode, holding ``state`` (decoder_course.twins packs its in_proj)."""
    return twins.torch_twin(state, "attention", H, dtype=torch.float64)


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
    with torch.no_grad():
        out, weights = torch_mha(state, H)(_t64(query), _t64(key), _t64(value), attn_mask=attn_mask,
                                           need_weights=True, average_attn_weights=False)
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
    if "NotImplementedError" in error:
        return ""
    return ""


def raise_module_error(result: Result, case_id: str) -> None:
    """Like ``result.raise_if_error``, with a hint about the contract when one applies."""
    error = result.error(case_id)
    if error is not None:
        hint = module_error_hint(error)
        desc = result.cases[case_id].desc
        raise Raised(f"your code raised an exception on a case with {desc}:\n    {error.splitlines()[-1]}"
                   + (f"\n{hint}" if hint else ""))


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
    B, T, D = query.shape
    S = key.shape[1]
    out = result.get(case_id, f"{name}/0", what=f"the output of {what}", kind="tensor", dtype="float")
    if out.shape != (B, T, D):
        raise Fail(f"the output of {what} should have shape (B, T, D) = {(B, T, D)}, got {out.shape} ({desc}).")
    weights = result.get(case_id, f"{name}/1", what=f"the weights of {what}", kind="tensor", dtype="float")
    if weights.shape != (B, H, T, S):
        averaged = " (per head: do not average over the heads)" if weights.shape == (B, T, S) else ""
        raise Fail(f"the weights of {what} should have shape (B, H, T, S) = {(B, H, T, S)}, got "
                   f"{weights.shape}{averaged} ({desc}).")
    w = weights.astype(np.float64)
    if allowed is not None:
        full = np.broadcast_to(np.asarray(allowed, dtype=bool), (B, H, T, S))
        if np.abs(w[~full]).max(initial=0.0) > 1e-6:
            raise Fail(f"{what} puts weight on keys the mask blocks ({desc}). The mask's polarity in this course "
                       "is True = this query may attend to this key (PyTorch's nn.MultiheadAttention reads "
                       "True as blocked: invert only when you call it); it must be applied before the softmax, in "
                       "every head (a (T, S) or (B, 1, 1, S) mask broadcasts to (B, H, T, S)).")
        empty = ~full.any(axis=-1)  # (B, H, T)
    else:
        empty = np.zeros((B, H, T), dtype=bool)
    sums = w.sum(axis=-1)  # (B, H, T)
    if np.abs(sums[empty]).max(initial=0.0) > 1e-6:
        raise Fail(f"a query whose keys are all blocked must get zero weights (and a zero attention output), "
                   f"never a uniform average ({desc}): zero its weights after the softmax.")
    if np.abs(sums[~empty] - 1).max(initial=0.0) > 1e-4:
        raise Fail(f"the weights of a query with allowed keys must sum to 1 over the keys ({desc}): is the "
                   "softmax over the last axis (S)?")
    want_out, want_w = torch_mha_expected(state, H, query, key, value, allowed)
    expect_close(w, want_w, f"the weight tensor of {what}", desc, rtol=RTOL, atol=ATOL,
                 hint="The weights are softmax(q·k / √Dh) per head, with Dh = D // H, q from the query through "
                      f"q_proj and k from the {key_name} through k_proj, split into heads before the product."
                      + extra_hint)
    expect_close(out.astype(np.float64), want_out, f"the output of {what}", desc, rtol=RTOL, atol=ATOL,
                 hint=f"The weights are right, so look after them: the values (the {value_name} through v_proj), "
                      "merging the heads back side by side (B, H, T, Dh) → (B, T, D), then out_proj." + extra_hint)
    return out, weights


def check_unchanged(result: Result, case_id: str, pairs: dict[str, np.ndarray], what: str) -> None:
    """Inputs recorded after the call must equal what was passed."""
    for name, before in pairs.items():
        after = result.get(case_id, name, what=f"{name} after the call", kind="array", finite=False)
        if after.shape != before.shape or not np.array_equal(after, before):
            raise Fail(f"{what} changed the caller's `{name.removesuffix('_after')}` in place "
                       f"({result.cases[case_id].desc}): build new tensors instead (`x = x + 1`, not `x += 1`).")


def expect_value_error(result: Result, case_id: str, why: str) -> None:
    """The case was built to be refused: its call must have raised a ValueError (``why`` says what was wrong)."""
    error = result.error(case_id)
    if error is not None and "NotImplementedError" in error:
        result.raise_if_error(case_id)
    if error is None:
        raise Fail(f"{why}, yet your code accepted it: raise a ValueError that says so, instead of failing later "
                   "with a less helpful message (or not at all).")
    if "ValueError" not in error:
        raise Fail(f"{why}: raise a ValueError, but your code raised:\n    {error.splitlines()[-1]}")


# -- split / merge -----------------------------------------------------------------------------------------------
# (B, T, H, Dh, backend): B = 1 and H = 1 included; elsewhere T, H and Dh all differ, Dh >= 2
_SPLIT_SIZES = [(2, 5, 3, 4, "numpy"), (3, 4, 2, 6, "torch"), (1, 3, 1, 5, "torch"), (2, 6, 4, 3, "numpy"),
                (1, 7, 5, 2, "numpy")]


def _random_sizes(rng) -> tuple[int, int, int, int]:
    """B, T, H, Dh drawn so that T, H and Dh all differ (a missing transpose cannot hide)."""
    while True:
        B, T, H, Dh = (int(n) for n in (rng.integers(2, 4), rng.integers(3, 9), rng.integers(2, 6),
                                        rng.integers(2, 6)))
        if len({T, H, Dh}) == 3:
            return B, T, H, Dh


def _value(case: Case, x: np.ndarray, backend: str) -> dict:
    return case.array(x) if backend == "numpy" else case.tensor(x)


class _HeadsExercise(Exercise):
    """Split or merge, graded the same way for the einops and the reshape versions."""

    split = True  # split_heads(x, H): (B, T, D) -> (B, H, T, Dh); else merge_heads(x): (B, H, T, Dh) -> (B, T, D)
    refuses_indivisible = False  # the exercise asks for a ValueError when D is not divisible by H

    def cases(self, rng):
        sizes = _SPLIT_SIZES + [(*_random_sizes(rng), "torch"), (*_random_sizes(rng), "numpy")]
        cases = []
        for i, (B, T, H, Dh, backend) in enumerate(sizes):
            dtype = np.float32 if i % 2 else np.float64
            shape = (B, T, H * Dh) if self.split else (B, H, T, Dh)
            x = rng.normal(size=shape).astype(dtype)
            desc = f"a {'NumPy array' if backend == 'numpy' else 'torch tensor'} with B={B}, T={T}, H={H}, Dh={Dh}"
            case = Case(f"c{i}", desc, data={"x": x, "H": H, "backend": backend})
            case.let("x", _value(case, x, backend))
            args = ({"ref": "x"}, H) if self.split else ({"ref": "x"},)
            case.call(self.name, *args, record="out")
            case.record("x_after", {"ref": "x"})
            cases.append(case)
        if self.refuses_indivisible:
            # a torch tensor: NumPy's own reshape error would be a ValueError by accident
            case = Case("indivisible", "a torch tensor with D=10 and H=3", data={"indivisible": True})
            case.call(self.name, case.tensor(rng.normal(size=(2, 3, 10)).astype(np.float32)), 3, record="out")
            cases.append(case)
        return cases

    def _want(self, x, H):
        if self.split:
            return ref.split_heads(x, H)
        return ref.merge_heads(x)

    def judge(self, result: Result):
        for case in result.cases.values():
            if case.data.get("indivisible"):
                expect_value_error(result, case.id, "D=10 features cannot be cut into H=3 equal heads")
                continue
            x, H, backend = case.data["x"], case.data["H"], case.data["backend"]
            error = result.error(case.id)
            if error is not None and backend == "numpy" and "NotImplementedError" not in error:
                raise Fail(f"your code raised an exception on {case.desc}:\n    {error.splitlines()[-1]}\n"
                           f"{self.name} must work on NumPy arrays as well as torch tensors: .reshape and "
                           ".swapaxes mean the same on both, while .transpose(1, 2) and .view(shape) are torch's "
                           "(NumPy reads them differently).")
            kind = "ndarray" if backend == "numpy" else "tensor"
            got = result.get(case.id, "out", what=f"{self.name}(x)", kind=kind, dtype="float")
            want = self._want(x, H)
            if self.split:
                B, T, D = x.shape
                names, sizes = "(B, H, T, Dh)", (B, H, T, D // H)
            else:
                B, _, T, Dh = x.shape
                names, sizes = "(B, T, D)", (B, T, H * Dh)
            if got.dtype != x.dtype:
                raise Fail(f"{self.name}(x) should keep the input's dtype ({x.dtype}), got {got.dtype} "
                           f"({case.desc}): moving axes never changes the numbers.")
            if got.shape != sizes:
                hint = ""
                if self.split and got.shape == (B, T, H, D // H):
                    hint = ": the head axis must come before time; swap axes 1 and 2"
                elif self.split and got.shape == (B, D // H, T, H):
                    hint = ": H and Dh are swapped: there are H heads of Dh = D // H features each"
                raise Fail(f"{self.name}(x) should have shape {names} = {sizes}, got {got.shape} "
                           f"({case.desc}){hint}.")
            if not np.array_equal(got, want):
                raise Fail(f"{self.name}(x) has the right shape but its values are in the wrong places "
                           f"({case.desc}). {self._diagnose(x, H, got)}")
            check_unchanged(result, case.id, {"x_after": x}, self.name)

    def _diagnose(self, x, H, got) -> str:
        """Name the usual wrong layout when ``got`` matches it (computed from the input, revealing nothing)."""
        if self.split:
            B, T, D = x.shape
            if np.array_equal(got, x.reshape(B, H, T, D // H)):
                return ("Reshaping straight to (B, H, T, Dh) mixes time steps into heads: reshape to "
                        "(B, T, H, Dh) first, then swap the T and H axes.")
            if np.array_equal(got, x.reshape(B, T, D // H, H).swapaxes(1, 3).swapaxes(2, 3)):
                return ("Head h must hold the contiguous features h*Dh ... (h+1)*Dh - 1; yours takes every H-th "
                        "feature: in einops, (h dh) and (dh h) are different splits.")
            return "Head h must hold features h*Dh ... (h+1)*Dh - 1 of every time step."
        B, H, T, Dh = x.shape
        if np.array_equal(got, x.reshape(B, T, H * Dh)):
            return ("Reshaping (B, H, T, Dh) straight to (B, T, D) interleaves time steps and heads: swap the "
                    "H and T axes back first, then reshape.")
        if np.array_equal(got, x.swapaxes(1, 2).swapaxes(2, 3).reshape(B, T, H * Dh)):
            return "The heads must sit side by side, (h dh): features of head h at h*Dh ... (h+1)*Dh - 1."
        return "merge_heads must undo split_heads: head h goes back to features h*Dh ... (h+1)*Dh - 1."


@exercise(LESSON, "split_heads")
class SplitHeads(_HeadsExercise):
    split = True


@exercise(LESSON, "merge_heads")
class MergeHeads(_HeadsExercise):
    split = False


@exercise(LESSON, "split_heads_reshape")
class SplitHeadsReshape(_HeadsExercise):
    split = True
    refuses_indivisible = True
    # the point of this exercise is the reshape + axis swap by hand (the policy sees attributes and imports:
    # `einops.rearrange(...)`, `from einops import rearrange` in the cell; a bare call is left to the visible check)
    forbidden = ("einops.rearrange", "einops")


@exercise(LESSON, "merge_heads_reshape")
class MergeHeadsReshape(_HeadsExercise):
    split = False
    forbidden = ("einops.rearrange", "einops")


# -- MultiHeadAttention ------------------------------------------------------------------------------------------
def _right_padded(rng, B: int, S: int, min_real: int = 1) -> np.ndarray:
    """is_real (B, S): real tokens then padding, one row unpadded, every row with >= min_real real tokens."""
    lengths = rng.integers(min_real, S, size=B)
    lengths[0] = S
    return np.arange(S)[None, :] < lengths[:, None]  # (B, S)


@exercise(LESSON, "MultiHeadAttention", points=2)
class MultiHeadAttentionCheck(Exercise):
    # the lesson's MultiHeadAttention calls the student's own split_heads and merge_heads
    uses = ("split_heads", "merge_heads")
    reference = ref
    # PyTorch's own multi-head attention, or its fused kernel, would do the exercise's work
    forbidden = ("nn.MultiheadAttention", "F.scaled_dot_product_attention", "F.multi_head_attention_forward")

    def _case(self, rng, cid, desc, B, T, S, H, Dh, allowed_np, *, self_attn=False, scales=None, dropout=None,
              grad=False):
        D = H * Dh
        state = random_mha_state(rng, D)
        scales = np.ones(B) if scales is None else np.asarray(scales, dtype=np.float64)
        query = (rng.normal(size=(B, T, D)) * scales[:, None, None]).astype(np.float32)
        key = query if self_attn else rng.normal(size=(B, S, D)).astype(np.float32)
        value = query if self_attn else rng.normal(size=(B, S, D)).astype(np.float32)
        case = Case(cid, desc, data={"state": state, "H": H, "query": query, "key": key, "value": value,
                                     "allowed": allowed_np})
        if dropout is None:
            case.call("MultiHeadAttention", D, H, let="m")
        else:
            case.call("MultiHeadAttention", D, H, dropout=dropout, let="m")
        case.load_state("m", state)
        case.eval("m")
        case.let("query", case.tensor(query, requires_grad=grad))
        if self_attn:
            inputs = [{"ref": "query"}] * 3
        else:
            case.let("key", case.tensor(key, requires_grad=grad))
            case.let("value", case.tensor(value, requires_grad=grad))
            inputs = [{"ref": "query"}, {"ref": "key"}, {"ref": "value"}]
        if allowed_np is not None:
            case.let("allowed", case.tensor(allowed_np))
        allowed_spec = {"ref": "allowed"} if allowed_np is not None else None
        case.call({"ref": "m"}, *inputs, allowed=allowed_spec, let="res", record="res")
        case.record("query_after", {"ref": "query"})
        if not self_attn:
            case.record("key_after", {"ref": "key"})
            case.record("value_after", {"ref": "value"})
        if allowed_np is not None:
            case.record("allowed_after", {"ref": "allowed"})
        return case

    def cases(self, rng):
        cases = []
        # c0 self-attention, causal + padding mask (B, 1, T, T); batch rows of very different scale
        B, T, H, Dh = 3, int(rng.choice([5, 6])), 3, 4
        is_real = _right_padded(rng, B, T, min_real=2)
        allowed = ref_masks.combine_masks(ref_masks.causal_mask(T), is_real)  # (B, 1, T, T)
        cases.append(self._case(rng, "c0", f"self-attention, B={B}, T={T}, H={H}, Dh={Dh}, a causal + padding "
                                "mask of shape (B, 1, T, T), batch rows of very different scale",
                                B, T, T, H, Dh, allowed, self_attn=True, scales=[0.2, 1.0, 5.0]))
        # c1 cross-attention T != S, key padding (B, 1, 1, S)
        B, T, S, H, Dh = 2, 4, 7, 2, 5
        allowed = _right_padded(rng, B, S, min_real=2)[:, None, None, :]  # (B, 1, 1, S)
        cases.append(self._case(rng, "c1", f"query length T={T} ≠ key length S={S}, B={B}, H={H}, Dh={Dh}, a "
                                "key-padding mask of shape (B, 1, 1, S)", B, T, S, H, Dh, allowed))
        # c2 B = 1, H = 1, no mask
        cases.append(self._case(rng, "c2", "B=1, H=1, T=3, S=5, Dh=6, no mask (allowed=None)",
                                1, 3, 5, 1, 6, None))
        # c3 a different mask per head (B, H, T, S): every row keeps a key
        B, T, S, H, Dh = 2, 5, 3, 4, 2
        allowed = rng.random((B, H, T, S)) < 0.5
        allowed[..., int(rng.integers(S))] |= ~allowed.any(axis=-1)  # no fully blocked row in this case
        cases.append(self._case(rng, "c3", f"a different mask per head, shape (B, H, T, S) = {(B, H, T, S)}",
                                B, T, S, H, Dh, allowed))
        # c4 fully masked query rows (one whole sequence of empty memory, one row elsewhere), with gradients
        B, T, S, H, Dh = 2, 4, 6, 2, 3
        allowed = np.ones((B, 1, T, S), dtype=bool)
        allowed[0, 0, :, 4:] = False
        allowed[0, 0, int(rng.integers(T))] = False
        allowed[1] = False
        case = self._case(rng, "c4", f"fully masked query rows (B={B}, T={T}, S={S}, H={H}, Dh={Dh}), "
                          "with a backward pass", B, T, S, H, Dh, allowed, grad=True)
        case.let("out", {"index": ["res", 0]})
        case.backward("out", rng.normal(size=(B, T, H * Dh)).astype(np.float32))
        for name in ("query", "key", "value"):
            case.record(f"grad_{name}", {"grad": name})
        cases.append(case)
        # c5 causal leakage: a second input that differs only after position t0
        B, T, H, Dh = 2, 6, 2, 4
        causal = ref_masks.causal_mask(T)  # (T, T): a 2-D mask must broadcast too
        case = self._case(rng, "c5", f"causal self-attention with a (T, T) mask, B={B}, T={T}, H={H}, Dh={Dh}",
                          B, T, T, H, Dh, causal, self_attn=True)
        t0 = int(rng.integers(1, T - 1))
        x2 = case.data["query"].copy()
        x2[:, t0 + 1:] += 3.0 * rng.normal(size=x2[:, t0 + 1:].shape).astype(np.float32)
        case.data.update(t0=t0)
        case.call({"ref": "m"}, *[case.tensor(x2)] * 3, allowed={"ref": "allowed"}, record="res2")
        cases.append(case)
        # c6 padding leakage: padded keys and values replaced by huge values in a second call
        B, T, S, H, Dh = 3, 3, 5, 2, 3
        is_real = _right_padded(rng, B, S, min_real=1)
        is_real[1, 2:] = False
        case = self._case(rng, "c6", f"key padding, B={B}, T={T}, S={S}, H={H}, Dh={Dh}", B, T, S, H, Dh,
                          is_real[:, None, None, :])
        key2, value2 = case.data["key"].copy(), case.data["value"].copy()
        key2[~is_real] = 100.0 * rng.normal(size=key2[~is_real].shape)
        value2[~is_real] = 100.0 * rng.normal(size=value2[~is_real].shape)
        case.call({"ref": "m"}, {"ref": "query"}, case.tensor(key2), case.tensor(value2),
                  allowed={"ref": "allowed"}, record="res2")
        cases.append(case)
        # c7 dropout: off in eval mode (equal to PyTorch), on in train mode
        B, T, S, H, Dh = 2, 5, 6, 2, 4
        case = self._case(rng, "c7", f"MultiHeadAttention(D={H * Dh}, H={H}, dropout=0.5), eval then train mode",
                          B, T, S, H, Dh, None, dropout=0.5)
        case.steps.append({"train": "m"})
        case.seed(int(rng.integers(1 << 30)))
        case.call({"ref": "m"}, {"ref": "query"}, {"ref": "key"}, {"ref": "value"}, record="res_train")
        cases.append(case)
        # refused at construction: d_model not divisible by n_heads
        case = Case("indivisible", "MultiHeadAttention(10, 3)", data={"indivisible": True})
        case.call("MultiHeadAttention", 10, 3, let="m")
        cases.append(case)
        return cases

    @staticmethod
    def _judge_dropout_place(result: Result, case: Case, out_train: np.ndarray) -> None:
        """Dropout on the attention weights: the weights returned in train mode are the dropped ones (0, or the
        eval weights / (1 - p)), and the output is what those weights make of the values."""
        d, p = case.data, 0.5
        B, T, D = d["query"].shape
        H = d["H"]
        _, w_eval = torch_mha_expected(d["state"], H, d["query"], d["key"], d["value"])  # (B, H, T, S)
        w_train = result.get(case.id, "res_train/1", what="the weights in train mode", kind="tensor",
                             shape=w_eval.shape)
        dropped = (w_train == 0) & (w_eval > 1e-6)
        kept = ~dropped & (w_eval > 1e-6)
        if not dropped.any() or not np.allclose(w_train[kept], w_eval[kept] / (1 - p), rtol=1e-4, atol=1e-5):
            raise Fail(f"in train mode the attention weights returned are not dropped out ({case.desc}): dropout "
                       "belongs on the attention weights, before they average the values (attention(q, k, v, "
                       "allowed, dropout=self.dropout) does it, and returns the weights it used, as "
                       "nn.MultiheadAttention does), not on the heads' output or on the module's output.")
        st = {k: v.astype(np.float64) for k, v in d["state"].items()}
        v = d["value"].astype(np.float64) @ st["v_proj.weight"].T + st["v_proj.bias"]  # (B, S, D)
        v = v.reshape(B, -1, H, D // H).transpose(0, 2, 1, 3)  # (B, H, S, Dh)
        heads = w_train.astype(np.float64) @ v  # (B, H, T, Dh)
        want = heads.transpose(0, 2, 1, 3).reshape(B, T, D) @ st["out_proj.weight"].T + st["out_proj.bias"]
        if not np.allclose(out_train, want, rtol=1e-4, atol=1e-4):
            raise Fail(f"in train mode the output is not what the dropped-out weights make of the values "
                       f"({case.desc}): apply dropout once, to the attention weights only, not again to the "
                       "output.")

    def judge(self, result: Result):
        what = "MultiHeadAttention"
        hint = (" MultiHeadAttention builds on your split_heads and merge_heads: if their checks fail, fix them "
                "first.")
        for case in result.cases.values():
            if case.data.get("indivisible"):
                expect_value_error(result, case.id, "MultiHeadAttention(10, 3): d_model=10 cannot be cut into 3 "
                                   "equal heads")
                continue
            raise_module_error(result, case.id)
            d = case.data
            out, _ = judge_attention_output(result, case.id, "res", d["state"], d["H"], d["query"], d["key"],
                                            d["value"], d["allowed"], what, extra_hint=hint)
            inputs = {"query_after": d["query"]}
            if "key_after" in result.report_cases[case.id].get("outputs", {}):
                inputs.update(key_after=d["key"], value_after=d["value"])
            if d["allowed"] is not None:
                inputs["allowed_after"] = d["allowed"]
            check_unchanged(result, case.id, inputs, what)
            if case.id == "c4":
                for name in ("query", "key", "value"):
                    meta = result.meta(case.id, f"grad_{name}")
                    if meta.get("type") != "torch.Tensor":
                        raise Fail(f"no gradient reached the {name} ({case.desc}): does forward detach, or go "
                                   "through NumPy? Gradients must flow through attention for training.")
                    grad = result.get(case.id, f"grad_{name}", what=f"the gradient of the {name}", kind="tensor",
                                      finite=False)
                    if not np.isfinite(grad).all():
                        raise Fail(f"the gradient of the {name} holds NaN or inf when some query rows are fully "
                                   f"masked ({case.desc}). -inf in the scores (an additive -inf bias, say) gives "
                                   "NaN gradients on such rows even when their weights are zeroed afterwards: "
                                   "fill blocked scores with a finite value such as torch.finfo(scores.dtype).min.")
            if case.id == "c5":
                t0 = d["t0"]
                get_pair(result, case.id, "res2", what)
                out2 = result.get(case.id, "res2/0", what="the output of the second call", kind="tensor",
                                  shape=out.shape)
                if not np.allclose(out2[:, :t0 + 1], out[:, :t0 + 1], rtol=RTOL, atol=ATOL):
                    raise Fail(f"an output at a position <= {t0} changed when only positions > {t0} of the input "
                               f"changed ({case.desc}): the future leaks. Is the mask applied in every head?")
            if case.id == "c6":
                get_pair(result, case.id, "res2", what)
                out2 = result.get(case.id, "res2/0", what="the output of the second call", kind="tensor",
                                  shape=out.shape)
                if not np.allclose(out2, out, rtol=RTOL, atol=ATOL):
                    raise Fail(f"the output changed when only padded keys and values changed ({case.desc}): "
                               "padding leaks into real outputs. Apply the mask to the scores of every head.")
            if case.id == "c7":
                get_pair(result, case.id, "res_train", what)
                out_train = result.get(case.id, "res_train/0", what="the output in train mode", kind="tensor",
                                       shape=out.shape)
                if np.allclose(out_train, out, rtol=1e-6, atol=1e-7):
                    raise Fail(f"with dropout=0.5 in train mode the output equals the eval-mode output "
                               f"({case.desc}): the dropout argument is ignored. Keep an nn.Dropout(dropout) and "
                               "apply it to the attention weights (nn.Dropout is off after .eval()).")
                self._judge_dropout_place(result, case, out_train)


# ------------------------------------------------------------------------------------------------------------
# causal_self_attention: find the bug (autograder.bugs), judged relative to the student's MultiHeadAttention
# ------------------------------------------------------------------------------------------------------------
@exercise(LESSON, "causal_self_attention")
class CausalSelfAttention(Exercise):
    """The given block hands the student's ``MultiHeadAttention`` a mask; the shown bug puts the padding on the
    query axis. Judged by MultiHeadAttention's own output check with the right mask (causal, key padding), after
    two checks of the mask alone that say which keys were wrongly allowed or blocked."""

    # built on the student's own module, and through it on their split_heads and merge_heads (a module judged
    # relative to a wrong split_heads passes its own cell): their mistakes cost their own cells
    uses = ("MultiHeadAttention", "split_heads", "merge_heads")
    reference = ref

    def _case(self, rng, cid, desc, B, T, H, Dh, is_real):
        D = H * Dh
        state = random_mha_state(rng, D)
        x = rng.normal(size=(B, T, D)).astype(np.float32)
        allowed = ref_masks.causal_mask(T)[None, None] if is_real is None else \
            ref_masks.combine_masks(ref_masks.causal_mask(T), is_real)  # (B or 1, 1, T, T)
        case = Case(cid, desc, data={"state": state, "H": H, "x": x, "is_real": is_real, "allowed": allowed})
        case.call("MultiHeadAttention", D, H, let="m")
        case.load_state("m", state)
        case.eval("m")
        case.let("x", case.tensor(x))
        if is_real is not None:
            case.let("is_real", case.tensor(is_real))
        case.call("causal_self_attention", {"ref": "m"}, {"ref": "x"},
                  {"ref": "is_real"} if is_real is not None else None, record="res")
        case.record("x_after", {"ref": "x"})
        if is_real is not None:
            case.record("is_real_after", {"ref": "is_real"})
        return case

    def cases(self, rng):
        B, T, H, Dh = 3, int(rng.choice([5, 6])), 2, 4
        right = _right_padded(rng, B, T, min_real=2)  # (B, T): real tokens, then padding
        B2, T2 = 3, int(rng.choice([5, 6]))
        left = _right_padded(rng, B2, T2, min_real=2)[:, ::-1].copy()  # (B, T): padding, then real tokens
        return [
            self._case(rng, "right", f"B={B}, T={T}, H={H}, Dh={Dh}, padding at the end of the sequences",
                       B, T, H, Dh, right),
            self._case(rng, "left", f"B={B2}, T={T2}, H=3, Dh=2, padding at the start of the sequences (left "
                       "padding)", B2, T2, 3, 2, left),
            self._case(rng, "none", "B=2, T=4, H=2, Dh=3, is_real=None", 2, 4, 2, 3, None),
        ]

    def judge(self, result: Result):
        what = "causal_self_attention"
        for case in result.cases.values():
            raise_module_error(result, case.id)
            d = case.data
            B, T, _ = d["x"].shape
            get_pair(result, case.id, "res", what)
            weights = result.get(case.id, "res/1", what=f"the weights of {what}", kind="tensor", dtype="float",
                                 shape=(B, d["H"], T, T))
            full = np.broadcast_to(d["allowed"], weights.shape)  # (B, H, T, T): the mask it should hand mha
            real = np.ones((B, T), dtype=bool) if d["is_real"] is None else d["is_real"]
            leaked = (np.abs(weights) > 1e-6) & ~full
            if leaked.any():
                b, _, t, s = (int(i) for i in np.argwhere(leaked)[0])
                why = ("a padded key" if not real[b, s] else f"a later key (s = {s} > t = {t}): the future leaks")
                raise Fail(f"{what} lets query {t} of sequence {b} attend to key {s}, {why} ({case.desc}). Print "
                           "the mask it hands mha for one padded sequence as a T × T grid (rows are queries, "
                           "columns keys) and compare it with what the docstring allows.")
            starved = full.any(axis=-1) & (np.abs(weights).sum(axis=-1) < 1e-6)  # (B, H, T)
            if starved.any():
                b, _, t = (int(i) for i in np.argwhere(starved)[0])
                raise Fail(f"query {t} of sequence {b} attends to nothing, although it may attend to the real keys "
                           f"at or before it ({case.desc}). Padding is masked on the key axis only: a padded "
                           "query still attends, like any other.")
            judge_attention_output(result, case.id, "res", d["state"], d["H"], d["x"], d["x"], d["x"],
                                   d["allowed"], what)
            unchanged = {"x_after": d["x"]}
            if d["is_real"] is not None:
                unchanged["is_real_after"] = d["is_real"]
            check_unchanged(result, case.id, unchanged, what)
