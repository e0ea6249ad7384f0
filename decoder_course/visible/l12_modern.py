"""Visible checks of lesson 12-modern: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention, the sliding
window and the modern block.

No reference answer is needed: ``RMSNorm`` is compared with ``torch.nn.RMSNorm`` holding the student's weight;
RoPE with the paper's complex-number form (``torch.view_as_complex`` times ``torch.polar``) and by its defining
property (scores depend only on the position difference); SwiGLU and the block with their formulas written over
the student's own weights and submodules; grouped-query attention with ``F.scaled_dot_product_attention(...,
enable_gqa=True)`` fed the student's own projections; the sliding window with worked examples. The MHA-to-GQA
conversion by labelled heads read back after pooling, and by PyTorch's attention over the converted weights (so
only the conversion is on trial, not the student's forward).
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
from decoder_course.spec import Build, Keyword, ModuleSpec, Spec, run, run_module

CLOSE = {"atol": 1e-4, "rtol": 1e-4}  # float32 against a formula computed another way


def _expect_parameters(module: nn.Module, want: dict, what: str, why: str = "") -> None:
    """``module``'s parameters are exactly ``want``, {name: shape}."""
    shapes = {name: tuple(p.shape) for name, p in module.named_parameters()}
    if shapes != want:
        raise CheckFailed(f"{what} has parameters {shapes}, should be {want}{why}")


def _prefill_then_steps(fn, x, positions, causal, cache, *rest) -> torch.Tensor:
    """``fn`` on the first 4 positions, then on each later one alone, all with ``cache``: the outputs joined."""
    T = x.shape[1]
    with torch.no_grad():
        parts = [fn(x[:, :4], positions[:4], causal[:4, :4], cache, *rest)]
        parts += [fn(x[:, t:t + 1], positions[t:t + 1], causal[t:t + 1, :t + 1], cache, *rest) for t in range(4, T)]
    return torch.cat(parts, dim=1)  # (B, T, D)


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


def _rope_properties(args: dict, got: np.ndarray, desc: str) -> None:
    """A rotation by position · θ: none at position 0, and each pair (2i, 2i+1) keeps its length."""
    x, positions = args["x"].astype(np.float64), args["positions"]
    got = got.astype(np.float64)
    if (positions == 0).any() and not np.allclose(got[..., positions == 0, :], x[..., positions == 0, :], atol=1e-5):
        raise CheckFailed(f"rotary_embedding moved a row at position 0 ({desc}): the angle is position · θ_i, zero "
                          "there")
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
        expect_close(out[:, :, 0], x[:, :, 0], "the rotation at position 0", atol=1e-6,
                     hint="the angle is position · θ_i: zero at position 0")
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
def _sdpa_twin(attn, x, positions, allowed, n_heads, n_kv_heads):
    """PyTorch's grouped-query attention over the student's own projections (RoPE in the complex form)."""
    B, T, D = x.shape
    Dh = D // n_heads
    q = attn.q_proj(x).view(B, T, n_heads, Dh).transpose(1, 2)  # (B, H, T, Dh)
    k = attn.k_proj(x).view(B, T, n_kv_heads, Dh).transpose(1, 2)  # (B, H_kv, T, Dh)
    v = attn.v_proj(x).view(B, T, n_kv_heads, Dh).transpose(1, 2)
    if positions is not None:
        q, k = complex_rotation(q, positions).float(), complex_rotation(k, positions).float()
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)  # True = may attend
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, D))  # (B, T, D)


