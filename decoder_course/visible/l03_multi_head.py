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
from torch import nn

from decoder_course import twins
from decoder_course.checks import (
    CheckFailed,
    causal_leakage_probe,
    check,
    expect_close,
    expect_dropout,
    expect_dtype,
    expect_finite,
    expect_inputs_unchanged,
    expect_rows_sum_to_one,
    expect_shape,
    expect_type,
    expect_value_error,
    grid,
    padding_leakage_probe,
    randomised,
)
from decoder_course.spec import Spec, run

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


def _numpy_crash(args: dict, error: str) -> str:
    return BOTH_LIBRARIES if isinstance(args["x"], np.ndarray) else ""


def _heads_spec(name: str, split: bool, **more) -> Spec:
    return Spec(name, _head_rows(split), dtype=lambda a: a["x"].dtype, on_error=_numpy_crash,
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


def _call_on(fn, name: str, backend: str, *args):
    """``fn(*args)``, turning a crash on NumPy input into a message about the two libraries."""
    try:
        return expect_inputs_unchanged(fn, *args)
    except (CheckFailed, NotImplementedError):
        raise
    except Exception as exc:
        if backend != "NumPy":
            raise
        raise CheckFailed(f"{name} crashed on a NumPy array ({type(exc).__name__}: {exc}). {BOTH_LIBRARIES}") from None


def _worked_example(fn, name: str, title: str, x: np.ndarray, args: tuple, want: np.ndarray, names: str,
                    bare: str, hint: str) -> None:
    """``fn(x, *args)`` on NumPy and on torch: type, shape, dtype, the bare-reshape mistake (``bare``), values."""
    call = f"{name}({', '.join(['x', *map(str, args)])})"
    with check(f"{name} on the worked example {title}"):
        for backend, given in [("NumPy", x.copy()), ("torch", torch.from_numpy(x.copy()))]:
            got = _call_on(fn, name, backend, given, *args)
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


# -- MultiHeadAttention ------------------------------------------------------------------------------------------
_NAMES = ("q_proj", "k_proj", "v_proj", "out_proj")


def check_multi_head_attention(MultiHeadAttention) -> None:
    """Names and shapes, masks applied per head, no leakage, and agreement with nn.MultiheadAttention."""
    D, H, B, T, S = 12, 3, 2, 4, 6  # Dh = 4; T != S != H
    g = torch.Generator().manual_seed(2)
    query, memory = torch.randn(B, T, D, generator=g), torch.randn(B, S, D, generator=g)

    with check("MultiHeadAttention(12, 3) has the contract's parameters: q_proj, k_proj, v_proj, out_proj"):
        mha = MultiHeadAttention(D, H)
        expect_type(mha, nn.Module, "MultiHeadAttention(12, 3)")
        for name in _NAMES:
            proj = getattr(mha, name, None)
            if not isinstance(proj, nn.Linear) or (proj.in_features, proj.out_features) != (D, D) or proj.bias is None:
                raise CheckFailed(f"`{name}` should be an nn.Linear(d_model, d_model) with a bias")
        extra = sorted(set(mha.state_dict()) - {f"{n}.{w}" for n in _NAMES for w in ("weight", "bias")})
        if extra:
            raise CheckFailed(f"unexpected parameters or buffers {extra}: weights are loaded by the four names "
                              "only (a mask is an argument of forward, not a buffer)")

    mha = randomised(MultiHeadAttention(D, H), seed=3).eval()  # biases far from 0, so a missing one shows
    with check("forward(query, key, value) with T=4 != S=6 returns out (B, T, D) and weights (B, H, T, S)"):
        result = expect_inputs_unchanged(mha, query, memory, memory)
        expect_type(result, tuple, "forward(...)")
        if len(result) != 2:
            raise CheckFailed(f"forward should return (out, weights), got {len(result)} values")
        out, weights = result
        expect_shape(out, (B, T, D), "out", names="B, T, D")
        expect_shape(weights, (B, H, T, S), "weights", names="B, H, T, S")
        expect_dtype(out, "float", "out")
        expect_rows_sum_to_one(weights, what="the weights (no mask)")

    with check("the mask's polarity: True = this query may attend to this key"):
        only_first = torch.zeros(1, 1, 1, S, dtype=torch.bool)
        only_first[..., 0] = True  # every query may attend to key 0 only
        with torch.no_grad():
            _, weights = mha(query, memory, memory, allowed=only_first)
        if torch.allclose(weights[..., 0], torch.zeros(())):
            raise CheckFailed("with only key 0 allowed, your weights avoid exactly key 0: you used PyTorch's "
                              "polarity (True = blocked). Here True means the query may attend to that key")
        expect_close(weights[..., 0], torch.ones(B, H, T), "the weight on key 0, the only allowed key",
                     hint="a query with one allowed key puts all its weight there")

    with check("a key-padding mask (B, 1, 1, S) with an empty sequence: blocked keys get 0, empty rows give zeros"):
        allowed = torch.tensor([[True] * 4 + [False] * 2, [False] * S])[:, None, None, :]  # (B, 1, 1, S); seq 1 empty
        with torch.no_grad():
            out, weights = expect_inputs_unchanged(mha, query, memory, memory, allowed=allowed)
        expect_finite(out, "out")
        expect_rows_sum_to_one(weights, allowed)
        expect_close(out[1], mha.out_proj.bias.detach().expand(T, D), "the output rows of the empty sequence",
                     hint="a query with no allowed key attends to nothing: its attention output is zero, so "
                          "its output row is out_proj.bias")

    with check("gradients stay finite when a query row is fully masked"):
        q, m = query.clone().requires_grad_(True), memory.clone().requires_grad_(True)
        allowed = torch.ones(B, 1, T, S, dtype=torch.bool)
        allowed[0, 0, 1] = False  # query 1 of sequence 0 may attend to nothing
        mha(q, m, m, allowed=allowed)[0].sum().backward()
        expect_finite(q.grad, "the gradient of the query",
                      hint="-inf in the scores gives NaN gradients on a fully masked row, even when its weights "
                           "are zeroed afterwards: fill with a finite value such as torch.finfo(dtype).min")
        expect_finite(m.grad, "the gradient of the keys and values")

    with check("heads merged side by side: uniform attention over the past gives out[b, t] = mean(value[b, :t+1])"):
        plain = MultiHeadAttention(D, H)
        # zero queries and keys: every score is 0, so each head averages the allowed values uniformly;
        # identity value and output projections: the output is that average itself, feature by feature
        plain.load_state_dict({"q_proj.weight": torch.zeros(D, D), "k_proj.weight": torch.zeros(D, D),
                               "v_proj.weight": torch.eye(D), "out_proj.weight": torch.eye(D),
                               **{f"{n}.bias": torch.zeros(D) for n in _NAMES}})
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

    with check("dropout=0.5 acts on the attention weights, in training mode only"):
        drop = randomised(MultiHeadAttention(D, H, 0.5), seed=4)
        with torch.no_grad():
            expect_dropout(lambda: drop(query, memory, memory), drop, "MultiHeadAttention(12, 3, dropout=0.5)",
                           "to the attention weights, with an nn.Dropout(dropout) (the dropout argument was ignored)")
            _, w_e = drop(query, memory, memory)
            torch.manual_seed(0)
            _, w_t = drop.train()(query, memory, memory)
        dropped = (w_t == 0) & (w_e > 0)
        if not bool(dropped.any()):
            raise CheckFailed("in training mode the output changed but the attention weights returned are the "
                              "eval-mode ones: dropout belongs on the attention weights, before they average the "
                              "values (pass dropout=self.dropout to attention, as nn.MultiheadAttention does), not "
                              "on the output")
        kept = ~dropped & (w_e > 0)
        expect_close(w_t[kept], 2.0 * w_e[kept], "the kept attention weights in training mode", atol=1e-5,
                     hint="nn.Dropout(0.5) zeroes about half the weights and doubles the others (1 / (1 - p))")

    with check("causal self-attention: the future does not leak, in any head"):
        causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T), broadcast over B and H
        causal_leakage_probe(lambda x: mha(x, x, x, allowed=causal), query, time_axis=1, atol=1e-5,
                             what="MultiHeadAttention's output")

    with check("padded keys do not leak into the output"):
        key_is_real = torch.tensor([[True] * S, [True] * 3 + [False] * 3])
        padding_leakage_probe(lambda m: mha(query, m, m, allowed=key_is_real[:, None, None, :]), memory,
                              key_is_real, key_axis=1, atol=1e-5, what="MultiHeadAttention's output")

    with check("equals nn.MultiheadAttention with the same weights (causal + padding mask, inverted for PyTorch)"):
        x, is_real = query, torch.tensor([[True] * T, [True] * 3 + [False]])
        allowed = torch.ones(T, T, dtype=torch.bool).tril()[None, None] & is_real[:, None, None, :]  # (B,1,T,T)
        theirs = twins.torch_twin(mha.state_dict(), "attention", H)  # PyTorch's module, our weights
        with torch.no_grad():
            out, weights = mha(x, x, x, allowed=allowed)
            # PyTorch's boundary: its attn_mask says True = blocked, so our `allowed` is inverted here
            blocked = ~allowed.expand(B, H, T, T).reshape(B * H, T, T)  # (B*H, T, T)
            want, want_w = theirs(x, x, x, attn_mask=blocked, average_attn_weights=False)
        expect_rows_sum_to_one(weights, allowed)
        expect_close(weights, want_w, "the weights vs nn.MultiheadAttention's", atol=1e-5, rtol=1e-4,
                     hint="softmax(q·k / √Dh) per head, Dh = D // H, q from query and k from key")
        expect_close(out, want, "the output vs nn.MultiheadAttention's", atol=1e-5, rtol=1e-4,
                     hint="the weights agree, so check the values, merging the heads and out_proj")

    with check("MultiHeadAttention(10, 3) is refused with a ValueError"):
        expect_value_error(lambda: MultiHeadAttention(10, 3),
                           "MultiHeadAttention(10, 3): d_model=10 cannot be cut into 3 equal heads")


