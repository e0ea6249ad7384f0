"""Visible checks of lesson 03-multi-head: head split/merge on NumPy and torch, then MultiHeadAttention.

The worked examples are written out by hand; the other checks test properties any correct answer has (head h
holds features h*Dh ... (h+1)*Dh - 1, rows sum to one, the future and the padding do not leak) and agreement with
PyTorch's own ``nn.MultiheadAttention``, whose masks use the opposite polarity (True = blocked). The four head
exercises are specs (:mod:`decoder_course.spec`): their rows and properties drive the hidden checks too.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import textwrap

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from decoder_course import twins
from decoder_course.checks import (
    CheckFailed,
    check,
    expect_close,
    expect_dtype,
    expect_inputs_unchanged,
    expect_shape,
    expect_type,
    randomised,
)
from decoder_course.spec import (
    Build,
    Built,
    Keyword,
    ModuleSpec,
    Perturbed,
    Spec,
    load,
    refuse_forbidden,
    run,
    run_module,
)
from decoder_course.visible.l02_attention import check_weights

# The worked example of the lesson: B=1, T=2, D=6 split into H=3 heads of Dh=2 features.
EXAMPLE_X = np.array([[[0, 1, 2, 3, 4, 5], [10, 11, 12, 13, 14, 15]]], dtype=np.float32)  # (B, T, D)
EXAMPLE_HEADS = np.array([[[[0, 1], [10, 11]], [[2, 3], [12, 13]], [[4, 5], [14, 15]]]],
                         dtype=np.float32)  # (B, H, T, Dh)


# (B, T, H, Dh, library): B = 1 and H = 1 included; elsewhere T, H and Dh all differ, Dh >= 2
_HEAD_SIZES = [(2, 5, 3, 4, "numpy"), (3, 4, 2, 6, "torch"), (1, 3, 1, 5, "torch"), (2, 6, 4, 3, "numpy"),
               (1, 7, 5, 2, "numpy")]


def _random_sizes(rng: np.random.Generator) -> tuple[int, int, int, int]:
    """B, T, H, Dh drawn so that T, H and Dh all differ (a missing axis swap cannot hide)."""
    while True:
        B, T, H, Dh = (int(n) for n in (rng.integers(2, 4), rng.integers(3, 9), rng.integers(2, 6),
                                        rng.integers(2, 6)))
        if len({T, H, Dh}) == 3:
            return B, T, H, Dh


def _head_rows(split: bool):
    def rows(rng: np.random.Generator) -> list:
        out = []
        for i, (B, T, H, Dh, library) in enumerate(
                _HEAD_SIZES + [(*_random_sizes(rng), "torch"), (*_random_sizes(rng), "numpy")]):
            x = rng.normal(size=(B, T, H * Dh) if split else (B, H, T, Dh)).astype(np.float32 if i % 2 else np.float64)
            desc = f"a {'NumPy array' if library == 'numpy' else 'torch tensor'} with B={B}, T={T}, H={H}, Dh={Dh}"
            x = x if library == "numpy" else torch.from_numpy(x)
            out.append((desc, {"x": x, "H": H} if split else {"x": x}))
        return out

    return rows


def _wrong_layout(got: np.ndarray, known: list, what: str, desc: str, otherwise: str) -> None:
    """The values sit in the wrong places: name the known layout (``known``: (its values, what it is)) they match."""
    why = next((f"your output is {why}" for wrong, why in known if np.array_equal(got, wrong)), otherwise)
    raise CheckFailed(f"{what} the right shape but the values are in the wrong places ({desc}): {why}")


def _split_layout(args: dict, got: np.ndarray, desc: str) -> None:
    """Head h holds features h*Dh ... (h+1)*Dh - 1 of every time step; a known wrong layout is named."""
    x, H = args["x"], args["H"]
    (B, T, _), Dh = x.shape, x.shape[-1] // H
    if all(np.array_equal(got[:, h], x[:, :, h * Dh:(h + 1) * Dh]) for h in range(H)):
        return
    _wrong_layout(got, [
        (x.reshape(B, H, T, Dh), "a reshape straight to (B, H, T, Dh), which mixes time steps into heads: reshape "
                                 "to (B, T, H, Dh) first, then swap the T and H axes"),
        (x.reshape(B, T, Dh, H).transpose(0, 3, 1, 2), "the split (dh h), each head taking every H-th feature: head h "
         "must hold the contiguous features h*Dh ... (h+1)*Dh - 1 (in einops, (h dh) and (dh h) are different "
         "splits)")], "the heads have", desc, "head h must hold features h*Dh ... (h+1)*Dh - 1 of every time step")


def _merge_layout(args: dict, got: np.ndarray, desc: str) -> None:
    """Features h*Dh ... (h+1)*Dh - 1 of every time step hold head h; a known wrong layout is named."""
    x = args["x"]
    B, H, T, Dh = x.shape
    if all(np.array_equal(got[:, :, h * Dh:(h + 1) * Dh], x[:, h]) for h in range(H)):
        return
    _wrong_layout(got, [
        (x.reshape(B, T, H * Dh), "a reshape of (B, H, T, Dh) straight to (B, T, D), which interleaves time steps "
                                  "and heads: swap the H and T axes back first, then reshape"),
        (x.transpose(0, 2, 3, 1).reshape(B, T, H * Dh), "the heads merged as (dh h), feature by feature: the heads "
         "must sit side by side, (h dh), features of head h at h*Dh ... (h+1)*Dh - 1")],
        "the merged output has", desc,
        "merge_heads must undo split_heads, head h going back to features h*Dh ... (h+1)*Dh - 1")


def _split_shape_hint(args: dict, shape: tuple) -> str:
    B, T, D = args["x"].shape
    H = args["H"]
    if shape == (B, T, H, D // H):
        return "The head axis must come before time: swap axes 1 and 2."
    if shape == (B, D // H, T, H):
        return "H and Dh are swapped: there are H heads of Dh = D // H features each."
    return ""


BOTH_LIBRARIES = ("It must work on NumPy arrays and torch tensors alike: .reshape and .swapaxes mean the same on both, "
                  "while .transpose(1, 2) and .view(shape) are torch's (NumPy reads them differently).")


# What NumPy says when it is handed torch's .transpose(1, 2), .view(shape), .contiguous(), .permute or .size(-1).
_TORCH_ONLY_ON_NUMPY = ("axes don't match array", "has no attribute", "object is not callable", "data type")


def _crash_hint(args: dict, error: str) -> str:
    """Why a head split or merge raised on one of the spec's inputs, every one of them valid: a torch-only call on
    a NumPy array, else a valid input that must not raise (the input named, so that the student can try it)."""
    x = args["x"]
    if isinstance(x, np.ndarray) and any(text in error for text in _TORCH_ONLY_ON_NUMPY):
        return BOTH_LIBRARIES
    given = f"a {'NumPy array' if isinstance(x, np.ndarray) else 'torch tensor'} of shape {tuple(x.shape)}"
    if "H" not in args:
        return f"The input was valid ({given}, (B, H, T, Dh)): a valid input must not raise."
    D, H = x.shape[-1], args["H"]
    return (f"The input was valid ({given} with H={H}: D={D} is a multiple of H): a valid input must not raise; "
            f"only a D that H does not divide raises ValueError.")


def _heads_spec(name: str, split: bool, **more) -> Spec:
    return Spec(name, _head_rows(split), dtype=lambda a: a["x"].dtype, on_error=_crash_hint,
                shape=(lambda a: (a["x"].shape[0], a["H"], a["x"].shape[1], a["x"].shape[2] // a["H"])) if split
                else (lambda a: (a["x"].shape[0], a["x"].shape[2], a["x"].shape[1] * a["x"].shape[3])),
                axes="B, H, T, Dh" if split else "B, T, D", shape_hint=_split_shape_hint if split else "",
                properties=_split_layout if split else _merge_layout, **more)


_BY_HAND = ("einops.rearrange", "einops")  # the reshape versions practise .reshape and .swapaxes by hand
SPECS = {
    "split_heads": _heads_spec("split_heads", True),
    "merge_heads": _heads_spec("merge_heads", False),
    "split_heads_reshape": _heads_spec(
        "split_heads_reshape", True, forbidden=_BY_HAND,
        refused=(("a torch tensor with D=10 and H=3", {"x": torch.zeros(2, 3, 10), "H": 3},
                  "D=10 features cannot be cut into H=3 equal heads"),)),
    "merge_heads_reshape": _heads_spec("merge_heads_reshape", False, forbidden=_BY_HAND),
}


def _no_einops(fn, name: str) -> None:
    """The reshape versions practise reshape and axis swaps by hand: no name from einops in the code (its docstring
    and comments may mention them)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            used |= {getattr(node, "module", None) or "", *(alias.name for alias in node.names)}
        used.add(node.id if isinstance(node, ast.Name) else getattr(node, "attr", ""))
    if {"einops", "rearrange"} & {word.split(".")[0] for word in used}:
        raise CheckFailed(f"{name} must not use einops: this version practises .reshape and .swapaxes by hand")