def check_gqa(GroupedQueryAttention, KVCache) -> None:  # noqa: N803 - the classes under test
    """Projection sizes, equal to SDPA with enable_gqa=True (MHA, GQA, MQA; with RoPE), a fully masked row, the
    cache holding only the key/value heads, bad sizes."""
    with check("q_proj, out_proj (D -> D); k_proj, v_proj (D -> n_kv_heads·Dh); no bias"):
        _expect_parameters(GroupedQueryAttention(24, 6, 2),
                           {"q_proj.weight": (24, 24), "k_proj.weight": (8, 24), "v_proj.weight": (8, 24),
                            "out_proj.weight": (24, 24)},
                           "GroupedQueryAttention(24, 6, 2)", " (Dh = 4: the keys and values have 2 heads of 4)")
    torch.manual_seed(0)
    x = torch.randn(3, 6, 24)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    positions = torch.arange(6) + 3
    for H_kv, what in ((2, "GQA, 6 query heads in 2 groups"), (1, "MQA, n_kv_heads=1"), (6, "MHA, n_kv_heads=6")):
        with check(f"{what}: equal to F.scaled_dot_product_attention(..., enable_gqa=True), causal, with RoPE"):
            attn = randomised(GroupedQueryAttention(24, 6, H_kv), H_kv, scale=0.3)
            with torch.no_grad():
                plain, want_plain = attn(x, allowed=causal), _sdpa_twin(attn, x, None, causal, 6, H_kv)
                got, want = attn(x, positions, causal), _sdpa_twin(attn, x, positions, causal, 6, H_kv)
            expect_type(plain, torch.Tensor, "GroupedQueryAttention's output (one tensor)")
            expect_shape(plain, (3, 6, 24), "GroupedQueryAttention's output", names="B T D")
            expect_close(plain, want_plain, "the output without positions", **CLOSE,
                         hint="query head h uses kv head h // (n_heads // n_kv_heads): repeat_interleave the kv heads "
                              "on the head axis (not repeat); scale the scores by 1/sqrt(Dh)")
            expect_close(got, want, "the output with positions", **CLOSE,
                         hint="rotate the queries *and* the keys with rotary_embedding(..., positions), before the "
                              "scores (and before caching the keys)")
    with check("a fully masked query row gives zeros; the rest is unchanged"):
        allowed = causal.clone()
        allowed[2] = False
        with torch.no_grad():
            out = GroupedQueryAttention(24, 6, 2)(x, allowed=allowed)
        if not torch.allclose(out[:, 2], torch.zeros(24), atol=1e-6) or not torch.isfinite(out).all():
            raise CheckFailed("query row 2 has no allowed key: its output should be zeros (lesson 03's attention), "
                              "never NaN")
    with check("with a KVCache: the cache holds (B, n_kv_heads, S, Dh), and prefill + one at a time = full"):
        attn, cache = randomised(GroupedQueryAttention(24, 6, 2), 7, scale=0.3), KVCache(1)
        with torch.no_grad():
            full = attn(x, torch.arange(6), causal)
        cached = _prefill_then_steps(attn, x, torch.arange(6), causal, cache)
        shape = None if cache.keys[0] is None else tuple(cache.keys[0].shape)
        if shape != (3, 2, 6, 4):
            raise CheckFailed(f"the cache holds keys of shape {shape}, should be (B, n_kv_heads, S, Dh) = "
                              "(3, 2, 6, 4): cache.update(k, v, layer_idx) with the n_kv_heads heads, before "
                              "repeating them")
        expect_close(cached, full, "the cached outputs", **CLOSE,
                     hint="rotate the new keys at their positions, cache them, attend over everything cached")
    with check("D not divisible by n_heads, or n_heads not by n_kv_heads, raises ValueError"):
        for args, why in (((24, 5, 1), "D = 24 is not divisible by n_heads = 5"),
                          ((24, 6, 4), "n_heads = 6 is not divisible by n_kv_heads = 4")):
            expect_value_error(lambda args=args: GroupedQueryAttention(*args), f"GroupedQueryAttention{args}: {why}")


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
def check_modern_block(ModernBlock, KVCache) -> None:  # noqa: N803 - the classes under test
    """Submodules by name, the pre-norm wiring over the student's own submodules, positions reaching RoPE, the cache."""
    block = ModernBlock(16, 4, 2, 24)
    with check("submodules attn_norm, attn, ffn_norm, feed_forward"):
        for name in ("attn_norm", "attn", "ffn_norm", "feed_forward"):
            if not hasattr(block, name):
                raise CheckFailed(f"ModernBlock has no `{name}`: the names are part of the contract")
    randomised(block, 3, scale=0.3).eval()  # two different norm gains
    torch.manual_seed(1)
    x = torch.randn(2, 6, 16)
    positions, causal = torch.arange(6) + 2, torch.ones(6, 6, dtype=torch.bool).tril()
    with check("x + attn(attn_norm(x), positions, allowed), then + feed_forward(ffn_norm(.)): pre-norm"):
        with torch.no_grad():
            got = block(x, positions, causal)
            h = x + block.attn(block.attn_norm(x), positions, causal)
            want = h + block.feed_forward(block.ffn_norm(h))
        expect_type(got, torch.Tensor, "ModernBlock(...)(x, positions)")
        expect_close(got, want, "ModernBlock's output", **CLOSE, names="B T D",
                     hint="normalise each sublayer's input (attn_norm, then ffn_norm: one norm each) and add its "
                          "output to the unnormalised stream; pass positions and allowed on to the attention")
    with check("with a KVCache: prefill + one at a time = the full forward"):
        with torch.no_grad():
            full = block(x, torch.arange(6), causal)
        expect_close(_prefill_then_steps(block, x, torch.arange(6), causal, KVCache(1), 0), full,
                     "the cached outputs", **CLOSE, hint="pass cache and layer_idx on to the attention")


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
            got, want = _sdpa_twin(gqa, x, positions, causal, 6, 2), _sdpa_twin(mha, x, positions, causal, 6, 6)
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