class _TorchAttention(nn.Module):
    """A stand-in for a MultiHeadAttention: PyTorch's own module behind the course's mask polarity (True = may
    attend), which remembers the last mask it was handed (``seen``), so a check can show it."""

    def __init__(self, D: int, H: int, seed: int):
        super().__init__()
        self.H, self.torch_mha = H, randomised(nn.MultiheadAttention(D, H, batch_first=True), seed).eval()
        w = twins.from_torch(self.torch_mha.state_dict(), "attention")  # in_proj split into q_proj, k_proj, v_proj
        self.w_v, self.b_v = w["v_proj.weight"], w["v_proj.bias"]  # the value projection, (D, D) and (D,)
        self.seen = None

    def forward(self, query, key, value, allowed=None):
        B, T, _ = query.shape
        S = key.shape[1]
        self.seen = None if allowed is None else allowed.detach().clone()
        full = torch.broadcast_to(torch.ones(T, S, dtype=torch.bool) if allowed is None else allowed,
                                  (B, self.H, T, S))  # (B, H, T, S)
        empty = ~full.any(dim=-1, keepdim=True)  # (B, H, T, 1): a query that may attend to nothing
        # PyTorch's boundary: True = blocked; an empty row is opened here and zeroed below (its answer is NaN)
        blocked = ~(full | empty)
        with torch.no_grad():
            _, weights = self.torch_mha(query, key, value, attn_mask=blocked.reshape(B * self.H, T, S),
                                        average_attn_weights=False)  # (B, H, T, S)
            weights = weights.masked_fill(empty, 0.0)
            v = (value @ self.w_v.T + self.b_v).reshape(B, S, self.H, -1).transpose(1, 2)  # (B, H, S, Dh)
            heads = (weights @ v).transpose(1, 2).reshape(B, T, -1)  # (B, T, D)
            return self.torch_mha.out_proj(heads), weights