def _call_on(fn, name: str, *args):
    """``fn(*args)`` (a valid input), turning a crash into a message that names its likely cause: a torch-only call
    on a NumPy array, or a valid input that must not raise."""
    try:
        return expect_inputs_unchanged(fn, *args)
    except (CheckFailed, NotImplementedError):
        raise
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        given = {"x": args[0], "H": args[1]} if len(args) > 1 else {"x": args[0]}
        raise CheckFailed(f"{name} raised {error}. {_crash_hint(given, error)}") from None


def _worked_example(fn, name: str, title: str, x: np.ndarray, args: tuple, want: np.ndarray, names: str,
                    bare: str, hint: str) -> None:
    """``fn(x, *args)`` on NumPy and on torch: type, shape, dtype, the bare-reshape mistake (``bare``), values."""
    call = f"{name}({', '.join(['x', *map(str, args)])})"
    with check(f"{name} on the worked example {title}"):
        for backend, given in [("NumPy", x.copy()), ("torch", torch.from_numpy(x.copy()))]:
            got = _call_on(fn, name, given, *args)
            expect_type(got, type(given), f"{call} on a {backend} input")
            expect_shape(got, want.shape, call, names=names)
            expect_dtype(got, "float32", call)
            if np.array_equal(np.asarray(got), x.reshape(want.shape)):
                raise CheckFailed(bare)
            expect_close(got, want, f"{call} on a {backend} input", hint=hint)


