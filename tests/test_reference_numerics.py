"""Lesson 10 reference (numerics): masked attention stays finite in float16, bfloat16 and autocast.

The oracle is ``F.scaled_dot_product_attention`` (which also returns zeros for fully masked rows); with values
``v = I`` its output *is* the weight matrix, so weights are checked against PyTorch too.
"""

import pytest
import torch
import torch.nn.functional as F

from autograder.course.reference import numerics as nm

HALF = [torch.float16, torch.bfloat16]
ALL = [torch.float64, torch.float32, *HALF]
# tolerances against a float64 oracle: half precision keeps ~3 (float16) or ~2 (bfloat16) significant digits
ATOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def masked_inputs(seed=0, B=2, H=3, T=5, S=7, Dh=8):
    """q, k, v (float32) and a (B, 1, T, S) mask with two fully masked query rows; rows of different scale."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dh, generator=g) * torch.tensor([0.1, 1.0, 3.0, 1.0, 5.0])[:, None]
    k, v = torch.randn(B, H, S, Dh, generator=g), torch.randn(B, H, S, Dh, generator=g)
    allowed = torch.rand(B, 1, T, S, generator=g) > 0.4
    allowed[:, :, :, 0] = True  # every row has a key ...
    allowed[0, 0, 1] = False  # ... except these two, fully masked
    allowed[1, 0, 3] = False
    return q, k, v, allowed


def fully_masked(allowed):
    return ~allowed.any(-1)  # (B, 1, T)


def test_mask_fill_value_is_the_most_negative_finite_number():
    for dtype in ALL:
        fill = nm.mask_fill_value(dtype)
        assert isinstance(fill, float)
        assert fill == torch.finfo(dtype).min
        assert torch.isfinite(torch.tensor(fill, dtype=dtype)), f"{dtype}: the fill must be representable"
    assert nm.mask_fill_value(torch.float16) == -65504.0


@pytest.mark.parametrize("dtype", ALL)
def test_robust_masked_softmax_equals_sdpa_weights_and_zeros_fully_masked_rows(dtype):
    _, _, _, allowed = masked_inputs()
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(2, 3, 5, 7, generator=g, dtype=torch.float64) * 4
    before = scores.to(dtype).clone()
    weights = nm.robust_masked_softmax(before, allowed)
    assert torch.equal(before, scores.to(dtype)), "robust_masked_softmax changed its input"
    assert weights.dtype == dtype and weights.shape == (2, 3, 5, 7)
    assert bool(torch.isfinite(weights).all()), f"{dtype}: non-finite weights"
    # PyTorch's own weights: SDPA with q = scores' rows (via identity keys) and v = I returns softmax(scores)
    eye = torch.eye(7, dtype=torch.float64)
    want = F.scaled_dot_product_attention(
        scores, eye.expand(2, 3, 7, 7), eye.expand(2, 3, 7, 7), attn_mask=allowed, scale=1.0
    )  # (B, H, T, S)
    torch.testing.assert_close(weights.double(), want, atol=ATOL[dtype], rtol=0)
    dead = fully_masked(allowed).expand(2, 3, 5)
    assert bool((weights[dead] == 0).all()), "a fully masked row must be zeros"
    assert bool((weights.masked_select(~allowed) == 0).all()), "a blocked key must weigh exactly 0"
    sums = weights.double().sum(-1)[~dead]
    torch.testing.assert_close(sums, torch.ones_like(sums), atol=ATOL[dtype] * 7, rtol=0)
    # no mask: a plain softmax
    torch.testing.assert_close(
        nm.robust_masked_softmax(before, None).double(), torch.softmax(scores, -1), atol=ATOL[dtype], rtol=0
    )


@pytest.mark.parametrize("dtype", ALL)
def test_robust_masked_softmax_stays_finite_for_huge_scores(dtype):
    big = torch.finfo(dtype).max / 4
    scores = torch.tensor([[big, -big, 0.0, big / 2], [-big, -big, -big, -big]], dtype=dtype)
    allowed = torch.tensor([[True, True, True, False], [True, True, False, False]])
    weights = nm.robust_masked_softmax(scores, allowed)
    assert bool(torch.isfinite(weights).all()), f"{dtype}: huge scores gave {weights}"
    assert weights[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert weights[1, :2].tolist() == [0.5, 0.5] and weights[1, 2:].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("dtype", ALL)
def test_robust_attention_agrees_with_sdpa_and_gives_zeros_on_fully_masked_rows(dtype):
    q, k, v, allowed = masked_inputs()
    out, weights = nm.robust_attention(q.to(dtype), k.to(dtype), v.to(dtype), allowed)
    assert out.dtype == dtype and out.shape == (2, 3, 5, 8) and weights.shape == (2, 3, 5, 7)
    assert bool(torch.isfinite(out).all()), f"{dtype}: NaN or inf in the output"
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=allowed)
    # half precision rounds q, k, v and every partial result: compare with a tolerance scaled to |v|
    atol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 1.5e-1}[dtype]
    torch.testing.assert_close(out.double(), want, atol=atol, rtol=0)
    dead = fully_masked(allowed).expand(2, 3, 5)
    assert bool((out[dead] == 0).all()) and bool((weights[dead] == 0).all())
    # same as SDPA in that dtype, rows that are not fully masked included
    same_dtype = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=allowed)
    torch.testing.assert_close(out.double(), same_dtype.double(), atol=atol, rtol=0)
    # no mask, T != S
    torch.testing.assert_close(
        nm.robust_attention(q.double(), k.double(), v.double())[0],
        F.scaled_dot_product_attention(q.double(), k.double(), v.double()),
    )


def test_robust_attention_has_no_nan_under_cpu_autocast_and_finite_gradients():
    q, k, v, allowed = masked_inputs(seed=2)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, weights = nm.robust_attention(q, k, v, allowed)
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(weights).all()), "NaN under autocast"
    want = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), attn_mask=allowed)
    torch.testing.assert_close(out.float(), want, atol=1.5e-1, rtol=0)
    out.float().sum().backward()
    for name, t in [("q", q), ("k", k), ("v", v)]:
        assert bool(torch.isfinite(t.grad).all()), f"NaN in the gradient of {name} under autocast"
    # and in float16 itself, gradients through the fully masked rows stay finite
    q16, k16, v16 = (t.detach().half().requires_grad_() for t in (q, k, v))
    nm.robust_attention(q16, k16, v16, allowed)[0].float().sum().backward()
    assert all(bool(torch.isfinite(t.grad).all()) for t in (q16, k16, v16))


def test_naive_masking_fails_exactly_as_the_lesson_says():
    scores = torch.tensor([[0.5, -1.0, 2.0], [0.3, 0.1, -0.2]])
    allowed = torch.tensor([[True, False, True], [False, False, False]])  # row 1 fully masked
    inf, big = float("-inf"), -1e9
    for dtype in ALL:
        assert bool(torch.isnan(nm.naive_masked_softmax(scores.to(dtype), allowed, inf)[1]).all()), (
            f"{dtype}: -inf should give NaN on a fully masked row"
        )
        ok_row = nm.naive_masked_softmax(scores.to(dtype), allowed, inf)[0]
        assert bool(torch.isfinite(ok_row).all())
    # -1e9 in float32 (and bfloat16, whose range is float32's): a silent uniform average over blocked keys
    for dtype in (torch.float32, torch.bfloat16):
        row = nm.naive_masked_softmax(scores.to(dtype), allowed, big)[1].float()
        torch.testing.assert_close(row, torch.full((3,), 1 / 3), atol=2e-3, rtol=0)
    # -1e9 does not exist in float16 (max 65504): cast, it becomes -inf and the NaN is back ...
    assert torch.tensor(big).half().item() == inf
    assert bool(torch.isnan(nm.naive_masked_softmax(scores.half(), allowed, big)[1]).all())
    # ... and masked_fill refuses it outright
    with pytest.raises(RuntimeError, match="overflow"):
        scores.half().masked_fill(~allowed, big)
    # the robust version: zeros
    assert nm.robust_masked_softmax(scores.half(), allowed)[1].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("dtype", ALL)
def test_masked_logsumexp_equals_torch_logsumexp_on_rows_far_apart_and_fully_masked_rows(dtype):
    _, _, _, allowed = masked_inputs()  # (B, 1, T, S) with two fully masked rows
    g = torch.Generator().manual_seed(3)
    offsets = torch.tensor([0.0, 300.0, -200.0, 20.0, 0.0])[:, None]  # (T, 1): rows far apart
    if dtype == torch.float16:
        offsets = offsets * 60  # up to 18000: exp overflows float32 without the max
    scores = (torch.randn(2, 3, 5, 7, generator=g, dtype=torch.float64) * 3 + offsets).to(dtype)
    before = scores.clone()
    got = nm.masked_logsumexp(scores, allowed)
    assert torch.equal(scores, before), "masked_logsumexp changed its input"
    kept = torch.float64 if dtype == torch.float64 else torch.float32
    assert got.dtype == kept and got.shape == (2, 3, 5)
    dead = fully_masked(allowed).expand(2, 3, 5)
    # PyTorch's own: torch.logsumexp over the allowed keys (blocked ones at -inf), in float64
    want = scores.double().masked_fill(~allowed, float("-inf")).logsumexp(-1)
    torch.testing.assert_close(got.double()[~dead], want[~dead], rtol=1e-6, atol=1e-9)
    assert bool((got[dead] == torch.finfo(kept).min).all()), "a fully masked row is the result dtype's finfo.min"
    # and what F.cross_entropy subtracts: -log_softmax at a target = logsumexp - score
    rows = scores.double().reshape(-1, 7)
    target = torch.zeros(rows.shape[0], dtype=torch.long)
    ce = F.cross_entropy(rows, target, reduction="none")
    torch.testing.assert_close(nm.masked_logsumexp(rows).double() - rows[:, 0], ce, rtol=1e-6, atol=1e-6)


def test_masked_logsumexp_of_a_row_depends_on_that_row_only():
    scores = torch.randn(6, 9, generator=torch.Generator().manual_seed(4))
    before = nm.masked_logsumexp(scores)
    moved = scores.clone()
    moved[2] += 500.0
    after = nm.masked_logsumexp(moved)
    keep = torch.arange(6) != 2
    assert torch.equal(after[keep], before[keep])
    torch.testing.assert_close(after[2], before[2] + 500.0)
