"""The hidden reference modules of lessons 03-05 (heads, multi-head and cross-attention, decoder layer).

They are proven against PyTorch: ``nn.MultiheadAttention`` and ``nn.TransformerDecoderLayer`` with copied
weights (every parameter, biases and LayerNorms included, re-drawn at random first so that a swapped bias
cannot hide behind a zero init). PyTorch's modules take masks with the opposite polarity (True = blocked): the
tests invert ``allowed`` at exactly that boundary. Sizes: B >= 2, H >= 2, Dh >= 2, T != S != H, D != F.
"""

import inspect
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograder.course import lessons
from autograder.course.reference import attention as np_attention
from autograder.course.reference import cross_attention, decoder_layer, masks
from autograder.course.reference.cross_attention import CrossAttention, cross_attention_mask
from autograder.course.reference.decoder_layer import (
    DecoderLayer,
    FeedForward,
    count_parameters,
    init_numpy_decoder_params,
    load_from_torch_decoder_layer,
    numpy_decoder_layer,
    numpy_params_from_torch,
)
from autograder.course.reference.multi_head import (
    MultiHeadAttention,
    attention,
    load_from_torch_mha,
    merge_heads,
    merge_heads_reshape,
    split_heads,
    split_heads_reshape,
)

B, T, S, D, H, F_ = 2, 5, 7, 24, 3, 40  # Dh = 8; every size different
SEEDS = [0, 1]