def _split_checks(split_heads, name: str) -> None:
    _worked_example(split_heads, name, "(T=2, D=6, H=3 heads of Dh=2)", EXAMPLE_X, (3,), EXAMPLE_HEADS, "B, H, T, Dh",
                    "you reshaped (B, T, D) straight to (B, H, T, Dh): that mixes time steps into heads. Cut D into "
                    "(H, Dh) first, then move H before T",
                    "head h holds features h*Dh ... (h+1)*Dh - 1 of every time step")
    run(SPECS[name], split_heads)


def _merge_checks(merge_heads, name: str) -> None:
    _worked_example(merge_heads, name, "(H=3 heads of Dh=2 back to D=6)", EXAMPLE_HEADS, (), EXAMPLE_X, "B, T, D",
                    "you reshaped (B, H, T, Dh) straight to (B, T, D): that interleaves time steps and heads. Move H "
                    "back after T first, then merge (H, Dh) into D",
                    "the heads go back side by side: head h fills features h*Dh ... (h+1)*Dh - 1")
    run(SPECS[name], merge_heads)


def check_split_heads(split_heads) -> None:
    """The worked example on NumPy and torch, then which features each head holds."""
    _split_checks(split_heads, "split_heads")


def check_merge_heads(merge_heads) -> None:
    """The worked example backwards, on NumPy and torch, then where each head lands."""
    _merge_checks(merge_heads, "merge_heads")


def check_split_heads_reshape(split_heads_reshape) -> None:
    """As ``check_split_heads``, without einops."""
    with check("split_heads_reshape uses reshape and swapaxes, not einops"):
        _no_einops(split_heads_reshape, "split_heads_reshape")
    _split_checks(split_heads_reshape, "split_heads_reshape")


def check_merge_heads_reshape(merge_heads_reshape) -> None:
    """As ``check_merge_heads``, without einops."""
    with check("merge_heads_reshape uses swapaxes and reshape, not einops"):
        _no_einops(merge_heads_reshape, "merge_heads_reshape")
    _merge_checks(merge_heads_reshape, "merge_heads_reshape")


# -- MultiHeadAttention: a module spec, compared with nn.MultiheadAttention --------------------------------------
_NAMES = ("q_proj", "k_proj", "v_proj", "out_proj")
MHA_NAMES = ("q_proj, k_proj, v_proj, out_proj: each an nn.Linear(d_model, d_model) with a bias, and nothing else "
             "(a mask is an argument of forward, not a buffer)")


