"""Visible checks of lesson 12-modern: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention, the sliding
window and the modern block.

No reference answer is needed: the modules are specs compared with PyTorch's own functions holding the same weights
(``torch.nn.RMSNorm``, ``F.silu``, ``F.scaled_dot_product_attention(..., enable_gqa=True)``), their cached calls
with the full forward, and with public wrong twins that name the usual mistakes; RoPE with the paper's
complex-number form (``torch.view_as_complex`` times ``torch.polar``) and by its defining property (scores depend
only on the position difference); the sliding window with worked examples. The MHA-to-GQA conversion by labelled
heads read back after pooling, and by PyTorch's attention over the converted weights (so only the conversion is on
trial, not the student's forward).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from decoder_course.checks import (
    CheckFailed,
    check,
    expect_close,
    expect_dtype,
    expect_shape,
    expect_type,
    expect_value_error,
    grid,
    randomised,
)
from decoder_course.spec import Build, Cached, Keyword, ModuleSpec, Spec, run, run_module

CLOSE = {"atol": 1e-4, "rtol": 1e-4}  # float32 against a formula computed another way


# -- RMSNorm -----------------------------------------------------------------------------------------------------------
def _rms_rows(rng: np.random.Generator) -> list[Build]:
    """Rows of very different scale (where eps shows), a 4-D input, a fresh module on bfloat16."""
    x = rng.normal(size=(3, 5, 12)) * np.array([1e-3, 1.0, 50.0])[:, None, None]  # one scale per batch row
    return [
        Build("RMSNorm(D=12, eps=0.01) with a random weight, x (3, 5, 12) whose rows have scales 1e-3, 1 and 50",
              {"d": 12, "eps": 1e-2}, {"x": x.astype(np.float32)},
              state={"weight": rng.normal(1.0, 0.5, 12).astype(np.float32)}),
        Build("RMSNorm(D=6, eps=1e-6) with a random weight, x (2, 3, 4, 6)", {"d": 6, "eps": 1e-6},
              {"x": (rng.normal(size=(2, 3, 4, 6)) * 3).astype(np.float32)},
              state={"weight": rng.normal(1.0, 0.3, 6).astype(np.float32)}),
        Build("a fresh RMSNorm(8) (its weight starts at ones), x (2, 3, 8) in bfloat16", {"d": 8},
              {"x": torch.from_numpy(rng.normal(size=(2, 3, 8)).astype(np.float32)).to(torch.bfloat16)}),
    ]


def _rms_twin(init: dict, state, inputs: dict, train: bool) -> torch.Tensor:
    """torch.nn.RMSNorm with the same weight, in float32, returned in x's dtype."""
    theirs = nn.RMSNorm(init["d"], eps=init.get("eps", 1e-6))
    if state is not None:
        theirs.load_state_dict(state)
    x = inputs["x"]
    return theirs(x.float()).to(x.dtype)


def _swiglu_rows(rng: np.random.Generator) -> list[Build]:
    rows = []
    for D, F_, B, T in ((8, 12, 3, 4), (6, 10, 2, 5)):
        state = {name: rng.normal(0, 0.5, shape).astype(np.float32) for name, shape in
                 (("gate_proj.weight", (F_, D)), ("up_proj.weight", (F_, D)), ("down_proj.weight", (D, F_)))}
        rows.append(Build(f"SwiGLUFeedForward(D={D}, F={F_}) with random weights, x ({B}, {T}, {D})",
                          {"d_model": D, "d_ff": F_}, {"x": (rng.normal(size=(B, T, D)) * 2).astype(np.float32)},
                          state=state))
    return rows


def _swiglu_twin(init: dict, state: dict, inputs: dict, train: bool) -> torch.Tensor:
    """The formula with PyTorch's own F.linear and F.silu."""
    x = inputs["x"]
    gate, up = F.linear(x, state["gate_proj.weight"]), F.linear(x, state["up_proj.weight"])  # (B, T, F)
    return F.linear(F.silu(gate) * up, state["down_proj.weight"])  # (B, T, D)


