"""Lesson 12's reference, proven against PyTorch: RMSNorm = nn.RMSNorm, RoPE = the complex-number form
(view_as_complex × polar) and relative (the score depends only on m - n), grouped-query attention =
F.scaled_dot_product_attention(enable_gqa=True) with the same projections (MHA and MQA as its ends), the sliding
window by its definition, SwiGLU by its formula and parameter count, the block and the model's cached path."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from autograder.course.reference.decoder_layer import FeedForward
from autograder.course.reference.modern import (
    GroupedQueryAttention,
    KVCache,
    ModernBlock,
    ModernGPT,
    RMSNorm,
    SwiGLUFeedForward,
    cache_bytes_per_token,
    mha_to_gqa,
    rotary_embedding,
    sliding_window_mask,
)


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_rmsnorm_equals_torch(eps):
    torch.manual_seed(0)
    ours, theirs = RMSNorm(12, eps), nn.RMSNorm(12, eps=eps)
    with torch.no_grad():
        ours.weight.normal_(1.0, 0.5)
        theirs.weight.copy_(ours.weight)
    x = torch.randn(3, 5, 12) * torch.tensor([1e-3, 1.0, 50.0])[:, None, None]  # rows of very different scale
    torch.testing.assert_close(ours(x), theirs(x))
    assert [name for name, _ in ours.named_parameters()] == ["weight"]
    assert ours(x.to(torch.bfloat16)).dtype == torch.bfloat16


def _complex_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """The paper's form: pair (2i, 2i+1) as a complex number, times exp(j p θ_i)."""
    Dh = x.shape[-1]
    theta = base ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)  # (Dh/2,)
    angles = positions.double()[:, None] * theta  # (T, Dh/2)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], Dh // 2, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rope_equals_the_complex_form(base):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 10)
    positions = torch.tensor([0, 1, 2, 5, 9, 40, 1000])
    got = rotary_embedding(x, positions, base=base)
    torch.testing.assert_close(got.double(), _complex_rope(x, positions, base), rtol=1e-4, atol=1e-4)
    assert got.dtype == x.dtype
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1))  # rotations keep lengths


def test_rope_scores_depend_only_on_the_position_difference():
    torch.manual_seed(1)
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)

    def score(m, n):
        return (rotary_embedding(q, torch.tensor([m])) * rotary_embedding(k, torch.tensor([n]))).sum().item()

    for m, n in [(3, 1), (10, 5), (7, 7)]:
        for shift in (1, 13, 250):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-5)  # float32 angles
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)  # the difference does matter


def test_rope_odd_width_raises():
    with pytest.raises(ValueError):
        rotary_embedding(torch.randn(1, 1, 2, 5), torch.arange(2))


def _sdpa_reference(attn: GroupedQueryAttention, x, allowed, positions=None):
    B, T, D = x.shape
    H, Hkv, Dh = attn.n_heads, attn.n_kv_heads, D // attn.n_heads
    q = attn.q_proj(x).view(B, T, H, Dh).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, Hkv, Dh).transpose(1, 2)
    v = attn.v_proj(x).view(B, T, Hkv, Dh).transpose(1, 2)
    if positions is not None:
        q, k = _complex_rope(q, positions).to(x.dtype), _complex_rope(k, positions).to(x.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)  # True = may attend
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, D))


@pytest.mark.parametrize("n_kv_heads", [1, 2, 6])  # MQA, GQA, MHA
def test_gqa_equals_sdpa_with_enable_gqa(n_kv_heads):
    torch.manual_seed(0)
    attn = GroupedQueryAttention(24, 6, n_kv_heads).double()
    x = torch.randn(3, 7, 24, dtype=torch.float64)
    allowed = torch.rand(3, 1, 7, 7) < 0.6
    allowed[..., 0] = True  # no fully masked row: SDPA gives NaN there
    with torch.no_grad():
        torch.testing.assert_close(attn(x, allowed=allowed), _sdpa_reference(attn, x, allowed))
        positions = torch.arange(7) + 4
        torch.testing.assert_close(attn(x, positions, allowed), _sdpa_reference(attn, x, allowed, positions))
    assert attn.k_proj.weight.shape == (n_kv_heads * 4, 24)
    assert all(m.bias is None for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj))


def test_gqa_fully_masked_rows_give_zeros_and_bad_sizes_raise():
    torch.manual_seed(0)
    attn = GroupedQueryAttention(16, 4, 2)
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    allowed[2] = False
    with torch.no_grad():
        out = attn(torch.randn(2, 5, 16), allowed=allowed)
        seen = attn.out_proj(torch.zeros(16))
    torch.testing.assert_close(out[:, 2], seen.expand(2, 16))
    for args in [(16, 3, 1), (16, 4, 3)]:
        with pytest.raises(ValueError):
            GroupedQueryAttention(*args)