# ---------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------
def randomize_(module: nn.Module, seed: int) -> nn.Module:
    """Re-draw every parameter (weights ~ 1/sqrt(fan_in), biases and LayerNorm gains ~ N(0, 0.5))."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            p.copy_(noise / math.sqrt(p.shape[-1]) if p.dim() == 2 else 0.5 * noise)
    return module


def torch_mha(seed: int, d=D, h=H) -> nn.MultiheadAttention:
    return randomize_(nn.MultiheadAttention(d, h, batch_first=True), seed).double().eval()


def ours_from(theirs: nn.MultiheadAttention, cls=MultiHeadAttention, d=D, h=H):
    return load_from_torch_mha(cls(d, h).double(), theirs).eval()


def torch_decoder_layer(seed: int, norm_first: bool, d=D, h=H, f=F_) -> nn.TransformerDecoderLayer:
    layer = nn.TransformerDecoderLayer(d, h, f, dropout=0.1, batch_first=True, norm_first=norm_first)
    return randomize_(layer, seed).double().eval()


def ours_decoder_from(theirs: nn.TransformerDecoderLayer, norm_first: bool, d=D, h=H, f=F_) -> DecoderLayer:
    ours = DecoderLayer(d, h, f, dropout=0.1, norm_first=norm_first).double()
    return load_from_torch_decoder_layer(ours, theirs).eval()


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def decoder_masks():
    """Causal self mask with target padding, memory padding: no query row is fully masked."""
    tgt_is_real = torch.tensor([[True] * T, [True] * 3 + [False] * (T - 3)])
    mem_is_real = torch.tensor([[True] * S, [True] * 4 + [False] * (S - 4)])
    causal = torch.from_numpy(masks.causal_mask(T))
    self_allowed = torch.from_numpy(masks.combine_masks(causal.numpy(), tgt_is_real.numpy()))  # (B, 1, T, T)
    cross_allowed = cross_attention_mask(mem_is_real, T)  # (B, 1, T, S)
    return causal, tgt_is_real, mem_is_real, self_allowed, cross_allowed


TOL64 = dict(rtol=1e-9, atol=1e-10)


def test_contract_names():
    assert set(lessons.exercises("03-multi-head")) == {
        "split_heads",
        "merge_heads",
        "split_heads_reshape",
        "merge_heads_reshape",
        "MultiHeadAttention",
        "causal_self_attention",
    }
    assert set(lessons.given("03-multi-head")) == {"attention", "load_from_torch_mha"}
    assert set(lessons.exercises("04-cross-attention")) == {
        "cross_attention_mask", "CrossAttention", "CachedCrossAttention"}
    assert set(lessons.exercises("05-decoder-layer")) == {
        "FeedForward",
        "DecoderLayer",
        "init_numpy_decoder_params",
        "numpy_decoder_layer",
        "run_with_torch_masks",
    }


# ---------------------------------------------------------------------------------------------------------
# 03 split / merge heads
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_split_merge_heads_equal_torch_view_transpose(backend):
    x_t = randn(B, T, D, seed=1)
    reference = x_t.view(B, T, H, D // H).transpose(1, 2)  # (B, H, T, Dh), PyTorch's own ops
    x = x_t.numpy().copy() if backend == "numpy" else x_t.clone()
    for split, merge in [(split_heads, merge_heads), (split_heads_reshape, merge_heads_reshape)]:
        heads = split(x, H)
        assert isinstance(heads, type(x)) and tuple(heads.shape) == (B, H, T, D // H)
        assert torch.equal(torch.as_tensor(np.asarray(heads)), reference), split.__name__
        # head h holds features h*Dh ... (h+1)*Dh - 1
        assert torch.equal(torch.as_tensor(np.asarray(heads[:, 1])), x_t[:, :, 8:16])
        back = merge(heads)
        assert tuple(back.shape) == (B, T, D)
        assert torch.equal(torch.as_tensor(np.asarray(back)), x_t), (
            f"{merge.__name__} does not undo the split"
        )
        merged_ref = reference.transpose(1, 2).reshape(B, T, D)
        assert torch.equal(
            torch.as_tensor(np.asarray(merge(reference.numpy() if backend == "numpy" else reference))),
            merged_ref,
        )
    assert torch.equal(torch.as_tensor(np.asarray(x)), x_t), "the input was modified"


def test_einops_and_reshape_versions_agree_on_random_shapes():
    for seed, (b, t, h, dh) in enumerate([(3, 4, 2, 5), (2, 7, 4, 3), (1, 2, 6, 2)]):
        x = randn(b, t, h * dh, seed=seed)
        assert torch.equal(split_heads(x, h), split_heads_reshape(x, h))
        y = randn(b, h, t, dh, seed=seed + 10)
        assert torch.equal(merge_heads(y), merge_heads_reshape(y))


def test_split_heads_sources():
    assert "rearrange(" in inspect.getsource(split_heads)
    assert "rearrange(" in inspect.getsource(merge_heads)
    assert "rearrange" not in inspect.getsource(split_heads_reshape)
    assert "rearrange" not in inspect.getsource(merge_heads_reshape)
    with pytest.raises(ValueError):
        split_heads_reshape(np.zeros((B, T, 10)), 3)


# ---------------------------------------------------------------------------------------------------------
# 03 torch attention (given)
# ---------------------------------------------------------------------------------------------------------
def test_torch_attention_equals_sdpa_and_zeroes_fully_masked_rows():
    q, k, v = randn(B, H, T, 4, seed=1), randn(B, H, S, 4, seed=2), randn(B, H, S, 6, seed=3)
    allowed = torch.rand(B, H, T, S, generator=torch.Generator().manual_seed(4)) < 0.5
    allowed[0, 1, 2] = False
    allowed[1, :, 4] = False
    has_key = allowed.any(-1)
    q.requires_grad_(True)
    k.requires_grad_(True)
    v.requires_grad_(True)
    out, weights = attention(q, k, v, allowed)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    torch.testing.assert_close(out[has_key], want[has_key], **TOL64)
    assert (out[~has_key] == 0).all() and (weights[~has_key] == 0).all()
    assert (weights[~allowed] == 0).all()
    ref_weights = torch.softmax((q @ k.transpose(-2, -1) / 2.0).masked_fill(~allowed, -math.inf), -1)
    torch.testing.assert_close(weights[has_key], ref_weights[has_key], **TOL64)
    # anomaly mode fails on a NaN anywhere in the backward pass, even one masked out later (a -inf fill)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Anomaly Detection has been enabled"
        with torch.autograd.detect_anomaly():
            (out.sum() + weights.sum()).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all(), "a fully masked row must not give NaN gradients"


def test_torch_attention_half_precision_fully_masked_row():
    q, k, v = (randn(1, 2, 3, 4, seed=s).half() for s in range(3))
    allowed = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
    out, weights = attention(q, k, v, allowed)
    assert torch.isfinite(out).all() and (out[:, :, 1] == 0).all()


# ---------------------------------------------------------------------------------------------------------
# 03 MultiHeadAttention vs nn.MultiheadAttention
# ---------------------------------------------------------------------------------------------------------
def test_mha_structure():
    mha = MultiHeadAttention(D, H, dropout=0.2)
    assert mha.n_heads == H and mha.d_head == D // H
    for name in ["q_proj", "k_proj", "v_proj", "out_proj"]:
        proj = getattr(mha, name)
        assert isinstance(proj, nn.Linear) and proj.in_features == D and proj.out_features == D
        assert proj.bias is not None
    assert set(mha.state_dict()) == {f"{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")} | {
        "out_proj.weight",
        "out_proj.bias",
    }
    with pytest.raises(ValueError):
        MultiHeadAttention(10, 3)


def _compare_mha(ours, theirs, query, key, value, allowed, attn_mask=None, key_padding_mask=None):
    out, weights = ours(query, key, value, allowed=allowed)
    t, s = query.shape[1], key.shape[1]
    assert out.shape == (B, t, D) and weights.shape == (B, H, t, s)
    # PyTorch's boundary: its masks say True = blocked, hence the inverted masks built by the callers
    want, want_w = theirs(
        query,
        key,
        value,
        attn_mask=attn_mask,
        key_padding_mask=key_padding_mask,
        need_weights=True,
        average_attn_weights=False,
    )
    torch.testing.assert_close(out, want, **TOL64)
    torch.testing.assert_close(weights, want_w, **TOL64)
    _, want_avg = theirs(query, key, value, attn_mask=attn_mask, key_padding_mask=key_padding_mask)
    torch.testing.assert_close(weights.mean(dim=1), want_avg, **TOL64)
    return out, weights


@pytest.mark.parametrize("seed", SEEDS)
def test_mha_causal_self_attention_equals_torch(seed):
    theirs = torch_mha(seed)
    ours = ours_from(theirs)
    x = randn(B, T, D, seed=seed + 100)
    allowed = torch.from_numpy(masks.causal_mask(T))
    _compare_mha(ours, theirs, x, x, x, allowed, attn_mask=~allowed)  # invert: PyTorch's True = blocked


@pytest.mark.parametrize("seed", SEEDS)
def test_mha_key_padding_and_t_ne_s_equals_torch(seed):
    theirs = torch_mha(seed)
    ours = ours_from(theirs)
    query, key, value = randn(B, T, D, seed=1), randn(B, S, D, seed=2), randn(B, S, D, seed=3)
    key_is_real = torch.tensor([[True] * S, [True] * 4 + [False] * (S - 4)])
    allowed = key_is_real[:, None, None, :]  # (B, 1, 1, S)
    _compare_mha(ours, theirs, query, key, value, allowed, key_padding_mask=~key_is_real)


def test_mha_causal_plus_padding_equals_torch():
    theirs = torch_mha(3)
    ours = ours_from(theirs)
    x = randn(B, T, D, seed=4)
    causal, tgt_is_real, _, self_allowed, _ = decoder_masks()
    _compare_mha(ours, theirs, x, x, x, self_allowed, attn_mask=~causal, key_padding_mask=~tgt_is_real)


def test_mha_without_mask_equals_torch():
    theirs = torch_mha(4)
    ours = ours_from(theirs)
    query, memory = randn(B, T, D, seed=5), randn(B, S, D, seed=6)
    _compare_mha(ours, theirs, query, memory, memory, None)


def test_mha_fully_masked_rows_give_bias_and_finite_gradients():
    theirs = torch_mha(5)
    ours = ours_from(theirs)
    query, memory = randn(B, T, D, seed=7), randn(B, S, D, seed=8)
    query.requires_grad_(True)
    memory.requires_grad_(True)
    allowed = torch.ones(B, 1, T, S, dtype=torch.bool)
    allowed[1, 0, 2] = False  # one query of sequence 1 sees nothing
    allowed[0, 0, :, 5:] = False
    out, weights = ours(query, memory, memory, allowed)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert (weights[1, :, 2] == 0).all()
    torch.testing.assert_close(out[1, 2], ours.out_proj.bias.detach(), rtol=0, atol=0)
    # the other rows still equal PyTorch's
    want, _ = theirs(query, memory, memory, attn_mask=~allowed.expand(B, H, T, S).reshape(B * H, T, S))
    rows = torch.ones(B, T, dtype=torch.bool)
    rows[1, 2] = False
    torch.testing.assert_close(out[rows], want[rows], **TOL64)
    out.sum().backward()
    assert torch.isfinite(query.grad).all() and torch.isfinite(memory.grad).all()
    for p in ours.parameters():
        assert torch.isfinite(p.grad).all()


def test_mha_causal_leakage():
    ours = ours_from(torch_mha(6))
    x = randn(B, T, D, seed=9)
    allowed = torch.from_numpy(masks.causal_mask(T))
    out, _ = ours(x, x, x, allowed)
    for t in range(T - 1):
        x2 = x.clone()
        x2[:, t + 1 :] += 5 * randn(B, T - t - 1, D, seed=t)
        out2, _ = ours(x2, x2, x2, allowed)
        torch.testing.assert_close(out2[:, : t + 1], out[:, : t + 1], rtol=0, atol=1e-12)
        assert not torch.allclose(out2[:, t + 1 :], out[:, t + 1 :])


def test_mha_dropout_train_vs_eval_and_inputs_unchanged():
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H, dropout=0.5).double()
    query, memory = randn(B, T, D, seed=10), randn(B, S, D, seed=11)
    before = (query.clone(), memory.clone())
    mha.eval()
    a, wa = mha(query, memory, memory)
    b, _ = mha(query, memory, memory)
    assert torch.equal(a, b), "eval mode must be deterministic"
    torch.testing.assert_close(wa.sum(-1), torch.ones(B, H, T, dtype=torch.float64))
    mha.train()
    c, wc = mha(query, memory, memory)
    assert not torch.allclose(c, a), "dropout on the attention weights is not applied in train mode"
    assert (wc == 0).any(), "the returned weights are the dropped ones, as in nn.MultiheadAttention"
    assert torch.equal(query, before[0]) and torch.equal(memory, before[1])


def test_load_from_torch_mha_rejects_mismatch():
    with pytest.raises(ValueError):
        load_from_torch_mha(MultiHeadAttention(D, H), nn.MultiheadAttention(D, 4))
    with pytest.raises(ValueError):
        load_from_torch_mha(MultiHeadAttention(D, H), nn.MultiheadAttention(D, H, kdim=5, vdim=5))


# ---------------------------------------------------------------------------------------------------------
# 04 cross-attention
# ---------------------------------------------------------------------------------------------------------
def test_cross_attention_mask_values_and_types():
    mem_is_real = torch.tensor([[True, True, False, True, False, True, True], [True] * 3 + [False] * 4])
    before = mem_is_real.clone()
    got = cross_attention_mask(mem_is_real, T)
    assert got.dtype == torch.bool and got.shape == (B, 1, T, S)
    for b in range(B):
        for t in range(T):
            assert torch.equal(got[b, 0, t], mem_is_real[b])
    got[0, 0, 0, 0] = False  # a fresh tensor: writing to it leaves the caller's mask alone
    assert torch.equal(mem_is_real, before)
    from_numpy = cross_attention_mask(before.numpy(), T)
    assert torch.equal(from_numpy, cross_attention_mask(before, T))


@pytest.mark.parametrize("seed", SEEDS)
def test_cross_attention_equals_torch_mha(seed):
    theirs = torch_mha(seed + 20)
    ours = ours_from(theirs, cls=CrossAttention)
    assert isinstance(ours, MultiHeadAttention)
    query, memory = randn(B, T, D, seed=seed), randn(B, S, D, seed=seed + 1)
    _, _, mem_is_real, _, cross_allowed = decoder_masks()
    out, weights = ours(query, memory, allowed=cross_allowed)
    want, want_w = theirs(
        query, memory, memory, key_padding_mask=~mem_is_real, average_attn_weights=False
    )  # PyTorch: True = padding
    assert out.shape == (B, T, D) and weights.shape == (B, H, T, S)
    torch.testing.assert_close(out, want, **TOL64)
    torch.testing.assert_close(weights, want_w, **TOL64)


def test_project_memory_shapes_and_reuse():
    ours = ours_from(torch_mha(30), cls=CrossAttention)
    query, memory = randn(B, T, D, seed=12), randn(B, S, D, seed=13)
    k, v = ours.project_memory(memory)
    assert k.shape == (B, H, S, D // H) and v.shape == (B, H, S, D // H)
    # head split of PyTorch's own linear maps
    torch.testing.assert_close(
        k, F.linear(memory, ours.k_proj.weight, ours.k_proj.bias).view(B, S, H, -1).transpose(1, 2)
    )
    torch.testing.assert_close(
        v, F.linear(memory, ours.v_proj.weight, ours.v_proj.bias).view(B, S, H, -1).transpose(1, 2)
    )
    _, _, _, _, cross_allowed = decoder_masks()
    direct = ours(query, memory, allowed=cross_allowed)
    calls = {"q_proj": 0, "k_proj": 0, "v_proj": 0}
    hooks = [
        getattr(ours, name).register_forward_hook(lambda *_, n=name: calls.__setitem__(n, calls[n] + 1))
        for name in calls
    ]
    reused = ours(query, allowed=cross_allowed, memory_kv=(k, v))
    assert calls == {"q_proj": 1, "k_proj": 0, "v_proj": 0}, "memory_kv given: memory must not be projected"
    ours(query, memory, allowed=cross_allowed)
    assert calls == {"q_proj": 2, "k_proj": 1, "v_proj": 1}
    for h in hooks:
        h.remove()
    assert torch.equal(reused[0], direct[0]) and torch.equal(reused[1], direct[1])
    # each decoding step (one query at a time) with the cached memory equals the full pass's row
    for t in range(T):
        step, _ = ours(query[:, t : t + 1], memory_kv=(k, v), allowed=cross_allowed[:, :, t : t + 1])
        torch.testing.assert_close(step[:, 0], direct[0][:, t], **TOL64)


def test_cross_attention_dropout_on_weights():
    torch.manual_seed(0)
    ours = CrossAttention(D, H, dropout=0.5).double()
    calls = []
    ours.dropout.register_forward_hook(lambda *_: calls.append(1))
    query, memory = randn(B, T, D, seed=17), randn(B, S, D, seed=18)
    ours.eval()
    a, _ = ours(query, memory)
    assert torch.equal(a, ours(query, memory)[0]) and len(calls) == 2
    ours.train()
    b, weights = ours(query, memory)
    assert not torch.allclose(a, b) and (weights == 0).any(), "dropout on the attention weights is missing"


def test_cross_attention_needs_exactly_one_memory():
    ours = CrossAttention(D, H)
    query, memory = torch.randn(B, T, D), torch.randn(B, S, D)
    with pytest.raises(ValueError):
        ours(query)
    with pytest.raises(ValueError):
        ours(query, memory, memory_kv=ours.project_memory(memory))


def test_cross_attention_padding_leakage():
    ours = ours_from(torch_mha(31), cls=CrossAttention)
    query, memory = randn(B, T, D, seed=14), randn(B, S, D, seed=15)
    _, _, mem_is_real, _, cross_allowed = decoder_masks()
    out, _ = ours(query, memory, allowed=cross_allowed)
    memory2 = memory.clone()
    memory2[~mem_is_real] = 100 * randn(int((~mem_is_real).sum()), D, seed=16)
    out2, _ = ours(query, memory2, allowed=cross_allowed)
    torch.testing.assert_close(out2, out, rtol=0, atol=1e-12)


def test_cached_cross_attention_equals_torch_and_projects_each_memory_once():
    """Every call = nn.MultiheadAttention on that call's memory; k_proj runs once per new memory, not per step."""
    theirs = torch_mha(32)
    cached = cross_attention.CachedCrossAttention(ours_from(theirs, cls=CrossAttention))
    calls = []
    cached.xattn.k_proj.register_forward_hook(lambda *_: calls.append(1))
    batches = [(randn(B, S, D, seed=40), torch.tensor([[True] * S, [True] * 4 + [False] * (S - 4)])),
               (randn(B, S, D, seed=41), torch.tensor([[True] * 2 + [False] * (S - 2), [True] * S]))]
    # two steps on batch 0, two on batch 1 (same shapes), then batch 0 again: three memories to project
    for step, which in enumerate([0, 0, 1, 1, 0]):
        memory, mem_is_real = batches[which]
        query = randn(B, 1, D, seed=50 + step)  # (B, 1, D): one decoding step
        before = [t.clone() for t in (query, memory, mem_is_real)]
        out, weights = cached(query, memory, mem_is_real)
        want, want_w = theirs(query, memory, memory, key_padding_mask=~mem_is_real, average_attn_weights=False)
        torch.testing.assert_close(out, want, **TOL64)
        torch.testing.assert_close(weights, want_w, **TOL64)
        assert all(torch.equal(a, b) for a, b in zip(before, (query, memory, mem_is_real), strict=True))
    assert len(calls) == 3, "the memory is projected once per new memory, and reused at the later steps"


