"""Visible checks of lesson 04-cross-attention: the cross-attention mask, and CrossAttention's reusable memory.

Properties any correct answer has: one identical row per query with no causal part, memory padding never leaks,
``forward(query, memory_kv=project_memory(memory))`` equals ``forward(query, memory)`` without projecting the memory
again, the output follows the ``memory_kv`` it is given, one decoding step at a time equals the full pass, and
agreement with ``nn.MultiheadAttention`` (whose ``key_padding_mask`` is True at padding: the opposite polarity).
The find-the-bug wrapper ``CachedCrossAttention`` runs on a stand-in ``CrossAttention`` whose answers are PyTorch's:
a decoding loop over two batches, each call compared with PyTorch's answer for its memory, the projections counted.
"""

from __future__ import annotations

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
    expect_finite,
    expect_inputs_unchanged,
    expect_rows_sum_to_one,
    expect_shape,
    expect_type,
    expect_value_error,
    padding_leakage_probe,
    randomised,
)
from decoder_course.spec import Spec, run


def _mask_rows(rng: np.random.Generator) -> list:
    """T < S, T > S, one decoding step (T = 1), a sequence whose memory is all padding, scattered padding."""
    rows = []
    for B, S, T, kind in [(3, 6, 4, "right"), (2, 3, 7, "empty"), (1, 5, 1, "right"),
                          (4, 8, int(rng.integers(2, 6)), "scattered")]:
        if kind == "scattered":
            is_real = rng.random((B, S)) < 0.6
        else:  # real tokens first, then padding
            is_real = np.arange(S)[None, :] < rng.integers(1, S + 1, size=(B, 1))
            if kind == "empty":
                is_real[1] = False
        is_real[0] = True
        situation = f"B={B}, S={S}, T={T}" + (", one sequence whose memory is all padding" if kind == "empty" else "")
        rows.append((situation, {"memory_is_real": torch.from_numpy(is_real), "T": T}))
    return rows


def _mask_properties(args: dict, got: np.ndarray, desc: str) -> None:
    """Not PyTorch's polarity (True at the padding), and no causal part."""
    rows = np.broadcast_to(args["memory_is_real"][:, None, None, :], got.shape)  # (B, 1, T, S)
    if np.array_equal(got, ~rows):
        raise CheckFailed(f"your mask is True exactly at the padding ({desc}): that is PyTorch's key_padding_mask "
                          "polarity. Here True means the query may attend to this key")
    T, S = got.shape[-2:]
    if not np.array_equal(got, rows) and np.array_equal(got, rows & np.tri(T, S, dtype=bool)):
        raise CheckFailed(f"your mask hides later memory positions from early queries ({desc}): cross-attention "
                          "has no causal part, the whole source is known before decoding starts")


def _broadcast_only(args: dict, shape: tuple) -> str:
    B, S = args["memory_is_real"].shape
    return ("It broadcasts, but the contract is one row per query, (B, 1, T, S): that is what T is for (repeat "
            "the row T times)." if shape == (B, 1, 1, S) else "")


SPECS = {
    "cross_attention_mask": Spec(
        "cross_attention_mask", _mask_rows, dtype=lambda a: np.bool_,
        shape=lambda a: (a["memory_is_real"].shape[0], 1, a["T"], a["memory_is_real"].shape[1]),
        axes="B, 1, T, S", shape_hint=_broadcast_only, properties=_mask_properties, fresh=True,
        hint="Every query may attend to every real memory token and to no padding: each of the T rows of "
             "sequence b is memory_is_real[b]."),
}


def check_cross_attention_mask(cross_attention_mask) -> None:
    """The spec's cases (polarity, no causal part, a new tensor, T > S and T = 1), then the worked example."""
    run(SPECS["cross_attention_mask"], cross_attention_mask)
    memory_is_real = torch.tensor([[True, True, True, False], [True, True, False, False]])  # (B, S)
    with check("cross_attention_mask on the worked example (B=2, S=4, T=3)"):
        got = expect_inputs_unchanged(cross_attention_mask, memory_is_real, 3)
        expect_type(got, torch.Tensor, "cross_attention_mask(memory_is_real, 3)")
        expect_shape(got, (2, 1, 3, 4), "cross_attention_mask(memory_is_real, 3)", names="B, 1, T, S")
        expect_dtype(got, "bool", "cross_attention_mask(...)")
        _mask_properties({"memory_is_real": memory_is_real.numpy()}, got.numpy(), "B=2, S=4, T=3")
        want = torch.tensor([[[[True, True, True, False]] * 3], [[[True, True, False, False]] * 3]])  # (B, 1, T, S)
        expect_close(got, want, "cross_attention_mask(memory_is_real, 3)",
                     hint="each of the T rows of sequence b is memory_is_real[b]")


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
    xattn = randomised(CrossAttention(D, H), seed=6).eval()  # biases far from 0, so a missing one shows

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
        for call, what in [(lambda: xattn(query, memory, memory_kv=kv), "both memory and memory_kv"),
                           (lambda: xattn(query), "neither memory nor memory_kv")]:
            expect_value_error(call, "forward needs exactly one of memory and memory_kv (two could disagree; none "
                                     f"leaves nothing to attend to) and was given {what}")

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
        theirs = twins.torch_twin(xattn.state_dict(), "attention", H)  # nn.MultiheadAttention, the same weights
        with torch.no_grad():
            # PyTorch's boundary: key_padding_mask is True at padding, the opposite of is_real
            want, want_w = theirs(query, memory, memory, key_padding_mask=~is_real, average_attn_weights=False)
        expect_close(weights, want_w, "the weights vs nn.MultiheadAttention's", atol=1e-5, rtol=1e-4)
        expect_close(out, want, "the output vs nn.MultiheadAttention's", atol=1e-5, rtol=1e-4)