SPECS = {
    "RMSNorm": ModuleSpec(
        "RMSNorm", _rms_rows, _rms_twin, names="weight (D,), no bias", dtype=lambda a: a["x"].dtype,
        shape=lambda a: a["x"].shape, forbidden=("nn.RMSNorm", "F.rms_norm", "rms_norm"),
        hint="x / sqrt(mean(x², last axis) + eps) * weight: no mean subtracted, eps inside the square root (the "
             "tiny rows show where it goes), computed in float32 and returned in x's dtype."),
    "SwiGLUFeedForward": ModuleSpec(
        "SwiGLUFeedForward", _swiglu_rows, _swiglu_twin, dtype=lambda a: a["x"].dtype, shape=lambda a: a["x"].shape,
        names="gate_proj, up_proj (D -> F) and down_proj (F -> D), nn.Linear without bias",
        hint="down_proj(silu(gate_proj(x)) * up_proj(x)): SiLU (x · sigmoid(x), F.silu) of the gate, not ReLU or a "
             "plain sigmoid, and not of the up projection; multiplied element-wise by up_proj(x)."),
}


def check_rms_norm(RMSNorm) -> None:  # noqa: N803 - the class under test
    """One parameter by its name, equal to torch.nn.RMSNorm (eps inside the root shows on tiny rows), dtype kept."""
    run_module(SPECS["RMSNorm"], RMSNorm)


# -- rotary_embedding --------------------------------------------------------------------------------------------------
def complex_rotation(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """The paper's form: pair (2i, 2i+1) as a complex number, multiplied by exp(j · position · base^(-2i/Dh))."""
    Dh = x.shape[-1]
    theta = base ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)  # (Dh/2,)
    angles = positions.double()[:, None] * theta  # (T, Dh/2)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], Dh // 2, 2).contiguous())  # (..., T, Dh/2)
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def _rope_rows(rng: np.random.Generator) -> list:
    scattered = np.sort(rng.choice(600, size=7, replace=False))
    scattered[0] = 0
    rows = [("x (B=2, H=3, T=7, Dh=10), scattered positions up to 600, base 10000",
             rng.normal(size=(2, 3, 7, 10)).astype(np.float32), scattered, None),
            ("x (B=3, H=2, T=5, Dh=6), positions starting past 0, base=500",
             rng.normal(size=(3, 2, 5, 6)).astype(np.float32), np.arange(5) + int(rng.integers(3, 20)), 500.0),
            ("x (2, 2, 4, 8) in float64, positions 0, 3, 6, 9", rng.normal(size=(2, 2, 4, 8)), np.arange(4) * 3, None)]
    return [(desc, {"x": torch.from_numpy(x), "positions": torch.from_numpy(positions.astype(np.int64)),
                    **({} if base is None else {"base": Keyword(base)})}) for desc, x, positions, base in rows]


def _expect_unrotated(got: np.ndarray, x: np.ndarray, desc: str) -> None:
    """Rows at position 0 come back as they went in; where only their order changed, the order is named (the
    angles are right there: zero), not the angle."""
    if np.allclose(got, x, atol=1e-5):
        return
    if np.allclose(np.sort(got, axis=-1), np.sort(x, axis=-1), atol=1e-5):
        raise CheckFailed(f"at position 0 (no rotation) rotary_embedding returns the right values in another order "
                          f"({desc}): each rotated pair goes back to its own place (2i, 2i+1), e.g. torch.stack([..., "
                          "...], dim=-1).flatten(-2), not the halves concatenated (torch.cat puts all the first "
                          "halves of the pairs before all the second ones)")
    raise CheckFailed(f"rotary_embedding moved a row at position 0 ({desc}): the angle is position · θ_i, zero there, "
                      "so that row comes back unchanged")


def _rope_properties(args: dict, got: np.ndarray, desc: str) -> None:
    """A rotation by position · θ: none at position 0, and each pair (2i, 2i+1) keeps its length."""
    x, positions = args["x"].astype(np.float64), args["positions"]
    got = got.astype(np.float64)
    if (positions == 0).any():
        _expect_unrotated(got[..., positions == 0, :], x[..., positions == 0, :], desc)
    def pair_lengths(a):
        return np.hypot(a[..., 0::2], a[..., 1::2])  # (..., Dh/2): |(a[2i], a[2i+1])|

    if not np.allclose(pair_lengths(got), pair_lengths(x), rtol=1e-3, atol=1e-4):
        raise CheckFailed(f"the length of a pair (x[2i], x[2i+1]) changed ({desc}): RoPE rotates neighbours (2i, "
                          "2i+1) together (not dimension i with i + Dh/2), and a rotation keeps lengths")