# ---------------------------------------------------------------------------------------------------------
# 05 feed-forward and decoder layer vs nn.TransformerDecoderLayer
# ---------------------------------------------------------------------------------------------------------
def test_feed_forward_structure_and_values():
    ff = randomize_(FeedForward(D, F_, dropout=0.3), 40).double()
    assert isinstance(ff.linear1, nn.Linear) and (ff.linear1.in_features, ff.linear1.out_features) == (D, F_)
    assert isinstance(ff.linear2, nn.Linear) and (ff.linear2.in_features, ff.linear2.out_features) == (F_, D)
    x = randn(B, T, D, seed=17)
    ff.eval()
    want = F.linear(
        F.relu(F.linear(x, ff.linear1.weight, ff.linear1.bias)), ff.linear2.weight, ff.linear2.bias
    )
    torch.testing.assert_close(ff(x), want, **TOL64)
    ff.train()
    assert not torch.allclose(ff(x), want), "dropout between the two linears is missing"


def test_decoder_layer_structure():
    layer = DecoderLayer(D, H, F_, dropout=0.25, norm_first=True)
    assert layer.norm_first is True
    assert type(layer.self_attn) is MultiHeadAttention and isinstance(layer.cross_attn, CrossAttention)
    assert isinstance(layer.feed_forward, FeedForward)
    for i in (1, 2, 3):
        norm, drop = getattr(layer, f"norm{i}"), getattr(layer, f"dropout{i}")
        assert isinstance(norm, nn.LayerNorm) and norm.normalized_shape == (D,)
        assert isinstance(drop, nn.Dropout) and drop.p == 0.25
    assert layer.self_attn.dropout.p == 0.25 and layer.feed_forward.dropout.p == 0.25
    for helper in ("_sa_block", "_ca_block", "_ff_block"):
        assert callable(getattr(layer, helper))
    assert DecoderLayer(D, H, F_).norm_first is False and DecoderLayer(D, H, F_).dropout1.p == 0.1


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("seed", SEEDS)
def test_decoder_layer_equals_torch(norm_first, seed):
    theirs = torch_decoder_layer(seed, norm_first)
    ours = ours_decoder_from(theirs, norm_first)
    x, memory = randn(B, T, D, seed=seed + 1), randn(B, S, D, seed=seed + 2)
    causal, tgt_is_real, mem_is_real, self_allowed, cross_allowed = decoder_masks()
    got = ours(x, memory, self_allowed=self_allowed, cross_allowed=cross_allowed)
    # PyTorch's polarity at its boundary: True = blocked / padding
    want = theirs(
        x, memory, tgt_mask=~causal, tgt_key_padding_mask=~tgt_is_real, memory_key_padding_mask=~mem_is_real
    )
    assert got.shape == (B, T, D)
    torch.testing.assert_close(got, want, **TOL64)
    torch.testing.assert_close(ours(x, memory), theirs(x, memory), **TOL64)  # no masks at all


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_run_with_torch_masks_equals_torch_for_every_mix_of_masks(norm_first):
    """PyTorch's own mask arguments, each present or absent (a causal and a banded tgt_mask), through our layer."""
    theirs = torch_decoder_layer(60, norm_first)
    ours = ours_decoder_from(theirs, norm_first)
    x, memory = randn(B, T, D, seed=61), randn(B, S, D, seed=62)
    causal, tgt_is_real, mem_is_real, _, _ = decoder_masks()
    index = torch.arange(T)
    band = (index[:, None] - index[None, :]).abs() > 1  # (T, T) blocked: keys more than one position away
    for tgt_mask in (None, ~causal, band):
        for tgt_pad in (None, ~tgt_is_real):
            for mem_pad in (None, ~mem_is_real):
                args = (x, memory, tgt_mask, tgt_pad, mem_pad)
                before = [a.clone() for a in args if a is not None]
                got = decoder_layer.run_with_torch_masks(ours, *args)
                want = theirs(x, memory, tgt_mask=tgt_mask, tgt_key_padding_mask=tgt_pad,
                              memory_key_padding_mask=mem_pad)
                torch.testing.assert_close(got, want, **TOL64)
                assert all(torch.equal(a, b) for a, b in zip(before, [a for a in args if a is not None]))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_decoder_layer_equals_torch_at_spec_size(norm_first):
    """The SPEC's block: d_model 512, 8 heads, d_ff 2048; batch 2, source 7 with [5, 6] real, target 5."""
    d, h, f = 512, 8, 2048
    theirs = torch_decoder_layer(50, norm_first, d, h, f)
    ours = ours_decoder_from(theirs, norm_first, d, h, f)
    x, memory = randn(2, 5, d, seed=51), randn(2, 7, d, seed=52)
    mem_is_real = torch.arange(7)[None, :] < torch.tensor([[5], [6]])
    tgt_is_real = torch.arange(5)[None, :] < torch.tensor([[3], [4]])
    causal = torch.from_numpy(masks.causal_mask(5))
    self_allowed = causal & tgt_is_real[:, None, None, :]
    got = ours(x, memory, self_allowed, cross_attention_mask(mem_is_real, 5))
    want = theirs(
        x, memory, tgt_mask=~causal, tgt_key_padding_mask=~tgt_is_real, memory_key_padding_mask=~mem_is_real
    )
    assert got.shape == (2, 5, 512)
    torch.testing.assert_close(got, want, **TOL64)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_decoder_layer_leakage_determinism_and_inputs(norm_first):
    ours = ours_decoder_from(torch_decoder_layer(60, norm_first), norm_first)
    x, memory = randn(B, T, D, seed=61), randn(B, S, D, seed=62)
    _, _, mem_is_real, _, cross_allowed = decoder_masks()
    causal = torch.from_numpy(masks.causal_mask(T))
    before = (x.clone(), memory.clone(), cross_allowed.clone())
    out = ours(x, memory, causal, cross_allowed)
    assert torch.equal(out, ours(x, memory, causal, cross_allowed)), "eval mode must be deterministic"
    for t in range(T - 1):  # causal leakage
        x2 = x.clone()
        x2[:, t + 1 :] += 3 * randn(B, T - t - 1, D, seed=70 + t)
        out2 = ours(x2, memory, causal, cross_allowed)
        torch.testing.assert_close(out2[:, : t + 1], out[:, : t + 1], rtol=0, atol=1e-12)
        assert not torch.allclose(out2[:, t + 1 :], out[:, t + 1 :])
    memory2 = memory.clone()  # padding leakage
    memory2[~mem_is_real] = 50 * randn(int((~mem_is_real).sum()), D, seed=80)
    torch.testing.assert_close(ours(x, memory2, causal, cross_allowed), out, rtol=0, atol=1e-12)
    assert (
        torch.equal(x, before[0]) and torch.equal(memory, before[1]) and torch.equal(cross_allowed, before[2])
    )
    ours.train()
    assert not torch.allclose(ours(x, memory, causal, cross_allowed), out), "dropout is not applied in train"


