"""Hidden checks of lesson 03-multi-head: head split/merge (einops and reshape), then MultiHeadAttention.

Expected values of ``MultiHeadAttention`` come from PyTorch's own ``nn.MultiheadAttention`` (float64, eval mode)
with the same weights copied in (``decoder_course.twins``); its masks use the opposite polarity (True = blocked), so
``allowed`` is inverted in :func:`torch_mha_expected` and nowhere else. Split/merge are specs, judged against the
reference (itself proven against ``view`` + ``transpose`` in tests/test_reference_layers.py), on NumPy arrays and
torch tensors alike. ``MultiHeadAttention``'s cases are rows (situation, sizes, mask, what else the case checks) fed to
one case maker and one judge.
"""

from __future__ import annotations

import numpy as np
import torch

from autograder.checks import judges, spec
from autograder.checks.framework import Case, Exercise, Fail, Raised, Result, exercise, expect_close
from autograder.reference import masks as ref_masks
from autograder.reference import multi_head as ref
from decoder_course import twins
from decoder_course.visible import l03_multi_head as visible

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


# -- split / merge: specs (decoder_course/visible/l03_multi_head.py) ---------------------------------------------
spec.register(LESSON, visible.SPECS, ref)


# -- MultiHeadAttention ------------------------------------------------------------------------------------------
def _mha_mask(rng, kind: str, B: int, T: int, S: int, H: int) -> np.ndarray | None:
    """The ``allowed`` mask of one row of MultiHeadAttention's cases (None: no mask)."""
    if kind == "causal+padding":  # (B, 1, T, T)
        return ref_masks.combine_masks(ref_masks.causal_mask(T), judges.right_padded(rng, B, T, min_real=2))
    if kind == "key padding":  # (B, 1, 1, S)
        return judges.right_padded(rng, B, S, min_real=2)[:, None, None, :]
    if kind == "per head":  # (B, H, T, S): every row keeps a key
        allowed = rng.random((B, H, T, S)) < 0.5
        allowed[..., int(rng.integers(S))] |= ~allowed.any(axis=-1)
        return allowed
    if kind == "empty rows":  # (B, 1, T, S): one whole sequence of empty memory, one row elsewhere
        allowed = np.ones((B, 1, T, S), dtype=bool)
        allowed[0, 0, :, 4:] = False
        allowed[0, 0, int(rng.integers(T))] = False
        allowed[1] = False
        return allowed
    if kind == "causal":  # (T, T): a 2-D mask must broadcast too
        return ref_masks.causal_mask(T)
    if kind == "short padding":  # (B, 1, 1, S), row 1 with two real keys at most
        is_real = judges.right_padded(rng, B, S)
        is_real[1, 2:] = False
        return is_real[:, None, None, :]
    return None


# (situation, B, T, S, H, Dh, mask, what else the case checks); S = None: self-attention, q = k = v
_MHA_ROWS = [
    ("self-attention, B={B}, T={T}, H={H}, Dh={Dh}, a causal + padding mask of shape (B, 1, T, T), batch rows of "
     "very different scale", 3, None, None, 3, 4, "causal+padding", "scales"),
    ("query length T={T} ≠ key length S={S}, B={B}, H={H}, Dh={Dh}, a key-padding mask of shape (B, 1, 1, S)",
     2, 4, 7, 2, 5, "key padding", None),
    ("B={B}, H={H}, T={T}, S={S}, Dh={Dh}, no mask (allowed=None)", 1, 3, 5, 1, 6, None, None),
    ("a different mask per head, shape (B, H, T, S) = ({B}, {H}, {T}, {S})", 2, 5, 3, 4, 2, "per head", None),
    ("fully masked query rows (B={B}, T={T}, S={S}, H={H}, Dh={Dh}), with a backward pass", 2, 4, 6, 2, 3,
     "empty rows", "grad"),
    ("causal self-attention with a (T, T) mask, B={B}, T={T}, H={H}, Dh={Dh}", 2, 6, None, 2, 4, "causal", "future"),
    ("key padding, B={B}, T={T}, S={S}, H={H}, Dh={Dh}", 3, 3, 5, 2, 3, "short padding", "padding"),
    ("MultiHeadAttention(D={D}, H={H}, dropout=0.5), eval then train mode", 2, 5, 6, 2, 4, None, "dropout"),
]