def test_gqa_cache_holds_kv_heads_and_equals_the_full_forward():
    torch.manual_seed(0)
    attn = GroupedQueryAttention(16, 4, 2).eval()
    x = torch.randn(2, 6, 16)
    positions = torch.arange(6)
    with torch.no_grad():
        full = attn(x, positions, torch.ones(6, 6, dtype=torch.bool).tril())
        cache = KVCache(1)
        parts = [attn(x[:, :3], positions[:3], torch.ones(3, 3, dtype=torch.bool).tril(), cache)]
        for t in range(3, 6):
            parts.append(attn(x[:, t:t + 1], positions[t:t + 1], torch.ones(1, t + 1, dtype=torch.bool), cache))
    torch.testing.assert_close(torch.cat(parts, 1), full)
    assert cache.keys[0].shape == (2, 2, 6, 4)


def test_sliding_window_mask_by_definition():
    for T, window in [(6, 1), (6, 3), (5, 5), (4, 10)]:
        got = sliding_window_mask(T, window)
        want = torch.tensor([[t - window < s <= t for s in range(T)] for t in range(T)])
        assert got.dtype == torch.bool and torch.equal(got, want)
    assert torch.equal(sliding_window_mask(5, 5), torch.ones(5, 5, dtype=torch.bool).tril())
    with pytest.raises(ValueError):
        sliding_window_mask(4, 0)


def test_swiglu_formula_and_parameter_count():
    torch.manual_seed(0)
    ff = SwiGLUFeedForward(8, 12)
    x = torch.randn(2, 3, 8)
    a, b = x @ ff.gate_proj.weight.T, x @ ff.up_proj.weight.T
    torch.testing.assert_close(ff(x), (a * torch.sigmoid(a) * b) @ ff.down_proj.weight.T)
    relu = FeedForward(64, 256)
    swiglu = SwiGLUFeedForward(64, round(2 * 256 / 3))
    n_relu, n_swiglu = (sum(p.numel() for p in m.parameters()) for m in (relu, swiglu))
    assert abs(n_swiglu - n_relu) / n_relu < 0.01


def test_block_is_pre_norm_and_model_cache_equals_full_forward():
    torch.manual_seed(0)
    block = ModernBlock(16, 4, 2, 24).eval()
    x = torch.randn(2, 5, 16)
    positions, allowed = torch.arange(5), torch.ones(5, 5, dtype=torch.bool).tril()
    with torch.no_grad():
        h = x + block.attn(block.attn_norm(x), positions, allowed)
        torch.testing.assert_close(block(x, positions, allowed), h + block.feed_forward(block.ffn_norm(h)))
    model = ModernGPT(40, 16, 4, 1, 24, 2, 32).eval()
    ids = torch.randint(0, 40, (2, 9))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache(2)
        parts = [model(ids[:, :4], cache)] + [model(ids[:, t:t + 1], cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(parts, 1), full)
    assert cache_bytes_per_token(cache, 2) == 2 * 2 * 1 * 4 * 4  # (k + v) · layers · H_kv · Dh · float32
    assert model.out_proj.weight is model.tok_embed.weight


@pytest.mark.parametrize("n_kv_heads", [1, 2, 3, 6])
def test_mha_to_gqa_equals_sdpa_over_the_group_means_of_the_projected_keys(n_kv_heads):
    """Against PyTorch: SDPA(enable_gqa=True), whose query head h reads kv head h // g, fed keys and values that are
    the mean of the multi-head model's *projected* keys and values over each group of consecutive heads."""
    torch.manual_seed(1)
    mha = GroupedQueryAttention(24, 6, 6)
    before = {name: p.detach().clone() for name, p in mha.named_parameters()}
    gqa = mha_to_gqa(mha, 6, n_kv_heads)
    assert all(torch.equal(p, before[name]) for name, p in mha.named_parameters()), "mha changed"
    B, T, D, g, Dh = 2, 7, 24, 6 // n_kv_heads, 4
    x = torch.randn(B, T, D)
    positions, causal = torch.arange(T) + 3, torch.ones(T, T, dtype=torch.bool).tril()
    with torch.no_grad():
        q = _complex_rope(mha.q_proj(x).view(B, T, 6, Dh).transpose(1, 2), positions).float()  # (B, H, T, Dh)
        k, v = (proj(x).view(B, T, n_kv_heads, g, Dh).mean(dim=3).transpose(1, 2)  # (B, H_kv, T, Dh)
                for proj in (mha.k_proj, mha.v_proj))
        k = _complex_rope(k, positions).float()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal, enable_gqa=True)  # True = may attend
        want = mha.out_proj(out.transpose(1, 2).reshape(B, T, D))
        torch.testing.assert_close(gqa(x, positions, causal), want)


def test_mha_to_gqa_is_exact_when_the_heads_of_each_group_agree():
    torch.manual_seed(2)
    mha = GroupedQueryAttention(24, 6, 6)
    with torch.no_grad():
        for proj in (mha.k_proj, mha.v_proj):
            w = proj.weight.view(3, 2, 4, 24)  # (groups, g, Dh, D)
            w.copy_(w[:, :1].clone().expand(3, 2, 4, 24))
    x = torch.randn(2, 5, 24)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    with torch.no_grad():
        torch.testing.assert_close(mha_to_gqa(mha, 6, 3)(x, torch.arange(5), causal), mha(x, torch.arange(5), causal))