def test_decoder_layer_dropouts_sit_on_each_sublayer_output():
    """dropout1..3 each run once, in order, on the output of self-attention, cross-attention, feed-forward."""
    layer = DecoderLayer(D, H, F_).double().eval()
    seen = {}

    def record(name):
        def hook(module, inputs, output):
            seen.setdefault(name, []).append((inputs[0], output[0] if isinstance(output, tuple) else output))

        return hook

    for name in ["self_attn", "cross_attn", "feed_forward", "dropout1", "dropout2", "dropout3"]:
        getattr(layer, name).register_forward_hook(record(name))
    for sub in ["self_attn", "cross_attn"]:  # attention dropout, inside each attention module
        getattr(layer, sub).dropout.register_forward_hook(record(f"{sub}.dropout"))
    layer.feed_forward.dropout.register_forward_hook(record("feed_forward.dropout"))
    layer(randn(B, T, D, seed=92), randn(B, S, D, seed=93))
    assert all(len(calls) == 1 for calls in seen.values()) and len(seen) == 9, {
        k: len(v) for k, v in seen.items()
    }
    for i, sub in [(1, "self_attn"), (2, "cross_attn"), (3, "feed_forward")]:
        assert seen[f"dropout{i}"][0][0] is seen[sub][0][1], f"dropout{i} must act on {sub}'s output"