SPECS |= {
    "rotary_embedding": Spec(
        "rotary_embedding", _rope_rows, dtype=lambda a: a["x"].dtype, shape=lambda a: a["x"].shape, axes="B, H, T, Dh",
        properties=_rope_properties, rtol=1e-3, atol=1e-3,
        refused=(("x with Dh=5", {"x": torch.zeros(1, 2, 3, 5), "positions": torch.arange(3)},
                  "rotary_embedding was handed an odd Dh = 5, and there is no pair for the last dimension"),),
        hint="Rotate pair (x[2i], x[2i+1]) by the angle position · base^(-2i/Dh): (a, b) -> (a cos - b sin, "
             "a sin + b cos), at the positions you are given."),
}


def check_rotary_embedding(rotary_embedding) -> None:
    """The complex-number form at scattered positions, lengths kept, the relative property, dtype, odd Dh."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8)
    positions = torch.tensor([0, 2, 3, 7, 50])
    with check("position 0 leaves a vector unchanged; every rotation keeps its length"):
        out = rotary_embedding(x, positions)
        expect_type(out, torch.Tensor, "rotary_embedding(x, positions)")
        expect_shape(out, (2, 3, 5, 8), "rotary_embedding(x, positions)", names="B H T Dh")
        _expect_unrotated(out[:, :, 0].detach().double().numpy(), x[:, :, 0].double().numpy(), "x (2, 3, 5, 8)")
        expect_close(out.norm(dim=-1), x.norm(dim=-1), "the lengths after rotating", **CLOSE,
                     hint="rotate each pair (a, b) -> (a cos - b sin, a sin + b cos): a rotation keeps lengths")
    with check("equal to the complex form: pair (x[2i], x[2i+1]) times exp(j · position · base^(-2i/Dh))"):
        for base in (10000.0, 100.0):
            expect_close(rotary_embedding(x, positions, base=base).double(), complex_rotation(x, positions, base),
                         f"RoPE with base={base:g}", **CLOSE,
                         hint="neighbours are pairs, (0, 1), (2, 3), ... (not i with i + Dh/2); θ_i = base^(-2i/Dh) "
                              "with i counting pairs; rotate by the positions given, not by 0 .. T-1")
    with check("the score of q at position m and k at n depends only on m - n"):
        q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

        def score(m, n):
            return float((rotary_embedding(q, torch.tensor([m])) * rotary_embedding(k, torch.tensor([n]))).sum())

        for m, n, shift in ((5, 2, 1), (5, 2, 20), (9, 9, 1), (9, 9, 20)):
            if abs(score(m + shift, n + shift) - score(m, n)) > 1e-3:
                raise CheckFailed(f"the score of q at {m + shift} and k at {n + shift} differs from q at {m} and k "
                                  f"at {n}: rotate both by their own positions with the same frequencies")
    with check("x's dtype is kept (float64 in, float64 out); an odd Dh raises ValueError"):
        expect_dtype(rotary_embedding(x.double(), positions), torch.float64, "rotary_embedding(x in float64, ...)")
        expect_value_error(lambda: rotary_embedding(torch.randn(1, 1, 2, 5), torch.arange(2)),
                           "rotary_embedding was given Dh = 5: the last dimension has no partner")
    run(SPECS["rotary_embedding"], rotary_embedding)


# -- SwiGLUFeedForward -------------------------------------------------------------------------------------------------
def check_swiglu(SwiGLUFeedForward) -> None:  # noqa: N803 - the class under test
    """Three bias-free matrices by name, the SwiGLU formula over PyTorch's own F.linear and F.silu."""
    run_module(SPECS["SwiGLUFeedForward"], SwiGLUFeedForward)


