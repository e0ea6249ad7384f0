"""The hidden reference modules of lessons 00-02 (warm-ups, masks, NumPy attention), proven against PyTorch.

Every value check compares with PyTorch's own functions (``torch.tril``, ``torch.softmax``,
``F.scaled_dot_product_attention``, ``Tensor.reshape``/``transpose``), never with the reference itself. Sizes
follow the SPEC's rule that inputs must not hide bugs: B >= 2, H >= 2, Dh >= 2, T != S != H, pad_id != 0, rows
of very different scale, fully masked rows.
"""

import inspect
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from autograder.course import lessons
from autograder.course.reference import attention, masks
from autograder.course.reference import setup as warmup

B, H, T, S, Dh, Dv = 2, 3, 5, 7, 4, 6  # all different: a swapped axis cannot go unnoticed
SEEDS = [0, 1, 2]


def test_contract_names():
    assert lessons.exercises("00-setup") == ["flatten_batch", "time_major", "split_last"]
    assert lessons.exercises("01-masks") == ["causal_mask", "padding_mask", "combine_masks", "mask_to_bias"]
    assert lessons.exercises("02-attention") == [
        "softmax", "masked_softmax", "scaled_dot_product_attention", "fixed_attention"]


# ----------------------------------------------------------------------------------------------------
# 00 warm-ups
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_warmups_equal_torch_reshapes(backend):
    x_np = np.random.default_rng(0).standard_normal((B, T, 6)).astype(np.float32)  # D = 6, H = 3, Dh = 2
    x_t = torch.from_numpy(x_np.copy())
    expected = {
        "flatten_batch": x_t.reshape(B * T, 6),
        "time_major": x_t.transpose(0, 1),
        "split_last": x_t.view(B, T, 3, 2),
    }
    x = x_np if backend == "numpy" else x_t
    got = {
        "flatten_batch": warmup.flatten_batch(x),
        "time_major": warmup.time_major(x),
        "split_last": warmup.split_last(x, 3),
    }
    for name, want in expected.items():
        out = torch.as_tensor(np.asarray(got[name])) if backend == "numpy" else got[name]
        assert tuple(out.shape) == tuple(want.shape), name
        assert torch.equal(out, want), name
    np.testing.assert_array_equal(np.asarray(x), x_np)  # the caller's input is unchanged


@pytest.mark.parametrize("name", lessons.exercises("00-setup"))
def test_warmups_use_rearrange(name):
    assert "rearrange(" in inspect.getsource(getattr(warmup, name))


def test_split_last_rejects_indivisible_width():
    with pytest.raises(Exception):  # noqa: B017 - einops raises its own EinopsError
        warmup.split_last(np.zeros((B, T, 7)), 3)


# ----------------------------------------------------------------------------------------------------
# 01 masks
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_causal_mask_equals_torch_tril(n):
    got = masks.causal_mask(n)
    assert isinstance(got, np.ndarray) and got.dtype == np.bool_ and got.shape == (n, n)
    np.testing.assert_array_equal(got, torch.tril(torch.ones(n, n, dtype=torch.bool)).numpy())


def test_padding_mask_with_nonzero_pad_id():
    pad_id = 7
    ids = np.array([[3, 0, 5, 7, 7], [0, 7, 4, 7, 9]])  # 0 is a real token here; 7 is padding
    before = ids.copy()
    got = masks.padding_mask(ids, pad_id)
    assert got.dtype == np.bool_ and got.shape == ids.shape
    np.testing.assert_array_equal(got, (torch.from_numpy(ids) != pad_id).numpy())
    np.testing.assert_array_equal(ids, before)


@pytest.mark.parametrize("seed", SEEDS)
def test_combine_masks_shape_and_values(seed):
    rng = np.random.default_rng(seed)
    causal = rng.random((T, S)) < 0.6  # any (T, S) pattern, T != S
    key_is_real = rng.random((B, S)) < 0.7
    got = masks.combine_masks(causal, key_is_real)
    assert got.dtype == np.bool_ and got.shape == (B, 1, T, S)
    for b in range(B):
        for t in range(T):
            for s in range(S):
                assert got[b, 0, t, s] == (causal[t, s] and key_is_real[b, s]), (b, t, s)
    # square causal (T, T) with padding of the same length
    sq = masks.combine_masks(masks.causal_mask(T), key_is_real[:, :T])
    assert sq.shape == (B, 1, T, T)