def test_decoder_layer_fully_padded_memory_gives_finite_values_and_gradients():
    ours = DecoderLayer(D, H, F_, dropout=0.0).double()
    x, memory = randn(B, T, D, seed=90).requires_grad_(True), randn(B, S, D, seed=91)
    mem_is_real = torch.tensor([[True] * S, [False] * S])  # sequence 1 has no memory at all
    out = ours(x, memory, torch.from_numpy(masks.causal_mask(T)), cross_attention_mask(mem_is_real, T))
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in ours.parameters())


def test_injected_sublayers_spec_example():
    """SPEC: a post-LN layer from injected sublayers; x (2, 4, 512), memory (2, 6, 512), 8 heads, F 2048."""
    torch.manual_seed(0)
    d, h, f = 512, 8, 2048
    sa, ca, ff = MultiHeadAttention(d, h), CrossAttention(d, h), FeedForward(d, f)
    layer = DecoderLayer(d, h, f, dropout=0.1, norm_first=False, self_attn=sa, cross_attn=ca, feed_forward=ff)
    assert layer.self_attn is sa and layer.cross_attn is ca and layer.feed_forward is ff
    calls = []
    for name, module in [("self_attn", sa), ("cross_attn", ca), ("feed_forward", ff)]:
        module.register_forward_hook(lambda *_, n=name: calls.append(n))
    layer.eval()
    x, memory = torch.randn(2, 4, d), torch.randn(2, 6, d)
    out = layer(x, memory, torch.from_numpy(masks.causal_mask(4)))
    assert out.shape == (2, 4, 512) and torch.isfinite(out).all()
    assert calls == ["self_attn", "cross_attn", "feed_forward"], "the sublayers run in this order, once each"
    # post-LN: every position of the output is LayerNorm-ed (mean ~ norm3.bias mean, here 0; std ~ 1)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 4), rtol=0, atol=1e-5)
    # and the same weights in nn.TransformerDecoderLayer give the same output
    theirs = nn.TransformerDecoderLayer(d, h, f, dropout=0.1, batch_first=True).eval()
    with torch.no_grad():
        theirs.self_attn.in_proj_weight.copy_(
            torch.cat([sa.q_proj.weight, sa.k_proj.weight, sa.v_proj.weight])
        )
        theirs.self_attn.in_proj_bias.copy_(torch.cat([sa.q_proj.bias, sa.k_proj.bias, sa.v_proj.bias]))
        theirs.self_attn.out_proj.load_state_dict(sa.out_proj.state_dict())
        theirs.multihead_attn.in_proj_weight.copy_(
            torch.cat([ca.q_proj.weight, ca.k_proj.weight, ca.v_proj.weight])
        )
        theirs.multihead_attn.in_proj_bias.copy_(torch.cat([ca.q_proj.bias, ca.k_proj.bias, ca.v_proj.bias]))
        theirs.multihead_attn.out_proj.load_state_dict(ca.out_proj.state_dict())
        theirs.linear1.load_state_dict(ff.linear1.state_dict())
        theirs.linear2.load_state_dict(ff.linear2.state_dict())
    want = theirs(x, memory, tgt_mask=~torch.from_numpy(masks.causal_mask(4)))
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)


