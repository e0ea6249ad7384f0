"""6. The reference attention and decoder layer vs PyTorch's own, at the shapes the lessons use.

``multi_head.attention`` (the course's attention, what every later lesson runs) against
``F.scaled_dot_product_attention``, and the reference ``DecoderLayer`` against ``nn.TransformerDecoderLayer``
with copied weights; forward passes in eval mode without gradients, and, at the training shape, forward +
backward. Outputs are checked equal before anything is timed; each pair is timed in turn in the same run.
"""

from __future__ import annotations

from bench.common import NOT_AVAILABLE, seconds, side_by_side, table

TARGET = 1.5  # reference attention at most 1.5x SDPA (issue 7)
# (where, B, T, S, D, H, F, norm_first)
SHAPES = [
    ("lesson 05 post-LN layer", 2, 4, 6, 512, 8, 2048, False),
    ("lesson 06 model (pre-LN)", 2, 5, 7, 512, 8, 2048, True),
    ("lesson 07 training batch", 128, 11, 10, 64, 4, 256, True),
    ("lesson 09 decoding, 16 rows", 16, 64, 10, 128, 4, 512, True),
]


def _layer_rows(where, B, T, S, D, H, F_, norm_first, causal, repeats, budget) -> list[list[str]]:
    """The reference DecoderLayer vs nn.TransformerDecoderLayer with copied weights, at one shape."""
    import torch
    from torch import nn

    from autograder.course.reference.decoder_layer import DecoderLayer, load_from_torch_decoder_layer

    theirs = nn.TransformerDecoderLayer(D, H, F_, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    ours = load_from_torch_decoder_layer(DecoderLayer(D, H, F_, dropout=0.0, norm_first=norm_first), theirs).eval()
    x, memory = torch.randn(B, T, D), torch.randn(B, S, D)  # (B, T, D), (B, S, D)
    blocked = ~causal  # PyTorch's tgt_mask polarity: True = blocked; invert only at this boundary
    with torch.no_grad():
        assert torch.allclose(ours(x, memory, causal), theirs(x, memory, tgt_mask=blocked), atol=1e-4)

    def forward(layer, *args, **kwargs):
        with torch.no_grad():
            return layer(*args, **kwargs)

    times = side_by_side({
        "ours": lambda: forward(ours, x, memory, causal),
        "torch": lambda: forward(theirs, x, memory, tgt_mask=blocked),
    }, repeats, budget)
    rows = [[where, f"decoder layer forward (D={D}, F={F_}, S={S})", seconds(times["ours"]),
             seconds(times["torch"]), f"{times['ours'] / times['torch']:.2f}×"]]
    if B >= 64:  # the training shape: what a training step costs
        ours.train(), theirs.train()  # dropout is 0: train mode only turns autograd bookkeeping on
        times = side_by_side({
            "ours": lambda: ours(x, memory, causal).sum().backward(),
            "torch": lambda: theirs(x, memory, tgt_mask=blocked).sum().backward(),
        }, repeats, budget)
        rows.append([where, "decoder layer forward + backward", seconds(times["ours"]), seconds(times["torch"]),
                     f"{times['ours'] / times['torch']:.2f}×"])
    return rows


def run(quick: bool = False, repeats: int = 5) -> str:
    try:
        import autograder.course.reference.decoder_layer  # noqa: F401
        from autograder.course.reference.multi_head import attention
    except ImportError:
        return NOT_AVAILABLE
    import torch
    import torch.nn.functional as F

    repeats = 3 if quick else repeats
    budget = 0.02 if quick else 0.2  # s per sample: long enough to average out a busy neighbour's bursts
    rows, worst = [], 0.0
    for where, B, T, S, D, H, F_, norm_first in SHAPES:
        torch.manual_seed(0)
        Dh = D // H
        q = torch.randn(B, H, T, Dh)  # (B, H, T, Dh)
        k, v = torch.randn(B, H, T, Dh), torch.randn(B, H, T, Dh)  # (B, H, T, Dh): self-attention
        causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T), True = may attend
        ours_out, _ = attention(q, k, v, causal)
        assert torch.allclose(ours_out, F.scaled_dot_product_attention(q, k, v, attn_mask=causal), atol=1e-5)
        times = side_by_side({
            "ours": lambda q=q, k=k, v=v, m=causal: attention(q, k, v, m),
            "sdpa": lambda q=q, k=k, v=v, m=causal: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        }, repeats, budget)
        ratio = times["ours"] / times["sdpa"]
        worst = max(worst, ratio)
        rows.append([where, f"attention, causal (B={B}, H={H}, T={T}, Dh={Dh})", seconds(times["ours"]),
                     seconds(times["sdpa"]), f"{ratio:.2f}×"])

        rows += _layer_rows(where, B, T, S, D, H, F_, norm_first, causal, repeats, budget)
    return "\n".join([
        table(["shape", "what", "reference", "PyTorch", "reference / PyTorch"], rows),
        "",
        f"Median per call of {repeats} interleaved samples. Attention target ≤ {TARGET}× SDPA at every shape: "
        f"{'yes' if worst <= TARGET else '**no**'} (worst {worst:.2f}×)."])