def random_mha_state(rng: np.random.Generator, D: int) -> dict[str, np.ndarray]:
    """Random float32 weights under the contract's names; biases far from 0 so that a dropped bias shows."""
    state = {}
    for name in _NAMES:
        state[f"{name}.weight"] = (rng.normal(size=(D, D)) / np.sqrt(D)).astype(np.float32)
        state[f"{name}.bias"] = (0.5 * rng.normal(size=D)).astype(np.float32)
    return state


def _padded(rng: np.random.Generator, B: int, n: int, min_real: int = 2) -> np.ndarray:
    """``is_real`` (B, n): real tokens then padding; sequence 0 unpadded, the others between min_real and n - 1 real."""
    lengths = rng.integers(min_real, n, size=B)
    lengths[0] = n
    return np.arange(n)[None, :] < lengths[:, None]  # (B, n)


def mha_mask(rng: np.random.Generator, kind: str, B: int, T: int, S: int, H: int) -> np.ndarray | None:
    """The ``allowed`` mask of one row (None: no mask). No query is blocked in some heads only."""
    causal = np.tril(np.ones((T, T), dtype=bool))  # (T, T)
    if kind == "causal+padding":  # (B, 1, T, T)
        return causal[None, None] & _padded(rng, B, T)[:, None, None, :]
    if kind == "key padding":  # (B, 1, 1, S)
        return _padded(rng, B, S)[:, None, None, :]
    if kind == "per head":  # (B, H, T, S): every row keeps a key
        allowed = rng.random((B, H, T, S)) < 0.5
        allowed[..., int(rng.integers(S))] |= ~allowed.any(axis=-1)
        return allowed
    if kind == "empty rows":  # (B, 1, T, S): one query with no key, and a whole sequence with an empty memory
        allowed = np.ones((B, 1, T, S), dtype=bool)
        allowed[0, 0, :, 4:] = False
        allowed[0, 0, int(rng.integers(T))] = False
        allowed[1] = False
        return allowed
    return causal if kind == "causal" else None  # a (T, T) mask must broadcast too


def _mha_row(rng, situation: str, B: int, T: int, S: int | None, H: int, Dh: int, mask: str | None,
             dropout: float = 0.0, seed: bool = False, probe: str = "", grad: bool = False) -> Build:
    """One situation: S = None is self-attention (query = key = value)."""
    D, self_attn = H * Dh, S is None
    S = T if self_attn else S
    allowed = mha_mask(rng, mask, B, T, S, H)
    scales = np.array([0.2, 1.0, 5.0])[:B, None, None] if mask == "causal+padding" else 1.0  # rows of unlike scale
    query = (rng.normal(size=(B, T, D)) * scales).astype(np.float32)
    key, value = (query, query) if self_attn else (rng.normal(size=(B, S, D)).astype(np.float32) for _ in "kv")
    inputs = {"query": query, "key": key, "value": value} | ({} if allowed is None else {"allowed": Keyword(allowed)})
    perturbed = None
    if probe == "future":  # the same input after position t0 only: outputs at positions <= t0 must not move
        t0 = int(rng.integers(1, T - 1))
        later = query.copy()
        later[:, t0 + 1:] += 3.0 * rng.normal(size=later[:, t0 + 1:].shape).astype(np.float32)
        perturbed = Perturbed(inputs | {"query": later, "key": later, "value": later},
                              lambda out, t0=t0: out[:, :t0 + 1],
                              f"an output at a position <= {t0} changed when only positions > {t0} of the input "
                              "changed: the future leaks. Is the mask applied in every head, with the course's "
                              "polarity?")
    elif probe == "padding":  # padded keys and values replaced by huge ones: no output may move
        is_real = np.broadcast_to(allowed, (B, 1, T, S))[:, 0, 0]  # (B, S)
        key2, value2 = key.copy(), value.copy()
        key2[~is_real] = 100.0 * rng.normal(size=key2[~is_real].shape)
        value2[~is_real] = 100.0 * rng.normal(size=value2[~is_real].shape)
        perturbed = Perturbed(inputs | {"key": key2, "value": value2}, lambda out: out,
                              "the output changed when only padded keys and values changed: padding leaks into real "
                              "outputs. Apply the mask to the scores of every head, before the softmax.")
    init = {"d_model": D, "n_heads": H} | ({"dropout": Keyword(dropout)} if dropout else {})
    return Build(situation.format(B=B, T=T, S=S, H=H, Dh=Dh, D=D), init, inputs, state=random_mha_state(rng, D),
                 seed=int(rng.integers(2**31)) if seed else None, perturbed=perturbed, grad=grad)