def test_count_parameters_and_the_ffn_share():
    d, h, f = 512, 8, 2048
    layer = DecoderLayer(d, h, f)
    counts = count_parameters(layer)
    attn = 4 * (d * d + d)
    ffn = d * f + f + f * d + d
    assert counts["self_attn"] == attn and counts["cross_attn"] == attn and counts["feed_forward"] == ffn
    assert counts["norm1"] == 2 * d
    # independent total: PyTorch's own layer has exactly as many parameters
    theirs = nn.TransformerDecoderLayer(d, h, f, batch_first=True)
    assert counts["total"] == sum(p.numel() for p in theirs.parameters()) == 4_204_032
    # the "FFN holds ~2/3 of a layer" rule is for a layer without cross-attention (encoder / decoder-only) ...
    share_without_cross = ffn / (counts["total"] - counts["cross_attn"] - counts["norm3"])
    assert 0.66 < share_without_cross < 0.67
    # ... in an encoder-decoder's decoder layer, cross-attention brings it down to ~1/2
    assert 0.49 < counts["feed_forward"] / counts["total"] < 0.51


# ---------------------------------------------------------------------------------------------------------
# 05 NumPy decoder layer
# ---------------------------------------------------------------------------------------------------------
def test_init_numpy_params_shapes_and_keys_match_the_torch_export():
    params = init_numpy_decoder_params(D, H, F_, np.random.default_rng(0))
    exported = numpy_params_from_torch(DecoderLayer(D, H, F_))
    assert set(params) == set(exported)
    for key, value in params.items():
        assert value.shape == exported[key].shape, key
        assert np.isfinite(value).all()
    assert params["ff_W1"].shape == (D, F_) and params["ff_W2"].shape == (F_, D)
    same = init_numpy_decoder_params(D, H, F_, np.random.default_rng(0))
    assert all(np.array_equal(params[k], same[k]) for k in params), "a seeded rng must give the same params"
    with pytest.raises(ValueError):
        init_numpy_decoder_params(10, 3, 8, np.random.default_rng(0))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("seed", SEEDS)