def test_combined_mask_gives_sdpa_the_same_answer_as_separate_masks():
    rng = np.random.default_rng(3)
    key_is_real = np.array([[True] * T, [True] * (T - 2) + [False] * 2])
    allowed = masks.combine_masks(masks.causal_mask(T), key_is_real)  # (B, 1, T, T)
    q, k, v = (torch.from_numpy(rng.standard_normal((B, H, T, Dh))) for _ in range(3))
    ours = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.from_numpy(allowed))
    # PyTorch's own pieces: a causal triangle plus a key-padding row, applied as two boolean masks
    causal_t = torch.ones(T, T, dtype=torch.bool).tril()
    pad_t = torch.from_numpy(key_is_real)[:, None, None, :]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_t & pad_t)
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_mask_to_bias_is_finite_zero_and_very_negative(dtype):
    allowed = np.array([[True, False, True], [False, False, False]])
    bias = masks.mask_to_bias(allowed, dtype=dtype)
    assert bias.dtype == dtype and bias.shape == allowed.shape
    assert np.isfinite(bias).all(), "the bias must stay finite (no -inf)"
    assert (bias[allowed] == 0).all()
    assert (bias[~allowed] == np.finfo(dtype).min).all(), "blocked -> the dtype's most negative value"
    # the trap it avoids: -1e9 does not fit in float16
    with np.errstate(over="ignore"):
        assert np.isinf(np.float16(-1e9))


def test_mask_to_bias_default_dtype_is_float32():
    assert masks.mask_to_bias(np.array([True, False])).dtype == np.float32


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_biased_softmax_equals_masked_softmax_on_rows_with_a_key(dtype):
    rng = np.random.default_rng(4)
    scores = (rng.standard_normal((B, H, T, S)) * 3).astype(dtype)
    allowed = rng.random((B, 1, T, S)) < 0.5
    allowed[0, 0, 1] = False  # one fully masked row
    has_key = np.broadcast_to(allowed.any(-1), (B, H, T))
    biased = torch.softmax(torch.from_numpy(scores + masks.mask_to_bias(allowed, dtype)), dim=-1).numpy()
    ours = attention.masked_softmax(scores, allowed)
    atol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(biased[has_key], ours[has_key], atol=atol, rtol=0)


# ----------------------------------------------------------------------------------------------------
# 02 attention: softmax and masked softmax
# ----------------------------------------------------------------------------------------------------
def _torch_masked_softmax(scores: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """PyTorch's answer with a -inf fill (NaN on fully masked rows: compare only the others)."""
    s = torch.from_numpy(np.array(scores))  # copies: PyTorch wants writable arrays
    a = torch.from_numpy(np.array(np.broadcast_to(allowed, scores.shape)))
    return torch.softmax(s.masked_fill(~a, float("-inf")), dim=-1).numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
def test_softmax_equals_torch(dtype, axis):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((B, T, S)) * np.array([0.1, 1.0, 30.0, 5.0, 0.01, 2.0, 100.0])).astype(dtype)
    before = x.copy()
    got = attention.softmax(x, axis=axis)
    assert got.shape == x.shape and got.dtype == dtype
    want = torch.softmax(torch.from_numpy(x), dim=axis).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-7)
    np.testing.assert_array_equal(x, before)


def test_softmax_default_axis_is_last():
    x = np.random.default_rng(6).standard_normal((T, S))
    np.testing.assert_allclose(attention.softmax(x).sum(-1), np.ones(T))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_is_stable_for_huge_scores(dtype):
    x = (np.random.default_rng(7).standard_normal((B, T, S)) * 1e4).astype(dtype)
    x[0, 0] = 1e4  # a whole row of equal huge scores
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow warning fails the test
        got = attention.softmax(x)
    assert np.isfinite(got).all(), "exp overflowed: subtract the row max first"
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(got[0, 0], np.full(S, 1 / S), rtol=1e-5)
    want = torch.softmax(torch.from_numpy(x.astype(np.float64)), dim=-1).numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", SEEDS)
