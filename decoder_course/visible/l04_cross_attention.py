"""Visible checks of lesson 04-cross-attention: the cross-attention mask, and CrossAttention's reusable memory.

Properties any correct answer has: one identical row per query with no causal part, memory padding never leaks,
``forward(query, memory_kv=project_memory(memory))`` equals ``forward(query, memory)`` without projecting the memory
again, the output follows the ``memory_kv`` it is given, one decoding step at a time equals the full pass, and
agreement with ``nn.MultiheadAttention`` (whose ``key_padding_mask`` is True at padding: the opposite polarity).
"""

from __future__ import annotations

import torch
from torch import nn

from decoder_course.checks import (
    CheckFailed,
    check,
    expect_close,
    expect_dtype,
    expect_finite,
    expect_inputs_unchanged,
    expect_rows_sum_to_one,
    expect_shape,
    expect_type,
    padding_leakage_probe,
)


def check_cross_attention_mask(cross_attention_mask) -> None:
    """The worked example (B=2, S=4, T=3), polarity, no causal part, and T > S."""
    memory_is_real = torch.tensor([[True, True, True, False], [True, True, False, False]])  # (B, S)
    with check("cross_attention_mask on the worked example (B=2, S=4, T=3)"):
        got = expect_inputs_unchanged(cross_attention_mask, memory_is_real, 3)
        expect_type(got, torch.Tensor, "cross_attention_mask(memory_is_real, 3)")
        expect_shape(got, (2, 1, 3, 4), "cross_attention_mask(memory_is_real, 3)", names="B, 1, T, S")
        expect_dtype(got, "bool", "cross_attention_mask(...)")
        want = torch.tensor([[[[True, True, True, False]] * 3], [[[True, True, False, False]] * 3]])  # (B, 1, T, S)
        if torch.equal(got, ~want):
            raise CheckFailed("your mask is True exactly at the padding: that is PyTorch's key_padding_mask "
                              "polarity. Here True means the query may attend to this key")
        if not got[0, 0, 0, 1:3].all():
            raise CheckFailed("query 0 may not see memory positions 1 and 2, which are real tokens: cross-attention "
                              "has no causal part, the whole source is known before decoding starts")
        expect_close(got, want, "cross_attention_mask(memory_is_real, 3)",
                     hint="each of the T rows of sequence b is memory_is_real[b]")
    with check("cross_attention_mask returns a new tensor, not a view of the caller's memory_is_real"):
        got = cross_attention_mask(memory_is_real, 3)
        if 0 in got.stride()[:3]:
            raise CheckFailed(f"the mask's strides are {got.stride()}: an `expand` view whose rows share the "
                              "caller's memory, so writing into one query's row writes into all of them and into "
                              "memory_is_real. Return a new tensor: .repeat(1, 1, T, 1) or .expand(...).clone()")
    with check("cross_attention_mask with more queries than memory tokens (T=6, S=4)"):
        got = cross_attention_mask(memory_is_real, 6)
        expect_shape(got, (2, 1, 6, 4), "cross_attention_mask(memory_is_real, 6)", names="B, 1, T, S")


def _randomised(CrossAttention, D: int, H: int, seed: int) -> nn.Module:
    """A module with every parameter re-drawn (biases far from 0, so a missing one shows), in eval mode."""
    torch.manual_seed(seed)
    module = CrossAttention(D, H)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.5 if p.dim() == 1 else D ** -0.5)
    return module.eval()


def _pair(result, what: str):
    expect_type(result, tuple, what)
    if len(result) != 2:
        raise CheckFailed(f"{what} should return a pair, got {len(result)} values")
    return result