def test_numpy_layer_equals_torch_layers(norm_first, seed):
    theirs = torch_decoder_layer(seed + 200, norm_first)
    ours = ours_decoder_from(theirs, norm_first)
    params = numpy_params_from_torch(ours)
    x, memory = randn(B, T, D, seed=seed + 201), randn(B, S, D, seed=seed + 202)
    causal, tgt_is_real, mem_is_real, self_allowed, cross_allowed = decoder_masks()
    x_np, memory_np = x.numpy().copy(), memory.numpy().copy()
    got = numpy_decoder_layer(
        x_np, memory_np, params, H, self_allowed.numpy(), cross_allowed.numpy(), norm_first=norm_first
    )
    assert isinstance(got, np.ndarray) and got.shape == (B, T, D) and got.dtype == np.float64
    want = theirs(
        x, memory, tgt_mask=~causal, tgt_key_padding_mask=~tgt_is_real, memory_key_padding_mask=~mem_is_real
    )
    np.testing.assert_allclose(got, want.detach().numpy(), **TOL64)
    np.testing.assert_allclose(got, ours(x, memory, self_allowed, cross_allowed).detach().numpy(), **TOL64)
    np.testing.assert_array_equal(x_np, x.numpy())  # inputs unchanged
    np.testing.assert_array_equal(memory_np, memory.numpy())