@exercise(LESSON, "MultiHeadAttention")
class MultiHeadAttentionCheck(Exercise):
    # the lesson's MultiHeadAttention calls the student's own split_heads and merge_heads
    uses = ("split_heads", "merge_heads")
    reference = ref
    # PyTorch's own multi-head attention, or its fused kernel, would do the exercise's work
    forbidden = ("nn.MultiheadAttention", "F.scaled_dot_product_attention", "F.multi_head_attention_forward")

    def cases(self, rng):
        cases = []
        for i, (situation, B, T, S, H, Dh, mask, extra) in enumerate(_MHA_ROWS):
            T = int(rng.choice([5, 6])) if T is None else T
            self_attn, S = S is None, T if S is None else S
            allowed = _mha_mask(rng, mask, B, T, S, H)
            desc = situation.format(B=B, T=T, S=S, H=H, Dh=Dh, D=H * Dh)
            case = self._case(rng, f"c{i}", desc, B, T, S, H, Dh, allowed, self_attn=self_attn, extra=extra)
            d, inputs = case.data, [{"ref": n} for n in (["query"] * 3 if self_attn else ["query", "key", "value"])]
            if extra == "grad":
                case.let("out", {"index": ["res", 0]})
                case.backward("out", rng.normal(size=(B, T, H * Dh)).astype(np.float32))
                for name in ("query", "key", "value"):
                    case.record(f"grad_{name}", {"grad": name})
            elif extra == "future":  # a second input that differs only after position t0
                d["t0"] = t0 = int(rng.integers(1, T - 1))
                x2 = d["query"].copy()
                x2[:, t0 + 1:] += 3.0 * rng.normal(size=x2[:, t0 + 1:].shape).astype(np.float32)
                case.call({"ref": "m"}, *[case.tensor(x2)] * 3, allowed={"ref": "allowed"}, record="res2")
            elif extra == "padding":  # padded keys and values replaced by huge values in a second call
                is_real = allowed[:, 0, 0, :]  # (B, S)
                key2, value2 = d["key"].copy(), d["value"].copy()
                key2[~is_real] = 100.0 * rng.normal(size=key2[~is_real].shape)
                value2[~is_real] = 100.0 * rng.normal(size=value2[~is_real].shape)
                case.call({"ref": "m"}, {"ref": "query"}, case.tensor(key2), case.tensor(value2),
                          allowed={"ref": "allowed"}, record="res2")
            elif extra == "dropout":  # off in eval mode (twice the same, equal to PyTorch), on in train mode
                case.call({"ref": "m"}, *inputs, record="res_eval2")
                case.steps.append({"train": "m"})
                case.seed(int(rng.integers(1 << 30)))
                case.call({"ref": "m"}, *inputs, record="res_train")
            cases.append(case)
        # refused at construction: d_model not divisible by n_heads
        case = Case("indivisible", "MultiHeadAttention(10, 3)", data={"indivisible": True})
        case.call("MultiHeadAttention", 10, 3, let="m")
        cases.append(case)
        return cases

    def _case(self, rng, cid, desc, B, T, S, H, Dh, allowed, *, self_attn, extra):
        D = H * Dh
        state = random_mha_state(rng, D)
        scales = np.array([0.2, 1.0, 5.0]) if extra == "scales" else np.ones(B)
        query = (rng.normal(size=(B, T, D)) * scales[:, None, None]).astype(np.float32)
        key = query if self_attn else rng.normal(size=(B, S, D)).astype(np.float32)
        value = query if self_attn else rng.normal(size=(B, S, D)).astype(np.float32)
        inputs = ["query"] + ([] if self_attn else ["key", "value"]) + ([] if allowed is None else ["allowed"])
        case = Case(cid, desc, data={"state": state, "H": H, "query": query, "key": key, "value": value,
                                     "allowed": allowed, "extra": extra, "inputs": inputs})
        case.call("MultiHeadAttention", D, H, **({"dropout": 0.5} if extra == "dropout" else {}), let="m")
        case.load_state("m", state)
        case.eval("m")
        for name in inputs:
            case.let(name, case.tensor(case.data[name], requires_grad=extra == "grad" and name != "allowed"))
        names = ["query"] * 3 if self_attn else ["query", "key", "value"]
        case.call({"ref": "m"}, *({"ref": n} for n in names), allowed={"ref": "allowed"} if allowed is not None
                  else None, let="res", record="res")
        judges.record_after(case, inputs)
        return case

    def judge(self, result: Result):
        what = "MultiHeadAttention"
        hint = " MultiHeadAttention builds on your split_heads and merge_heads: if their checks fail, fix them first."
        for case in result.cases.values():
            if case.data.get("indivisible"):
                judges.value_error(result, case.id, "MultiHeadAttention(10, 3): d_model=10 cannot be cut into 3 equal "
                                   "heads")
                continue
            raise_module_error(result, case.id)
            d = case.data
            out, _ = judge_attention_output(result, case.id, "res", d["state"], d["H"], d["query"], d["key"],
                                            d["value"], d["allowed"], what, extra_hint=hint)
            judges.unchanged(result, case.id, {name: d[name] for name in d["inputs"]}, what)
            if d["extra"] == "grad":
                self._judge_gradients(result, case)
            elif d["extra"] in ("future", "padding"):
                get_pair(result, case.id, "res2", what)
                out2 = result.get(case.id, "res2/0", what="the output of the second call", kind="tensor",
                                  shape=out.shape)
                if d["extra"] == "future":
                    t0 = d["t0"]
                    judges.leak(out[:, :t0 + 1], out2[:, :t0 + 1], f"an output at a position <= {t0} changed when "
                                f"only positions > {t0} of the input changed ({case.desc}): the future leaks. Is the "
                                "mask applied in every head?", atol=ATOL)
                else:
                    judges.leak(out, out2, f"the output changed when only padded keys and values changed "
                                f"({case.desc}): padding leaks into real outputs. Apply the mask to the scores of "
                                "every head.", atol=ATOL)
            elif d["extra"] == "dropout":
                for name in ("res_eval2", "res_train"):
                    get_pair(result, case.id, name, what)
                judges.dropout(result, case.id, what, out.shape, "to the attention weights, with an "
                               "nn.Dropout(dropout) module (it is off after .eval())", train="res_train/0",
                               evals=("res/0", "res_eval2/0"))
                self._judge_dropout_place(result, case)

    @staticmethod
    def _judge_gradients(result: Result, case: Case) -> None:
        for name in ("query", "key", "value"):
            if result.meta(case.id, f"grad_{name}").get("type") != "torch.Tensor":
                raise Fail(f"no gradient reached the {name} ({case.desc}): does forward detach, or go through NumPy? "
                           "Gradients must flow through attention for training.")
            grad = result.get(case.id, f"grad_{name}", what=f"the gradient of the {name}", kind="tensor", finite=False)
            if not np.isfinite(grad).all():
                raise Fail(f"the gradient of the {name} holds NaN or inf when some query rows are fully masked "
                           f"({case.desc}). -inf in the scores (an additive -inf bias, say) gives NaN gradients on "
                           "such rows even when their weights are zeroed afterwards: fill blocked scores with a finite "
                           "value such as torch.finfo(scores.dtype).min.")

    @staticmethod
    def _judge_dropout_place(result: Result, case: Case) -> None:
        """Dropout on the attention weights: the weights returned in train mode are the dropped ones (0, or the
        eval weights / (1 - p)), and the output is what those weights make of the values."""
        d, p = case.data, 0.5
        (B, T, D), H = d["query"].shape, d["H"]
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
        out_train = result.get(case.id, "res_train/0", what="the output in train mode", kind="tensor", shape=(B, T, D))
        if not np.allclose(out_train, want, rtol=1e-4, atol=1e-4):
            raise Fail(f"in train mode the output is not what the dropped-out weights make of the values "
                       f"({case.desc}): apply dropout once, to the attention weights only, not again to the output.")


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

    def cases(self, rng):
        cases = []
        for cid, situation, B, T, H, Dh, padding in [  # padding: "right", "left" or None (is_real=None)
                ("right", "padding at the end of the sequences", 3, None, 2, 4, "right"),
                ("left", "padding at the start of the sequences (left padding)", 3, None, 3, 2, "left"),
                ("none", "is_real=None", 2, 4, 2, 3, None)]:
            T = int(rng.choice([5, 6])) if T is None else T
            is_real = None if padding is None else judges.right_padded(rng, B, T, min_real=2)  # (B, T)
            if padding == "left":
                is_real = is_real[:, ::-1].copy()  # (B, T): padding, then real tokens
            D = H * Dh
            state = random_mha_state(rng, D)
            x = rng.normal(size=(B, T, D)).astype(np.float32)
            allowed = ref_masks.causal_mask(T)[None, None] if is_real is None else \
                ref_masks.combine_masks(ref_masks.causal_mask(T), is_real)  # (B or 1, 1, T, T)
            case = Case(cid, f"B={B}, T={T}, H={H}, Dh={Dh}, {situation}", data={
                "state": state, "H": H, "x": x, "is_real": is_real, "allowed": allowed})
            case.call("MultiHeadAttention", D, H, let="m")
            case.load_state("m", state)
            case.eval("m")
            inputs = ["x"] + ([] if is_real is None else ["is_real"])
            for name in inputs:
                case.let(name, case.tensor(case.data[name]))
            case.call("causal_self_attention", {"ref": "m"}, {"ref": "x"}, {"ref": "is_real"} if is_real is not None
                      else None, record="res")
            judges.record_after(case, inputs)
            cases.append(case)
        return cases

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
                why = "a padded key" if not real[b, s] else f"a later key (s = {s} > t = {t}): the future leaks"
                raise Fail(f"{what} lets query {t} of sequence {b} attend to key {s}, {why} ({case.desc}). Print the "
                           "mask it hands mha for one padded sequence as a T × T grid (rows are queries, columns "
                           "keys) and compare it with what the docstring allows.")
            starved = full.any(axis=-1) & (np.abs(weights).sum(axis=-1) < 1e-6)  # (B, H, T)
            if starved.any():
                b, _, t = (int(i) for i in np.argwhere(starved)[0])
                raise Fail(f"query {t} of sequence {b} attends to nothing, although it may attend to the real keys at "
                           f"or before it ({case.desc}). Padding is masked on the key axis only: a padded query still "
                           "attends, like any other.")
            judge_attention_output(result, case.id, "res", d["state"], d["H"], d["x"], d["x"], d["x"], d["allowed"],
                                   what)
            judges.unchanged(result, case.id, {"x": d["x"], "is_real": d["is_real"]}, what)