def test_masked_softmax_equals_torch_and_zeroes_fully_masked_rows(dtype, seed):
    rng = np.random.default_rng(seed)
    row_scale = rng.choice([0.1, 1.0, 50.0], size=(B, H, T, 1))  # rows of very different scale
    scores = (rng.standard_normal((B, H, T, S)) * row_scale).astype(dtype)
    allowed = rng.random((B, 1, T, S)) < 0.5  # broadcasts over heads
    allowed[1, 0, 2] = False  # a fully masked row
    allowed[0, 0, 0] = True
    before_scores, before_allowed = scores.copy(), allowed.copy()
    with warnings.catch_warnings(), np.errstate(divide="raise", over="raise", invalid="raise"):
        warnings.simplefilter("error")  # "no warning emitted" is part of the contract
        got = attention.masked_softmax(scores, allowed)
    assert got.shape == (B, H, T, S) and got.dtype == dtype
    assert np.isfinite(got).all()
    full = np.broadcast_to(allowed, got.shape)
    has_key = full.any(-1)
    assert (got[~full] == 0).all(), "a blocked key got weight"
    assert (got[~has_key] == 0).all(), "a fully masked row must be all zeros (not NaN, not uniform)"
    np.testing.assert_allclose(got[has_key].sum(-1), 1.0, rtol=1e-5)
    want = _torch_masked_softmax(scores, allowed)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got[has_key], want[has_key], rtol=rtol, atol=1e-7)
    np.testing.assert_array_equal(scores, before_scores)
    np.testing.assert_array_equal(allowed, before_allowed)


def test_masked_softmax_none_means_all_allowed():
    scores = np.random.default_rng(8).standard_normal((B, T, S))
    want = torch.softmax(torch.from_numpy(scores), -1).numpy()
    np.testing.assert_allclose(attention.masked_softmax(scores, None), want, rtol=1e-12)


@pytest.mark.parametrize("mask_shape", [(T, S), (B, 1, 1, S), (1, H, T, S), (B, H, T, S)])
def test_masked_softmax_broadcasts_the_mask(mask_shape):
    rng = np.random.default_rng(9)
    scores = rng.standard_normal((B, H, T, S))
    allowed = rng.random(mask_shape) < 0.6
    got = attention.masked_softmax(scores, allowed)
    assert got.shape == (B, H, T, S)
    full = np.broadcast_to(allowed, scores.shape)
    want = _torch_masked_softmax(scores, allowed)
    has_key = full.any(-1)
    np.testing.assert_allclose(got[has_key], want[has_key], rtol=1e-12, atol=1e-15)
    assert (got[~has_key] == 0).all()


def test_masked_softmax_huge_scores_stay_finite():
    rng = np.random.default_rng(10)
    scores = (rng.standard_normal((B, H, T, S)) * 1e4).astype(np.float32)
    allowed = rng.random((B, H, T, S)) < 0.5
    allowed[..., 0] = True
    got = attention.masked_softmax(scores, allowed)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)
    want = _torch_masked_softmax(scores.astype(np.float64), allowed)
    np.testing.assert_allclose(got, want, atol=1e-6)


# ----------------------------------------------------------------------------------------------------
# 02 attention: scaled dot-product attention against F.scaled_dot_product_attention
# ----------------------------------------------------------------------------------------------------
def _qkv(rng, dtype, scale=1.0, t=T, s=S):
    q = (rng.standard_normal((B, H, t, Dh)) * scale).astype(dtype)
    k = (rng.standard_normal((B, H, s, Dh)) * scale).astype(dtype)
    v = rng.standard_normal((B, H, s, Dv)).astype(dtype)  # Dv != Dh
    return q, k, v