@contextlib.contextmanager
def _adding(text: str):
    """A probe's failure, with ``text`` (more of the story) added to its message."""
    try:
        yield
    except CheckFailed as exc:
        raise CheckFailed(f"{exc}{text}") from None


def check_causal_self_attention(causal_self_attention) -> None:
    """Find the bug: the probe first (padding must not leak), then the future, then PyTorch's own answer."""
    D, H = 8, 2
    mha = _TorchAttention(D, H, seed=5)  # a stand-in whose answers are PyTorch's: only the mask is tested
    g = torch.Generator().manual_seed(4)

    with check("the probe: with left padding, changing only the pad positions of x changes no real output"):
        x = torch.randn(2, 5, D, generator=g)  # (B, T, D)
        is_real = torch.tensor([[True] * 5, [False, False, True, True, True]])  # (B, T): sequence 1 left-padded
        out, weights = expect_inputs_unchanged(causal_self_attention, mha, x, is_real)
        expect_shape(out, (2, 5, D), "out", names="B, T, D")
        expect_shape(weights, (2, H, 5, 5), "weights", names="B, H, T, T")
        shown = "" if mha.seen is None else (
            "\n    The mask it handed mha for sequence 1 (rows: queries 0-4, columns: keys 0-4, 1 = may attend):\n"
            + grid(torch.broadcast_to(mha.seen, (2, 1, 5, 5))[1, 0]))
        with _adding(shown + "\n    Which columns should be empty? Which line builds the padding part?"):
            padding_leakage_probe(lambda x: causal_self_attention(mha, x, is_real), x, is_real, atol=1e-5,
                                  what="the output")

    with check("the future does not leak: changing positions > t changes no output at positions <= t"):
        is_real = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
        with _adding(". Query t may attend to keys s <= t only: the causal part of the mask must survive "
                     "combining it with the padding (both must allow a key)"):
            causal_leakage_probe(lambda x: causal_self_attention(mha, x, is_real), torch.randn(2, 6, D, generator=g),
                                 atol=1e-5, what="the output")

    with check("equal to nn.MultiheadAttention with a causal mask and key padding (padded queries included)"):
        x = torch.randn(3, 5, D, generator=g)
        is_real = torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] * 2 + [False] * 3])  # right padding
        out, weights = causal_self_attention(mha, x, is_real)
        causal = torch.ones(5, 5, dtype=torch.bool).tril()
        with torch.no_grad():  # PyTorch's boundary: its masks say True = blocked
            want, want_w = mha.torch_mha(x, x, x, attn_mask=~causal, key_padding_mask=~is_real,
                                         average_attn_weights=False)
        expect_close(weights, want_w, "the weights",
                     hint="a padded query is not blocked itself: it attends to the real keys at or before it "
                          "(only the key axis is masked for padding)")
        expect_close(out, want, "out")