def _mha_rows(rng: np.random.Generator) -> list[Build]:
    T = int(rng.choice([5, 6]))
    return [
        _mha_row(rng, "self-attention, B={B}, T={T}, H={H}, Dh={Dh}, a causal + padding mask (B, 1, T, T), batch rows "
                 "of very different scale", 3, T, None, 3, 4, "causal+padding"),
        _mha_row(rng, "T={T} queries, S={S} keys, B={B}, H={H}, Dh={Dh}, a key-padding mask (B, 1, 1, S), dropout=0.5 "
                 "in eval mode", 2, 4, 7, 2, 5, "key padding", dropout=0.5),
        _mha_row(rng, "B={B}, H={H}, T={T}, S={S}, Dh={Dh}, no mask (allowed=None)", 1, 3, 5, 1, 6, None),
        _mha_row(rng, "a different mask per head, (B, H, T, S) = ({B}, {H}, {T}, {S}), Dh={Dh}", 2, 5, 3, 4, 2,
                 "per head"),
        _mha_row(rng, "fully masked query rows (B={B}, T={T}, S={S}, H={H}, Dh={Dh}), with a backward pass", 2, 4, 6, 2,
                 3, "empty rows", grad=True),
        _mha_row(rng, "causal self-attention with a (T, T) mask, B={B}, T={T}, H={H}, Dh={Dh}, the future changed",
                 2, 6, None, 2, 4, "causal", probe="future"),
        _mha_row(rng, "key padding, B={B}, T={T}, S={S}, H={H}, Dh={Dh}, the padded keys changed", 3, 3, 5, 2, 3,
                 "key padding", probe="padding"),
        _mha_row(rng, "MultiHeadAttention(D={D}, H={H}, dropout=0.5), B={B}, T={T}, S={S}", 2, 5, 6, 2, 4, None,
                 dropout=0.5, seed=True),
    ]


def mha_twin(init: dict, state: dict, inputs: dict, train: bool, p: float | None = None) -> tuple:
    """nn.MultiheadAttention with the same weights (and dropout, drawing the same masks in training mode), with the
    course's answer on a query that may attend to nothing: zero weights, so its output row is out_proj.bias."""
    H, p = init["n_heads"], init.get("dropout", 0.0) if p is None else p
    query, key, value, allowed = inputs["query"], inputs["key"], inputs["value"], inputs.get("allowed")
    (B, T, _), S = query.shape, key.shape[1]
    full = torch.ones(T, S, dtype=torch.bool) if allowed is None else allowed
    full = torch.broadcast_to(full, (B, H, T, S))  # (B, H, T, S)
    empty = ~full.any(dim=-1, keepdim=True)  # (B, H, T, 1): a query with no allowed key
    if (empty.any(dim=1) & ~empty.all(dim=1)).any():
        raise RuntimeError("a row blocks a query in some heads only: the twin cannot judge it")
    theirs = twins.torch_twin(state, "attention", H, dropout=p).train(train)
    # PyTorch's boundary: True = blocked; an empty row is opened here (its answer would be NaN) and set below
    blocked = ~(full | empty)
    out, weights = theirs(query, key, value, attn_mask=blocked.reshape(B * H, T, S), average_attn_weights=False)
    out[empty[:, 0, :, 0]] = theirs.out_proj.bias  # (B, T, D): nothing attended to, only the bias is left
    return out, weights.masked_fill(empty, 0.0)