# -- GroupedQueryAttention ---------------------------------------------------------------------------------------------
def _gqa(state: dict, H: int, Hkv: int, x, positions=None, allowed=None, *, tile: bool = False, rope_k: bool = True,
         scale: float | None = None) -> torch.Tensor:
    """PyTorch's grouped-query attention (SDPA with enable_gqa=True: query head h uses kv head h // g) over the
    weights of ``state``, RoPE in the complex form; the keywords make the known mistakes."""
    B, T, D = x.shape
    Dh = D // H
    q = F.linear(x, state["q_proj.weight"]).view(B, T, H, Dh).transpose(1, 2)  # (B, H, T, Dh)
    k = F.linear(x, state["k_proj.weight"]).view(B, T, Hkv, Dh).transpose(1, 2)  # (B, H_kv, T, Dh)
    v = F.linear(x, state["v_proj.weight"]).view(B, T, Hkv, Dh).transpose(1, 2)
    if positions is not None:
        q = complex_rotation(q, positions).to(x.dtype)
        k = complex_rotation(k, positions).to(x.dtype) if rope_k else k
    if tile:  # (B, H, T, Dh): query head h gets kv head h % H_kv (not h // g)
        k, v = k.repeat(1, H // Hkv, 1, 1), v.repeat(1, H // Hkv, 1, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=True)  # True = may attend
    return F.linear(out.nan_to_num(0.0).transpose(1, 2).reshape(B, T, D), state["out_proj.weight"])  # (B, T, D)


DECODED = ", also decoded with a KVCache (a prefill of 3 positions, a chunk of 2, then one at a time)"


def _decoded(x: np.ndarray, positions: np.ndarray, causal: np.ndarray, prefill: int = 3,
             chunk: int = 2) -> tuple[dict, ...]:
    """A row's calls with a cache: the first ``prefill`` positions at once, then a chunk of ``chunk`` positions
    (several new queries after a non-empty cache: the mask must be (T_new, S), aligned to absolute positions), then
    each later one alone."""
    cuts = [(0, prefill), (prefill, prefill + chunk),
            *((t, t + 1) for t in range(prefill + chunk, x.shape[1]))]
    return tuple({"x": x[:, a:b], "positions": positions[a:b], "allowed": causal[a:b, :b]} for a, b in cuts)


def _gqa_state(rng: np.random.Generator, D: int, H: int, Hkv: int) -> dict[str, np.ndarray]:
    Dh = D // H
    return {name: rng.normal(0, 0.4, shape).astype(np.float32) for name, shape in (
        ("q_proj.weight", (D, D)), ("k_proj.weight", (Hkv * Dh, D)), ("v_proj.weight", (Hkv * Dh, D)),
        ("out_proj.weight", (D, D)))}


def _gqa_rows(rng: np.random.Generator) -> list[Build]:
    """GQA, MQA, MHA, with RoPE from an offset or without positions, a causal or a random mask with an empty row;
    MQA also decoded with a cache."""
    rows = []
    for D, H, Hkv, B, T, rope, causal, what in (
            (24, 6, 2, 3, 7, True, False, "GQA"), (16, 4, 1, 2, 6, True, True, "MQA (n_kv_heads=1)"),
            (12, 3, 3, 2, 5, False, True, "MHA (n_kv_heads=n_heads)"), (16, 4, 2, 2, 5, False, False, "GQA")):
        state, x = _gqa_state(rng, D, H, Hkv), rng.normal(size=(B, T, D)).astype(np.float32)
        positions = (np.arange(T) + int(rng.integers(0, 40))).astype(np.int64) if rope else None
        if causal:
            allowed = np.tril(np.ones((T, T), dtype=bool))
        else:
            allowed = rng.random((B, 1, T, T)) < 0.6
            allowed[..., 0] = True
            allowed[-1, 0, 1] = False  # one fully masked query row: zeros before out_proj
        rows.append(Build(
            f"{what}: D={D}, n_heads={H}, n_kv_heads={Hkv}, B={B}, T={T}, "
            f"{f'RoPE at positions from {int(positions[0])}' if rope else 'no positions'}, "
            f"{'a causal mask' if causal else 'a random mask with a fully masked row'}"
            f"{DECODED if rope and causal else ''}",
            {"d_model": D, "n_heads": H, "n_kv_heads": Hkv}, {"x": x, "positions": positions, "allowed": allowed},
            state=state, cached=_decoded(x, positions, allowed) if rope and causal else ()))
    return rows


def _gqa_twin(init: dict, state: dict, inputs: dict, train: bool) -> torch.Tensor:
    return _gqa(state, init["n_heads"], init["n_kv_heads"], *inputs.values())


def _gqa_variants(init: dict, state: dict, inputs: dict, train: bool) -> dict[str, torch.Tensor]:
    H, Hkv, (x, positions, allowed) = init["n_heads"], init["n_kv_heads"], inputs.values()
    wrong = {"the key/value heads are tiled (repeat: query head h gets kv head h % n_kv_heads): consecutive query "
             "heads j·g .. j·g + g - 1 share kv head j, so repeat_interleave(g, dim=1)":
             _gqa(state, H, Hkv, x, positions, allowed, tile=True)}
    if positions is not None:
        wrong["only the queries are rotated: rotate the keys at their positions too, or the score depends on "
              "absolute positions"] = _gqa(state, H, Hkv, x, positions, allowed, rope_k=False)
        wrong["`positions` are ignored: rotate q and k with rotary_embedding(.., positions)"] = \
            _gqa(state, H, Hkv, x, None, allowed)
    wrong["the scores are scaled by 1/sqrt(D): the scale is 1/sqrt(Dh), the head width"] = \
        _gqa(state, H, Hkv, x, positions, allowed, scale=init["d_model"] ** -0.5)
    return wrong


def _empty_rows_zero(a: dict, got: np.ndarray, situation: str) -> None:
    """A query with no allowed key gives a zero output row (no bias after the attention), never NaN."""
    if a["allowed"] is None:
        return
    B, T = got.shape[:2]
    empty = ~np.broadcast_to(a["allowed"], (B, 1, T, a["allowed"].shape[-1])).any(-1)[:, 0]  # (B, T)
    if not np.allclose(got[empty], 0.0, atol=1e-6):
        raise CheckFailed(f"a query row with no allowed key should give zeros ({situation}): zero its weights, as "
                          "lesson 03's attention does (out_proj has no bias, so the output row is zero), never NaN")


KV_KEYS = Cached(
    "KVCache", lambda a: (a["x"].shape[0], a["n_kv_heads"], a["x"].shape[1], a["d_model"] // a["n_heads"]),
    hint="Rotate the new keys at their positions, cache.update(k, v, layer_idx) with the n_kv_heads heads, then "
         "repeat them for the groups and attend over everything cached.",
    keys_hint="Cache the n_kv_heads heads (B, n_kv_heads, S, Dh), before repeating them for the query groups: that is "
              "where the memory is saved.")
SPECS["GroupedQueryAttention"] = ModuleSpec(
    "GroupedQueryAttention", _gqa_rows, _gqa_twin, variants=_gqa_variants, properties=_empty_rows_zero,
    names="q_proj (D -> D), k_proj and v_proj (D -> n_kv_heads·Dh), out_proj (D -> D), nn.Linear without bias",
    dtype=lambda a: a["x"].dtype, shape=lambda a: a["x"].shape, axes="B, T, D", rtol=1e-4, atol=1e-4,
    uses=("rotary_embedding",), forbidden=("scaled_dot_product_attention", "enable_gqa", "nn.MultiheadAttention"),
    cache=KV_KEYS, refused=(
        ("D=16, n_heads=3", {"d_model": 16, "n_heads": 3, "n_kv_heads": 1},
         "GroupedQueryAttention(16, 3, 1): D = 16 does not divide into 3 heads"),
        ("n_heads=4, n_kv_heads=3", {"d_model": 16, "n_heads": 4, "n_kv_heads": 3},
         "GroupedQueryAttention(16, 4, 3): 4 query heads do not divide into groups for 3 key/value heads")),
    hint="Project, split into n_heads query and n_kv_heads key/value heads, rotate q and k at the positions, repeat "
         "each key/value head for its group (repeat_interleave on the head axis), attend with the mask scaled by "
         "1/sqrt(Dh), merge, out_proj.")


def check_gqa(GroupedQueryAttention, KVCache) -> None:  # noqa: N803 - the classes under test
    """The spec's rows: projection names and sizes, SDPA with enable_gqa=True (GQA, MQA, MHA; with RoPE), a fully
    masked row, the cache holding only the key/value heads, bad sizes refused."""
    run_module(SPECS["GroupedQueryAttention"], GroupedQueryAttention, given={"KVCache": KVCache})


# -- sliding_window_mask -----------------------------------------------------------------------------------------------
def _window(args: dict, got: np.ndarray, desc: str) -> None:
    T, window = args["T"], args["window"]
    t, s = np.arange(T)[:, None], np.arange(T)[None, :]  # (T, 1) queries, (1, T) keys
    if (got & (s > t)).any():
        raise CheckFailed(f"a query may see a later key ({desc}): the window must stay causal (s <= t); rows are "
                          "queries, columns keys, True = may attend")
    if (got.sum(axis=1) > np.minimum(np.arange(T) + 1, window)).any():
        raise CheckFailed(f"a query sees more than `window` keys ({desc}): query t sees keys t - window < s <= t, "
                          "itself and window - 1 earlier keys")


SLIDING_WINDOW_MASK = Spec(
    "sliding_window_mask", lambda rng: [(f"T={T}, window={w}", {"T": T, "window": w}) for T, w in (
        (int(rng.integers(7, 10)), int(rng.integers(2, 5))), (6, 1), (5, 5), (4, 9))],
    dtype=lambda a: np.bool_, shape=lambda a: (a["T"], a["T"]), axes="T, S", properties=_window, tensors=True,
    hint="Query t sees keys t - window + 1 .. t: itself and window - 1 positions back.",
    refused=(("T=5, window=0", {"T": 5, "window": 0}, "sliding_window_mask(5, 0) was asked for an empty window, and "
              "a window must hold at least the query itself"),))
SPECS["sliding_window_mask"] = SLIDING_WINDOW_MASK


def check_sliding_window_mask(sliding_window_mask) -> None:
    """A worked example, window 1 and window >= T, then the spec's rows and window 0."""
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    rows = (  # (title, T, window, the mask, what it means)
        ("T=5, window=2: each query sees itself and the one key before it", 5, 2, causal & ~causal.tril(-2),
         "rows are queries: causal, and window keys at most, the query itself included"),
        ("window=1 is the diagonal", 4, 1, torch.eye(4, dtype=torch.bool), "each query sees itself only"),
        ("window >= T is the causal mask", 4, 9, causal[:4, :4], "the plain causal mask"),
    )
    for title, T, window, want, why in rows:
        with check(title):
            got = sliding_window_mask(T, window)
            expect_type(got, torch.Tensor, f"sliding_window_mask({T}, {window})")
            expect_dtype(got, torch.bool, f"sliding_window_mask({T}, {window})")
            if not torch.equal(got, want):
                raise CheckFailed(f"sliding_window_mask({T}, {window}) is\n{grid(got)}\n    should be ({why}):\n"
                                  f"{grid(want)}")
    run(SLIDING_WINDOW_MASK, sliding_window_mask)


# -- ModernBlock -------------------------------------------------------------------------------------------------------
def _block(init: dict, state: dict, inputs: dict, *, post: bool = False, rope: bool = True,
           one_norm: bool = False, eps: float | None = None) -> torch.Tensor:
    """The pre-norm block over ``state`` with F.rms_norm, PyTorch's GQA and F.silu; the keywords make the known
    miswirings (``eps``: the norms' eps instead of the block's)."""
    x, positions, allowed = inputs.values()
    eps = init.get("eps", 1e-6) if eps is None else eps

    def sub(prefix):
        return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}

    def norm(name, h):
        return F.rms_norm(h, (h.shape[-1],), state[f"{name}.weight"], eps)

    def attn(h):
        return _gqa(sub("attn."), init["n_heads"], init["n_kv_heads"], h, positions if rope else None, allowed)

    def ffn(h):
        return _swiglu_twin({}, sub("feed_forward."), {"x": h}, False)

    if post:
        h = norm("attn_norm", x + attn(x))
        return norm("ffn_norm", h + ffn(h))
    h = x + attn(norm("attn_norm", x))  # (B, T, D)
    return h + ffn(norm("attn_norm" if one_norm else "ffn_norm", h))


def _block_rows(rng: np.random.Generator) -> list[Build]:
    """Two different norm gains far from ones; a causal GQA block also decoded with a cache (a prefill, a chunk of
    two, single positions), an MHA one unmasked; an eps large enough that a norm built without it shows."""
    rows = []
    for (D, H, Hkv, Fw), B, T, causal, eps in (((16, 4, 2, 24), 3, 6, True, 1e-5), ((8, 2, 2, 12), 2, 5, False, 0.25)):
        Dh = D // H
        shapes = {"attn_norm.weight": (D,), "ffn_norm.weight": (D,), "attn.q_proj.weight": (D, D),
                  "attn.k_proj.weight": (Hkv * Dh, D), "attn.v_proj.weight": (Hkv * Dh, D),
                  "attn.out_proj.weight": (D, D), "feed_forward.gate_proj.weight": (Fw, D),
                  "feed_forward.up_proj.weight": (Fw, D), "feed_forward.down_proj.weight": (D, Fw)}
        state = {k: rng.normal(1.0 if "norm" in k else 0.0, 0.3, s).astype(np.float32) for k, s in shapes.items()}
        x = rng.normal(size=(B, T, D)).astype(np.float32)
        positions = (np.arange(T) + int(rng.integers(1, 30))).astype(np.int64)
        allowed = np.tril(np.ones((T, T), bool)) if causal else None
        rows.append(Build(
            f"ModernBlock(D={D}, n_heads={H}, n_kv_heads={Hkv}, d_ff={Fw}, eps={eps}) with random weights, B={B}, "
            f"T={T}, positions from {int(positions[0])}, {'a causal mask' if causal else 'no mask'}"
            f"{DECODED if causal else ''}",
            {"d_model": D, "n_heads": H, "n_kv_heads": Hkv, "d_ff": Fw, "eps": Keyword(eps)},
            {"x": x, "positions": positions, "allowed": allowed}, state=state,
            cached=_decoded(x, positions, allowed) if causal else ()))
    return rows


SPECS["ModernBlock"] = ModuleSpec(
    "ModernBlock", _block_rows, lambda init, state, inputs, train: _block(init, state, inputs),
    variants=lambda init, state, inputs, train: {
        "it normalises after adding (post-norm): pre-norm normalises each sublayer's input and adds its output to the "
        "unnormalised stream": _block(init, state, inputs, post=True),
        "`positions` are not passed to the attention: without them RoPE never happens and the block cannot tell "
        "positions apart": _block(init, state, inputs, rope=False),
        "attn_norm is used before the feed-forward too: each sublayer has its own norm (ffn_norm)":
            _block(init, state, inputs, one_norm=True),
        "the norms ignore the block's eps (RMSNorm(d_model) keeps its default 1e-6): build both with "
        "RMSNorm(d_model, eps), every constructor argument is honoured": _block(init, state, inputs, eps=1e-6)},
    names="attn_norm, ffn_norm (RMSNorm), attn (GroupedQueryAttention), feed_forward (SwiGLUFeedForward)",
    dtype=lambda a: a["x"].dtype, shape=lambda a: a["x"].shape, axes="B, T, D", rtol=1e-4, atol=1e-4,
    uses=("RMSNorm", "GroupedQueryAttention", "SwiGLUFeedForward"),
    lenient=("attn_norm.", "ffn_norm.", "attn.", "feed_forward."),
    cache=Cached("KVCache", hint="Pass cache and layer_idx on to the attention."),
    hint="x + attn(attn_norm(x), positions, allowed), then + feed_forward(ffn_norm(x)): each sublayer's input "
         "normalised by its own norm, its output added to the stream. ModernBlock builds on your RMSNorm, "
         "GroupedQueryAttention and SwiGLUFeedForward: if their checks fail, fix them first.")


def check_modern_block(ModernBlock, KVCache) -> None:  # noqa: N803 - the classes under test
    """The spec's rows: submodules by name, the pre-norm wiring (PyTorch's own functions over the same weights),
    positions reaching RoPE, the cache."""
    run_module(SPECS["ModernBlock"], ModernBlock, given={"KVCache": KVCache})


# -- mha_to_gqa (find the bug) -----------------------------------------------------------------------------------------
def _labelled_mha(GroupedQueryAttention, D: int, H: int):  # noqa: N803 - the class under test
    """An MHA whose key head h is filled with the number h and value head h with 10·h: pooled heads read back."""
    mha = GroupedQueryAttention(D, H, H)
    Dh = D // H
    with torch.no_grad():
        heads = torch.arange(H, dtype=torch.float32).repeat_interleave(Dh)[:, None]  # (H·Dh, 1): row -> its head
        mha.k_proj.weight.copy_(heads.expand(H * Dh, D))
        mha.v_proj.weight.copy_(10 * heads.expand(H * Dh, D))
    return mha


def _read_heads(weight, Dh: int, scale: float = 1.0) -> list:
    """Each head's rows of a labelled projection: the one number it holds, or None when its rows differ."""
    rows = weight.detach().reshape(-1, Dh, weight.shape[-1]) / scale  # (heads, Dh, D)
    return [round(float(r[0, 0]), 3) if bool((r == r[0, 0]).all()) else None for r in rows]


def check_mha_to_gqa(mha_to_gqa, GroupedQueryAttention) -> None:  # noqa: N803 - the class under test
    """Find the bug: labelled heads read back after pooling (which heads each group averages), then the exact
    conversion of a model whose heads already agree per group, compared with PyTorch's attention over the weights
    (only the conversion is on trial), and both ends (MQA, MHA)."""
    with check("shapes: q_proj, out_proj copied; k_proj, v_proj (n_kv_heads·Dh, D); mha unchanged"):
        mha = randomised(GroupedQueryAttention(24, 6, 6), 11, scale=0.3)
        before = {name: p.detach().clone() for name, p in mha.named_parameters()}
        gqa = mha_to_gqa(mha, 6, 2)
        expect_type(gqa, GroupedQueryAttention, "mha_to_gqa(mha, 6, 2)")
        for name in ("k_proj", "v_proj"):
            expect_shape(getattr(gqa, name).weight, (8, 24), f"the converted {name}.weight", names="n_kv_heads·Dh, D")
        for name in ("q_proj", "out_proj"):
            expect_close(getattr(gqa, name).weight, getattr(mha, name).weight, f"the converted {name}.weight",
                         atol=0, rtol=0, hint="the query and output projections are copied unchanged")
        for name, p in mha.named_parameters():
            if not torch.equal(p.detach(), before[name]):
                raise CheckFailed(f"mha_to_gqa changed mha's {name}: build the new module's weights, copy from mha")
    with check("labelled heads: 4 heads in 2 groups; kv head 0 averages heads 0 and 1, kv head 1 heads 2 and 3"):
        gqa = mha_to_gqa(_labelled_mha(GroupedQueryAttention, 8, 4), 4, 2)  # key head h holds h, value head h 10·h
        keys, values = _read_heads(gqa.k_proj.weight, 2), _read_heads(gqa.v_proj.weight, 2, scale=10.0)
        if keys != [0.5, 2.5] or values != [0.5, 2.5]:
            raise CheckFailed(
                f"key head h of mha holds the number h (value head h: 10·h); after pooling, the two key heads hold "
                f"{keys} and the value heads / 10 {values} (None: a head's rows mix different heads), expected "
                "[0.5, 2.5]: the mean of heads 0 and 1, then of heads 2 and 3. Which query heads does kv head j "
                "serve in your GroupedQueryAttention, and which heads did the conversion average for it?")
    with check("a model whose heads already agree per group converts exactly (PyTorch's SDPA with enable_gqa=True)"):
        mha = randomised(GroupedQueryAttention(24, 6, 6), 12, scale=0.3)
        with torch.no_grad():
            for name in ("k_proj", "v_proj"):  # heads 0-2 share one key/value head, heads 3-5 another
                w = getattr(mha, name).weight.view(2, 3, 4, 24)  # (groups, g, Dh, D)
                w.copy_(w[:, :1].clone().expand(2, 3, 4, 24))
        gqa = mha_to_gqa(mha, 6, 2)
        torch.manual_seed(2)
        x, positions = torch.randn(3, 5, 24), torch.arange(5) + 2
        causal = torch.ones(5, 5, dtype=torch.bool).tril()
        with torch.no_grad():
            got = _gqa(gqa.state_dict(), 6, 2, x, positions, causal)
            want = _gqa(mha.state_dict(), 6, 6, x, positions, causal)
        expect_close(got, want, "the converted model's output", **CLOSE,
                     hint="nothing is lost when the heads of each group are equal: their mean is each of them. The "
                          "mean, not the sum; and of whole heads, Dh rows each, consecutive heads per group")
    with check("the ends: n_kv_heads = 1 averages every head (MQA); n_kv_heads = n_heads copies them"):
        mha = _labelled_mha(GroupedQueryAttention, 12, 6)
        for n_kv, want, why in ((1, [2.5], "the one key head should be the mean of all 6 heads (2.5 here)"),
                                (6, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "every head should be copied unchanged")):
            got = _read_heads(mha_to_gqa(mha, 6, n_kv).k_proj.weight, 2)
            if got != want:
                raise CheckFailed(f"with n_kv_heads = {n_kv} {why}: the key heads hold {got}, expected {want}")