def _check_against_sdpa(q, k, v, allowed, dtype):
    """Ours vs PyTorch: outputs on rows with a key; exact zeros on fully masked rows; weights vs softmax."""
    before = [a.copy() for a in (q, k, v)] + ([allowed.copy()] if allowed is not None else [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, weights = attention.scaled_dot_product_attention(q, k, v, allowed)
    t, s = q.shape[-2], k.shape[-2]
    assert out.shape == (B, H, t, Dv) and weights.shape == (B, H, t, s)
    assert out.dtype == dtype and weights.dtype == dtype, "a float32 input should stay float32"
    assert np.isfinite(out).all() and np.isfinite(weights).all()
    qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
    mask_t = None if allowed is None else torch.from_numpy(allowed)
    want = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask_t).numpy()
    scores = (qt @ kt.transpose(-2, -1) / Dh**0.5).numpy()
    full = np.ones((B, H, t, s), bool) if allowed is None else np.broadcast_to(allowed, (B, H, t, s))
    has_key = full.any(-1)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out[has_key], want[has_key], **tol)
    np.testing.assert_allclose(weights[has_key], _torch_masked_softmax(scores, full)[has_key], **tol)
    assert (out[~has_key] == 0).all() and (weights[~has_key] == 0).all(), "fully masked rows must be zeros"
    for a, b in zip([q, k, v] + ([allowed] if allowed is not None else []), before, strict=True):
        np.testing.assert_array_equal(a, b, err_msg="an input was modified")
    return out, weights


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", SEEDS)
def test_sdpa_causal_self_attention(dtype, seed):
    q, k, v = _qkv(np.random.default_rng(seed), dtype, t=T, s=T)
    _check_against_sdpa(q, k, v, masks.causal_mask(T), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sdpa_padding_and_t_ne_s(dtype):
    rng = np.random.default_rng(11)
    q, k, v = _qkv(rng, dtype)
    key_is_real = np.array([[True] * S, [True] * 4 + [False] * (S - 4)])
    _check_against_sdpa(q, k, v, key_is_real[:, None, None, :], dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", SEEDS)
def test_sdpa_random_mask_with_fully_masked_rows(dtype, seed):
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, dtype)
    allowed = rng.random((B, H, T, S)) < 0.4
    allowed[0, 1, 3] = False
    allowed[1, :, 0] = False
    _check_against_sdpa(q, k, v, allowed, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sdpa_without_mask(dtype):
    q, k, v = _qkv(np.random.default_rng(12), dtype)
    _check_against_sdpa(q, k, v, None, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sdpa_huge_scores(dtype):
    rng = np.random.default_rng(13)
    q, k, v = _qkv(rng, dtype, scale=70.0)  # scores ~ 1e4
    allowed = rng.random((B, H, T, S)) < 0.5
    allowed[..., 2] = True
    out, weights = attention.scaled_dot_product_attention(q, k, v, allowed)
    assert np.isfinite(out).all() and np.isfinite(weights).all()
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    # values in float64, where PyTorch and we can agree tightly
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    _check_against_sdpa(q64, k64, v64, allowed, np.float64)


def test_sdpa_scales_by_sqrt_head_width():
    # Dh = 16: a missing 1/sqrt(Dh) changes the weights by a factor 4 in the exponent
    rng = np.random.default_rng(14)
    q, k = rng.standard_normal((B, H, T, 16)), rng.standard_normal((B, H, S, 16))
    v = rng.standard_normal((B, H, S, 3))
    out, weights = attention.scaled_dot_product_attention(q, k, v)
    scores = q @ k.swapaxes(-1, -2) / 4.0
    want = torch.softmax(torch.from_numpy(scores), -1).numpy()
    np.testing.assert_allclose(weights, want, rtol=1e-12)
    np.testing.assert_allclose(out, want @ v, rtol=1e-10)


def test_sdpa_works_without_batch_and_head_axes():
    rng = np.random.default_rng(15)
    q, k, v = rng.standard_normal((T, Dh)), rng.standard_normal((S, Dh)), rng.standard_normal((S, Dv))
    out, weights = attention.scaled_dot_product_attention(q, k, v)
    want = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v))).numpy()
    assert out.shape == (T, Dv) and weights.shape == (T, S)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_sdpa_causal_leakage(seed):
    """Changing positions > t of q, k and v leaves the outputs at positions <= t unchanged."""
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, np.float64, t=T, s=T)
    allowed = masks.causal_mask(T)
    out, _ = attention.scaled_dot_product_attention(q, k, v, allowed)
    for t in range(T - 1):
        q2, k2, v2 = q.copy(), k.copy(), v.copy()
        for a in (q2, k2, v2):
            a[..., t + 1 :, :] += rng.standard_normal(a[..., t + 1 :, :].shape) * 10
        out2, _ = attention.scaled_dot_product_attention(q2, k2, v2, allowed)
        np.testing.assert_allclose(out2[..., : t + 1, :], out[..., : t + 1, :], rtol=0, atol=1e-12)
        assert not np.allclose(out2[..., t + 1 :, :], out[..., t + 1 :, :]), "the perturbation had no effect"


def test_sdpa_padding_leakage():
    """Changing padded keys/values does not change any output."""
    rng = np.random.default_rng(16)
    q, k, v = _qkv(rng, np.float64)
    key_is_real = np.array([[True] * S, [True] * 3 + [False] * (S - 3)])
    allowed = key_is_real[:, None, None, :]
    out, _ = attention.scaled_dot_product_attention(q, k, v, allowed)
    k2, v2 = k.copy(), v.copy()
    k2[1, :, 3:] = rng.standard_normal(k2[1, :, 3:].shape) * 100
    v2[1, :, 3:] = rng.standard_normal(v2[1, :, 3:].shape) * 100
    out2, _ = attention.scaled_dot_product_attention(q, k2, v2, allowed)
    np.testing.assert_allclose(out2, out, rtol=0, atol=1e-12)