def mha_variants(init: dict, state: dict, inputs: dict, train: bool) -> dict:
    """What PyTorch's module computes with the mask inverted or ignored, the scores over √D, no out_proj, and (in
    training mode) dropout on the output or nowhere."""
    H, D = init["n_heads"], state["q_proj.weight"].shape[0]
    unmasked = {k: v for k, v in inputs.items() if k != "allowed"}
    setups = [("the scores are divided by √D instead of √Dh (Dh = D // H, the width of one head)",
               state | {f"q_proj.{w}": state[f"q_proj.{w}"] / H ** 0.5 for w in ("weight", "bias")}, inputs),
              ("out_proj is left out: the merged heads must go through the output projection",
               state | {"out_proj.weight": torch.eye(D), "out_proj.bias": torch.zeros(D)}, inputs)]
    if "allowed" in inputs:
        setups += [("the mask is read with PyTorch's polarity (True = blocked): here True means this query may attend "
                    "to this key; invert only at PyTorch's boundary", state, inputs | {"allowed": ~inputs["allowed"]}),
                   ("the mask is never applied: the future and the padding are read", state, unmasked)]
    found = {}
    for idea, changed_state, changed_inputs in setups:
        # each from the row's seed (training mode draws); a mask that blocks a query in some heads only: not judged
        with torch.random.fork_rng(), contextlib.suppress(RuntimeError):
            found[idea] = mha_twin(init, changed_state, changed_inputs, train)
    if train:
        out, weights = mha_twin(init, state, inputs, False)  # no dropout drawn: the first draw is the output's
        dropped = F.dropout(out.contiguous(), init["dropout"])  # (B, T, D), drawn in its memory order, as a module's
        found["dropout acts on the output, not on the attention weights: apply it to the weights, before they "
              "average the values (attention(..., dropout=self.dropout))"] = (dropped, weights)
        found["the dropout never acts: pass dropout=self.dropout to attention, which applies it to the weights"] = (
            out, weights)
    return found


def _mha_shape(a: dict) -> tuple:
    (B, T, D), S = a["query"].shape, a["key"].shape[1]
    return (B, T, D), (B, a["n_heads"], T, S)


def _weights_shape_hint(a: dict, shape: tuple) -> str:
    B, T, _ = a["query"].shape
    return "Per head: do not average the weights over the heads." if shape == (B, T, a["key"].shape[1]) else ""


def mha_properties(a: dict, got: tuple, situation: str) -> None:
    """The weights: finite, none on a blocked key (every head), a query with no key all zeros, the others sum to one."""
    allowed = a.get("allowed")
    check_weights(got[1], None if allowed is None else np.broadcast_to(allowed, got[1].shape),
                  "MultiHeadAttention's weights", situation)


def mha_error(args: dict, error: str) -> str:
    if "unexpected keyword argument 'allowed'" in error:
        return "The mask argument of forward is called `allowed` (True = this query may attend to this key)."
    return ""


SPECS["MultiHeadAttention"] = ModuleSpec(
    "MultiHeadAttention", _mha_rows, mha_twin, names=MHA_NAMES, dtype=lambda a: a["query"].dtype, shape=_mha_shape,
    outputs=("out", "weights"), order=("weights", "out"), axes=("B, T, D", "B, H, T, S"),
    shape_hint=("", _weights_shape_hint), properties=mha_properties, variants=mha_variants, on_error=mha_error,
    uses=("split_heads", "merge_heads"),
    forbidden=("nn.MultiheadAttention", "F.scaled_dot_product_attention", "F.multi_head_attention_forward"),
    refused=(("d_model=10 and n_heads=3", {"d_model": 10, "n_heads": 3},
              "MultiHeadAttention(10, 3): d_model=10 cannot be cut into 3 equal heads"),),
    grad_hint="-inf in the scores (an additive -inf bias, say) gives NaN gradients on a fully masked row even when "
              "its weights are zeroed afterwards: fill blocked scores with a finite value such as "
              "torch.finfo(scores.dtype).min.",
    hint={"weights": "The weights are softmax(q·k / √Dh) per head, Dh = D // H, q from the query through q_proj and "
                     "k from the key through k_proj, split into heads before the product; in training mode dropout "
                     "acts on them. MultiHeadAttention builds on your split_heads: if its checks fail, fix it first.",
          "out": "The weights are right, so look after them: the values (the value through v_proj), merging the "
                 "heads back side by side (B, H, T, Dh) -> (B, T, D), then out_proj. MultiHeadAttention builds on your "
                 "merge_heads: if its checks fail, fix it first."})