def check_cross_attention(CrossAttention) -> None:
    """Shapes, masks, reuse of memory_kv, one step at a time, and agreement with nn.MultiheadAttention."""
    D, H, B, T, S = 12, 3, 2, 4, 6  # Dh = 4; T != S != H
    g = torch.Generator().manual_seed(5)
    query, memory, memory2 = (torch.randn(B, n, D, generator=g) for n in (T, S, S))
    is_real = torch.tensor([[True] * S, [True] * 3 + [False] * 3])  # (B, S)
    allowed = is_real[:, None, None, :].expand(B, 1, T, S)  # (B, 1, T, S)
    xattn = _randomised(CrossAttention, D, H, seed=6)

    with check("project_memory(memory) returns per-head keys and values (B, H, S, Dh)"):
        kv = _pair(expect_inputs_unchanged(xattn.project_memory, memory), "project_memory(memory)")
        for name, x in zip("kv", kv, strict=True):
            expect_type(x, torch.Tensor, f"project_memory's {name}")
            expect_shape(x, (B, H, S, D // H), f"project_memory's {name}", names="B, H, S, Dh")

    with check("forward(query, memory, allowed) returns out (B, T, D) and weights (B, H, T, S), padding masked"):
        with torch.no_grad():
            out, weights = _pair(expect_inputs_unchanged(xattn, query, memory, allowed=allowed), "forward(...)")
        expect_shape(out, (B, T, D), "out", names="B, T, D")
        expect_shape(weights, (B, H, T, S), "weights", names="B, H, T, S")
        expect_dtype(out, "float", "out")
        expect_rows_sum_to_one(weights, allowed)

    with check("forward(query, memory_kv=project_memory(memory)) equals forward(query, memory) and projects nothing"):
        calls = []
        hooks = [getattr(xattn, name).register_forward_hook(lambda *_, n=name: calls.append(n))
                 for name in ("k_proj", "v_proj")]
        try:
            with torch.no_grad():
                reused, reused_w = _pair(xattn(query, memory_kv=kv, allowed=allowed), "forward(memory_kv=...)")
        except (CheckFailed, NotImplementedError):
            raise
        except Exception as exc:
            raise CheckFailed(f"forward(query, memory_kv=kv) crashed ({type(exc).__name__}: {exc}). With memory_kv "
                              "given, memory is None: take the keys and values from memory_kv instead of "
                              "projecting the memory") from None
        finally:
            for hook in hooks:
                hook.remove()
        if calls:
            raise CheckFailed(f"with memory_kv given, forward still ran {sorted(set(calls))}: the whole point is to "
                              "project the memory once and reuse the keys and values")
        expect_close(reused, out, "the output with memory_kv", atol=1e-5,
                     hint="memory_kv holds exactly the keys and values forward(query, memory) would compute")
        expect_close(reused_w, weights, "the weights with memory_kv", atol=1e-5)

    with check("the output follows the memory_kv it is given, not some other memory"):
        with torch.no_grad():
            other, _ = xattn(query, memory2, allowed=allowed)
            got, _ = xattn(query, memory_kv=xattn.project_memory(memory2), allowed=allowed)
        expect_close(got, other, "forward(query, memory_kv=project_memory(memory2))", atol=1e-5,
                     hint="the keys and values must come from memory_kv when it is given")

    with check("one decoding step at a time (T=1, the same memory_kv) equals the full pass"):
        with torch.no_grad():
            for t in range(T):
                step, _ = xattn(query[:, t:t + 1], memory_kv=kv, allowed=allowed[:, :, t:t + 1])
                expect_shape(step, (B, 1, D), f"the output of step {t}", names="B, T, D")
                expect_close(step[:, 0], out[:, t], f"step {t}'s output", atol=1e-5,
                             hint="each query's output depends only on that query and the memory")

    with check("given both memory and memory_kv, or neither, forward refuses with a ValueError"):
        for args, kwargs, what in [((query, memory), {"memory_kv": kv}, "both memory and memory_kv"),
                                   ((query,), {}, "neither memory nor memory_kv")]:
            try:
                xattn(*args, **kwargs)
            except ValueError:
                continue
            except NotImplementedError:
                raise
            except Exception as exc:
                raise CheckFailed(f"given {what}, forward raised {type(exc).__name__} ({exc}): check the arguments "
                                  "first and raise a ValueError asking for exactly one") from None
            raise CheckFailed(f"forward accepted {what}: raise a ValueError asking for exactly one (two could "
                              "disagree; none leaves nothing to attend to)")

    with check("memory padding does not leak, and a sequence with no real memory token gives out_proj.bias"):
        padding_leakage_probe(lambda m: xattn(query, m, allowed=allowed), memory, is_real, key_axis=1, atol=1e-5,
                              what="CrossAttention's output")
        empty = torch.tensor([[True] * S, [False] * S])[:, None, None, :]  # sequence 1: all padding
        with torch.no_grad():
            out_empty, weights_empty = xattn(query, memory, allowed=empty)
        expect_finite(out_empty, "out")
        expect_rows_sum_to_one(weights_empty, empty)
        expect_close(out_empty[1], xattn.out_proj.bias.expand(T, D), "the rows of the sequence with no memory",
                     hint="a query with no allowed key attends to nothing, so its output row is out_proj.bias")

    with check("equals nn.MultiheadAttention with the same weights (key_padding_mask = ~memory_is_real)"):
        theirs = nn.MultiheadAttention(D, H, batch_first=True).eval()
        with torch.no_grad():
            theirs.in_proj_weight.copy_(torch.cat([xattn.q_proj.weight, xattn.k_proj.weight, xattn.v_proj.weight]))
            theirs.in_proj_bias.copy_(torch.cat([xattn.q_proj.bias, xattn.k_proj.bias, xattn.v_proj.bias]))
            theirs.out_proj.weight.copy_(xattn.out_proj.weight)
            theirs.out_proj.bias.copy_(xattn.out_proj.bias)
            # PyTorch's boundary: key_padding_mask is True at padding, the opposite of is_real
            want, want_w = theirs(query, memory, memory, key_padding_mask=~is_real, average_attn_weights=False)
        expect_close(weights, want_w, "the weights vs nn.MultiheadAttention's", atol=1e-5, rtol=1e-4)
        expect_close(out, want, "the output vs nn.MultiheadAttention's", atol=1e-5, rtol=1e-4)