def test_numpy_layer_with_fully_masked_cross_rows_equals_our_torch_layer():
    ours = randomize_(DecoderLayer(D, H, F_, dropout=0.0), 300).double().eval()
    x, memory = randn(B, T, D, seed=301), randn(B, S, D, seed=302)
    cross_allowed = cross_attention_mask(torch.tensor([[True] * S, [False] * S]), T)
    causal = torch.from_numpy(masks.causal_mask(T))
    got = numpy_decoder_layer(
        x.numpy(), memory.numpy(), numpy_params_from_torch(ours), H, causal.numpy(), cross_allowed.numpy()
    )
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ours(x, memory, causal, cross_allowed).detach().numpy(), **TOL64)


def test_numpy_system_example():
    """The SPEC's NumPy post-LN layer: D 64, 4 heads, F 128, batch 2, target 5, memory 7 -> (2, 5, 64)."""
    d, h, f, b, t, s = 64, 4, 128, 2, 5, 7
    rng = np.random.default_rng(0)
    params = init_numpy_decoder_params(d, h, f, rng)
    x, memory = rng.standard_normal((b, t, d)), rng.standard_normal((b, s, d))
    self_allowed = masks.causal_mask(t)
    cross_allowed = masks.combine_masks(
        np.ones((t, s), bool), np.array([[True] * s, [True] * 5 + [False] * 2])
    )
    out = numpy_decoder_layer(x, memory, params, h, self_allowed, cross_allowed)
    assert out.shape == (2, 5, 64)
    assert np.isfinite(out).all(), "NaN or inf in the output"
    # the score of query 0 on the last key is masked: its attention weight is zero ...
    q = split_heads(x @ params["sa_Wq"] + params["sa_bq"], h)
    k = split_heads(x @ params["sa_Wk"] + params["sa_bk"], h)
    _, weights = np_attention.scaled_dot_product_attention(q, k, k, self_allowed)
    assert (weights[:, :, 0, -1] == 0).all()
    # ... so changing the last position (or any position after 0) leaves query 0's output unchanged
    x2 = x.copy()
    x2[:, 1:] += rng.standard_normal((b, t - 1, d))
    out2 = numpy_decoder_layer(x2, memory, params, h, self_allowed, cross_allowed)
    np.testing.assert_allclose(out2[:, 0], out[:, 0], rtol=0, atol=1e-12)
    assert not np.allclose(out2[:, 1:], out[:, 1:])
    # post-LN: every output position is normalised (LayerNorm gain 1, bias 0 at init)
    np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-10)
    np.testing.assert_allclose(out.std(-1), 1.0, atol=1e-3)
    # two runs without a fixed seed differ
    p1, p2 = init_numpy_decoder_params(d, h, f, None), init_numpy_decoder_params(d, h, f, None)
    assert not np.allclose(numpy_decoder_layer(x, memory, p1, h), numpy_decoder_layer(x, memory, p2, h))


def test_numpy_ffn_matrix_order_is_h_at_w():
    """A W2 @ h (or W.T) bug is caught: only the FFN is non-trivial here, checked against PyTorch's."""
    ff = randomize_(FeedForward(D, F_), 400).double()
    layer = DecoderLayer(D, H, F_, dropout=0.0, feed_forward=ff).double().eval()
    params = numpy_params_from_torch(layer)
    for prefix in ("sa", "ca"):  # silence both attentions: their output is 0, so the FFN carries everything
        params[f"{prefix}_Wo"] = np.zeros_like(params[f"{prefix}_Wo"])
        params[f"{prefix}_bo"] = np.zeros_like(params[f"{prefix}_bo"])
    x, memory = randn(B, T, D, seed=401), randn(B, S, D, seed=402)
    got = numpy_decoder_layer(x.numpy(), memory.numpy(), params, H, norm_first=True)
    want = x + ff(layer.norm3(x))
    np.testing.assert_allclose(got, want.detach().numpy(), **TOL64)