def check_multi_head_attention(MultiHeadAttention) -> None:  # noqa: N803 - the class under test
    """Two worked examples (the mask's polarity, heads merged side by side), then the spec's rows: the contract's
    names, nn.MultiheadAttention with the same weights on every kind of mask, the future and the padding not
    leaking, finite gradients on empty rows, dropout on the weights in training mode only, MultiHeadAttention(10, 3)
    refused; last, written without PyTorch's attention (what the grader enforces), watched while it runs."""
    D, H, B, T, S = 12, 3, 2, 4, 6  # Dh = 4; T != S != H
    g = torch.Generator().manual_seed(2)
    query, memory = torch.randn(B, T, D, generator=g), torch.randn(B, S, D, generator=g)
    with check("the mask's polarity: True = this query may attend to this key"):
        mha = randomised(MultiHeadAttention(D, H), seed=3).eval()
        only_first = torch.zeros(1, 1, 1, S, dtype=torch.bool)
        only_first[..., 0] = True  # every query may attend to key 0 only
        with torch.no_grad():
            _, weights = mha(query, memory, memory, allowed=only_first)
        if torch.allclose(weights[..., 0], torch.zeros(())):
            raise CheckFailed("with only key 0 allowed, your weights avoid exactly key 0: you used PyTorch's "
                              "polarity (True = blocked). Here True means the query may attend to that key")
        expect_close(weights[..., 0], torch.ones(B, H, T), "the weight on key 0, the only allowed key",
                     hint="a query with one allowed key puts all its weight there")

    with check("heads merged side by side: uniform attention over the past gives out[b, t] = mean(value[b, :t+1])"):
        plain = MultiHeadAttention(D, H)
        # zero queries and keys: every score is 0, so each head averages the allowed values uniformly;
        # identity value and output projections: the output is that average itself, feature by feature
        load(plain, {"q_proj.weight": torch.zeros(D, D), "k_proj.weight": torch.zeros(D, D),
                     "v_proj.weight": torch.eye(D), "out_proj.weight": torch.eye(D),
                     **{f"{n}.bias": torch.zeros(D) for n in _NAMES}}, MHA_NAMES, "MultiHeadAttention")
        causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
        with torch.no_grad():
            got, _ = plain.eval()(query, query, query, allowed=causal)
        want = query.cumsum(1) / torch.arange(1, T + 1)[None, :, None]  # (B, T, D): the running mean
        if not torch.allclose(got, want, atol=1e-5):
            per_head = want.reshape(B, T, H, D // H).transpose(1, 2)  # (B, H, T, Dh): what the heads computed
            bare = torch.allclose(got, per_head.reshape(B, T, D), atol=1e-5)
            raise CheckFailed(
                "each head averaged the values it may see, but the merged output puts the wrong numbers at each "
                "position" + (": a bare reshape of (B, H, T, Dh) to (B, T, D) mixes heads and time steps" if bare
                              else "") + ". Merge the heads back side by side: move H next to Dh first, "
                "(B, H, T, Dh) -> (B, T, H, Dh) -> (B, T, D), as merge_heads does")
    run_module(SPECS["MultiHeadAttention"], MultiHeadAttention)

    def in_every_mode() -> None:
        mha = MultiHeadAttention(D, H, dropout=0.1)
        causal = torch.ones(T, S, dtype=torch.bool).tril()  # (T, S)
        with torch.no_grad():
            for training, allowed in ((True, causal), (False, causal), (False, None)):
                mha.train(training)(query, memory, memory, allowed=allowed)

    refuse_forbidden(SPECS["MultiHeadAttention"], in_every_mode)


# -- causal_self_attention: find the bug, a spec whose rows hand it a MultiHeadAttention ----------------------------
class TwinAttention(nn.Module):
    """PyTorch's ``nn.MultiheadAttention`` behind MultiHeadAttention's contract (its names, the course's mask
    polarity, zero weights on a query with no allowed key): the visible stand-in for the module a checked function
    is handed, so that only the function's own code is tested."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        for name in _NAMES:
            setattr(self, name, nn.Linear(d_model, d_model))

    def forward(self, query, key, value, allowed=None):
        inputs = {"query": query, "key": key, "value": value} | ({} if allowed is None else {"allowed": allowed})
        return mha_twin({"n_heads": self.n_heads}, self.state_dict(), inputs, self.training)


def _causal_rows(rng: np.random.Generator) -> list:
    """Right padding, left padding (as batched generation uses; the padded x changed), no padding (the future
    changed)."""
    rows = []
    for situation, B, T, H, Dh, padding in [("padding at the end of the sequences", 3, None, 2, 4, "right"),
                                            ("padding at the start of the sequences (left padding), the padded x "
                                             "changed", 3, None, 3, 2, "left"),
                                            ("is_real=None, the future changed", 2, 4, 2, 3, None)]:
        T, D = int(rng.choice([5, 6])) if T is None else T, H * Dh
        x = rng.normal(size=(B, T, D)).astype(np.float32)
        is_real = None if padding is None else _padded(rng, B, T)  # (B, T)
        if padding == "left":
            is_real = is_real[:, ::-1].copy()  # (B, T): padding, then real tokens
        args = {"mha": Built("MultiHeadAttention", {"d_model": D, "n_heads": H}, random_mha_state(rng, D)), "x": x,
                "is_real": is_real}
        changed = x + 3.0 * rng.normal(size=x.shape).astype(np.float32)
        if padding == "left":  # only the padded positions changed: no real output may move
            probe = Perturbed(args | {"x": np.where(is_real[..., None], x, changed)}, lambda out, r=is_real: out[r],
                              "a real token's output changed when only padded positions of x changed: padding leaks")
        elif padding is None:  # only the positions after t0 changed: the outputs up to t0 may not move
            t0 = int(rng.integers(1, T - 1))
            probe = Perturbed(args | {"x": np.concatenate([x[:, :t0 + 1], changed[:, t0 + 1:]], axis=1)},
                              lambda out, t0=t0: out[:, :t0 + 1], f"an output at a position <= {t0} changed when "
                              f"only positions > {t0} of x changed: the future leaks")
        rows.append((f"B={B}, T={T}, H={H}, Dh={Dh}, {situation}", args, *([] if padding == "right" else [probe])))
    return rows


def _causal_mask_properties(a: dict, got: list, situation: str) -> None:
    """The weights follow the docstring's mask: no weight on a later or padded key, a padded query still attends."""
    weights = got[1]
    B, _, T, _ = weights.shape
    real = np.ones((B, T), dtype=bool) if a["is_real"] is None else a["is_real"]
    full = np.broadcast_to(np.tril(np.ones((T, T), dtype=bool)) & real[:, None, None, :], weights.shape)
    leaked = (np.abs(weights) > 1e-6) & ~full  # (B, H, T, T)
    if leaked.any():
        b, _, t, s = (int(i) for i in np.argwhere(leaked)[0])
        why = "a padded key" if not real[b, s] else f"a later key (s = {s} > t = {t}): the future leaks"
        raise CheckFailed(f"causal_self_attention lets query {t} of sequence {b} attend to key {s}, {why} "
                          f"({situation}). Print the mask it hands mha for one padded sequence as a T × T grid (rows "
                          "are queries, columns keys) and compare it with what the docstring allows.")
    starved = full.any(axis=-1) & (np.abs(weights).sum(axis=-1) < 1e-6)  # (B, H, T)
    if starved.any():
        b, _, t = (int(i) for i in np.argwhere(starved)[0])
        raise CheckFailed(f"query {t} of sequence {b} attends to nothing, although it may attend to the real keys at "
                          f"or before it ({situation}). Padding is masked on the key axis only: a padded query still "
                          "attends, like any other.")


def _causal_shape(a: dict) -> tuple:
    B, T, D = a["x"].shape
    return (B, T, D), (B, a["mha"].init["n_heads"], T, T)


SPECS["causal_self_attention"] = Spec(
    "causal_self_attention", _causal_rows, dtype=lambda a: a["x"].dtype, shape=_causal_shape, tensors=True,
    outputs=("out", "weights"), order=("weights", "out"), axes=("B, T, D", "B, H, T, T"),
    properties=_causal_mask_properties, uses=("MultiHeadAttention", "split_heads", "merge_heads"), rtol=1e-4,
    atol=1e-5, hint={"weights": "Query t may attend to key s when s <= t and token s is real: a padded query is not "
                                "blocked itself (only the key axis is masked for padding).",
                     "out": "The weights are right: out is what mha gives with them."})


def check_causal_self_attention(causal_self_attention) -> None:
    """Find the bug: the spec's rows, on a MultiHeadAttention whose answers are PyTorch's (only the mask is
    tested): right and left padding, no padding, the padding and the future not leaking."""
    run(SPECS["causal_self_attention"], causal_self_attention, modules={"MultiHeadAttention": TwinAttention})