class _TorchCrossAttention(nn.Module):
    """A stand-in for a CrossAttention whose answers are PyTorch's (an ``nn.MultiheadAttention``'s weights, applied
    with ``F.linear`` and ``F.scaled_dot_product_attention``), which notes every memory it projects."""

    def __init__(self, D: int, H: int, seed: int):
        super().__init__()
        self.H, self.torch_mha = H, randomised(nn.MultiheadAttention(D, H, batch_first=True), seed).eval()
        self.w = twins.from_torch(self.torch_mha.state_dict(), "attention")  # in_proj split into q, k, v_proj
        self.projected: list[int] = []  # the batch size of every memory projected
        self.project_memory = self._project  # what the code under test calls: PyTorch's weights, split into heads

    def _heads(self, x: torch.Tensor, proj: str) -> torch.Tensor:
        B, L, D = x.shape
        return F.linear(x, self.w[f"{proj}.weight"], self.w[f"{proj}.bias"]).view(B, L, self.H, -1).transpose(1, 2)

    def _project(self, memory):
        self.projected.append(memory.shape[0])
        with torch.no_grad():
            return self._heads(memory, "k_proj"), self._heads(memory, "v_proj")  # (B, H, S, Dh) each

    def forward(self, query, memory=None, allowed=None, memory_kv=None):
        if (memory is None) == (memory_kv is None):
            raise ValueError("pass exactly one of memory or memory_kv")
        k, v = self.project_memory(memory) if memory_kv is None else memory_kv  # (B, H, S, Dh) each
        with torch.no_grad():
            q = self._heads(query, "q_proj")  # (B, H, T, Dh)
            B, _, T, Dh = q.shape
            full = torch.ones(T, k.shape[2], dtype=torch.bool) if allowed is None else allowed
            full = torch.broadcast_to(full, (B, self.H, T, k.shape[2]))  # (B, H, T, S); no empty row here
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=full)  # its mask: True = may attend, as ours
            scores = (q @ k.transpose(-2, -1) / Dh ** 0.5).masked_fill(~full, float("-inf"))
            merged = out.transpose(1, 2).reshape(B, T, -1)  # (B, T, D)
            return self.torch_mha.out_proj(merged), torch.softmax(scores, dim=-1)


def check_cached_cross_attention(CachedCrossAttention) -> None:
    """Find the bug: a decoding loop over two batches, every call against PyTorch, and the projections counted."""
    D, H, S = 8, 2, 5
    xattn = _TorchCrossAttention(D, H, seed=7)  # a stand-in whose answers are PyTorch's: only the given code is tested
    g = torch.Generator().manual_seed(8)
    batches = [(torch.randn(2, S, D, generator=g), torch.tensor([[True] * S, [True] * 3 + [False] * 2])),
               (torch.randn(2, S, D, generator=g), torch.tensor([[True] * 2 + [False] * 3, [True] * S]))]
    plan = [0, 0, 0, 1, 1, 0]  # the batch each call reads: three steps, two steps of the next batch, the first again
    later = "\n    (This code calls your cross_attention_mask: if its check above fails, fix that first.)"

    def theirs(query, b, padding_of=None):
        """PyTorch's answer for batch b's memory (with the padding of batch ``padding_of``, default b's)."""
        memory, is_real = batches[b][0], batches[b if padding_of is None else padding_of][1]
        with torch.no_grad():  # PyTorch's boundary: key_padding_mask is True at padding
            return xattn.torch_mha(query, memory, memory, key_padding_mask=~is_real)[0]

    with check("a decoding loop over two batches of the same shape: every call reads the memory it is given"):
        cached = CachedCrossAttention(xattn)
        for step, b in enumerate(plan):
            query = torch.randn(2, 1, D, generator=g)  # (B, 1, D): one decoding step
            memory, is_real = batches[b]
            out, weights = _pair(expect_inputs_unchanged(cached, query, memory, is_real), f"call {step}")
            expect_shape(out, (2, 1, D), f"the output of call {step}", names="B, T, D")
            expect_shape(weights, (2, H, 1, S), f"the weights of call {step}", names="B, H, T, S")
            if not torch.allclose(out, theirs(query, b), atol=1e-5):
                other = [c for c in range(2) if c != b and torch.allclose(out, theirs(query, c, b), atol=1e-5)]
                raise CheckFailed(
                    f"call {step} was given batch {b}'s memory, but "
                    + (f"its output is what batch {other[0]}'s memory gives: keys and values projected from an "
                       "earlier memory were used for another one" if other else "its output differs from "
                       "PyTorch's for that memory")
                    + f". The calls read batches {plan}: which memory were the keys and values of call {step} "
                    "projected from?" + later)

    with check("each memory is projected once: at its first call, not again at the steps that follow"):
        changes = sum(1 for i, b in enumerate(plan) if i == 0 or b != plan[i - 1])
        if len(xattn.projected) != changes:
            raise CheckFailed(f"project_memory ran {len(xattn.projected)} times over {len(plan)} calls on batches "
                              f"{plan}, where the memory changed {changes} times: project a memory when it changes, "
                              "and let the calls that pass the same memory again reuse its keys and values")
