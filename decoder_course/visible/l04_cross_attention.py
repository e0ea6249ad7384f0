"""Visible checks of lesson 04-cross-attention: the cross-attention mask, and CrossAttention's reusable memory.

``cross_attention_mask`` and ``CrossAttention`` are specs (:mod:`decoder_course.spec`), whose rows drive the hidden
checks too: one identical row per query with no causal part; CrossAttention compared with ``nn.MultiheadAttention``
holding the same weights (lesson 03's twin, the memory as key and value, or ``memory_kv``'s heads merged back behind
identity projections), memory padding never leaking, ``project_memory``'s keys and values, forward refusing both
``memory`` and ``memory_kv`` or neither. The find-the-bug wrapper ``CachedCrossAttention`` runs on a stand-in
``CrossAttention`` whose answers are PyTorch's: a decoding loop over two batches, each call compared with PyTorch's
answer for its memory, the projections counted.
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
    expect_inputs_unchanged,
    expect_shape,
    expect_type,
    randomised,
)
from decoder_course.spec import Build, Keyword, ModuleSpec, Perturbed, Spec, refuse_forbidden, run, run_module
from decoder_course.visible import l03_multi_head as mha


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


# -- CrossAttention: a module spec, MultiHeadAttention's twin with the memory as key and value ------------------
def _heads(x, H: int):
    """(B, L, D) -> (B, H, L, Dh), a NumPy array or a torch tensor."""
    B, L, D = x.shape
    return x.reshape(B, L, H, D // H).swapaxes(1, 2)  # (B, L, D) -> (B, H, L, Dh)


def _xattn_row(rng, situation: str, B: int, T: int, S: int, H: int, Dh: int, mask: str | None, kv: bool = False,
               **more) -> Build:
    """One situation: the memory, or (``kv``) keys and values per head that come from no memory at all; ``more``:
    Build's (a method, a refused call, a probe, a gradient)."""
    D = H * Dh
    allowed = mha.mha_mask(rng, mask, B, T, S, H)
    query, memory = (rng.normal(size=(B, n, D)).astype(np.float32) for n in (T, S))
    given = {"memory_kv": tuple(_heads(rng.normal(size=(B, S, D)).astype(np.float32), H) for _ in "kv")}
    inputs = {"query": query} | ({"memory_kv": Keyword(given["memory_kv"])} if kv else {"memory": memory})
    inputs |= {} if allowed is None else {"allowed": Keyword(allowed)}
    if more.pop("probe", False):  # the padded memory positions replaced by huge ones: no output may move
        is_real = np.broadcast_to(allowed, (B, 1, T, S))[:, 0, 0]  # (B, S)
        memory2 = memory.copy()
        memory2[~is_real] = 100.0 * rng.normal(size=memory2[~is_real].shape)
        more["perturbed"] = Perturbed(inputs | {"memory": memory2}, lambda out: out,
                                      "the output changed when only padded memory positions changed: memory padding "
                                      "leaks into the output. Is `allowed` passed on to attention?")
    if more.get("method"):
        inputs = {"memory": memory}
    elif more.get("refuses"):
        inputs = {"query": query} | ({"memory": memory, "memory_kv": Keyword(given["memory_kv"])}
                                     if "both" in situation else {})
    return Build(situation.format(B=B, T=T, S=S, H=H, Dh=Dh), {"d_model": D, "n_heads": H}, inputs,
                 state=mha.random_mha_state(rng, D), **more)


def _xattn_rows(rng: np.random.Generator) -> list[Build]:
    return [
        _xattn_row(rng, "forward(query, memory, allowed), B={B}, T={T}, S={S}, H={H}, Dh={Dh}, memory padding, one "
                   "query with no key and one sequence whose memory is all padding, with a backward pass", 3, 4, 6,
                   2, 3, "empty rows", grad=True),
        _xattn_row(rng, "forward(query, memory_kv=(k, v), allowed) without a memory, B={B}, T={T}, S={S}, H={H}, "
                   "Dh={Dh}", 2, 5, 7, 3, 2, "key padding", kv=True),
        _xattn_row(rng, "one decoding step, forward(query, memory_kv=(k, v), allowed) with T={T}, B={B}, S={S}, "
                   "H={H}, Dh={Dh}", 2, 1, 5, 2, 4, "key padding", kv=True),
        _xattn_row(rng, "B={B}, H={H}, T={T}, S={S}, Dh={Dh}, no mask", 1, 3, 5, 1, 6, None),
        _xattn_row(rng, "memory padding, B={B}, T={T}, S={S}, H={H}, Dh={Dh}, the padded memory changed", 3, 2, 6, 4,
                   2, "key padding", probe=True),
        _xattn_row(rng, "project_memory(memory), B={B}, S={S}, H={H}, Dh={Dh}", 2, 3, 5, 2, 4, None,
                   method="project_memory"),
        _xattn_row(rng, "forward given both memory and memory_kv", 2, 3, 4, 2, 3, None,
                   refuses="forward was given both memory and memory_kv, which could disagree: it needs exactly one"),
        _xattn_row(rng, "forward given neither memory nor memory_kv", 2, 3, 4, 2, 3, None,
                   refuses="forward was given neither memory nor memory_kv: there is nothing to attend to"),
    ]


def _as_mha(state: dict, inputs: dict) -> tuple[dict, dict]:
    """CrossAttention's call as MultiHeadAttention's: the memory as key and value, or memory_kv's heads merged back
    side by side (B, H, S, Dh) -> (B, S, D) behind identity k_proj and v_proj."""
    mask = {"allowed": inputs["allowed"]} if "allowed" in inputs else {}
    if "memory_kv" not in inputs:
        return state, {"query": inputs["query"], "key": inputs["memory"], "value": inputs["memory"]} | mask
    k, v = (torch.as_tensor(x) for x in inputs["memory_kv"])  # (B, H, S, Dh) each
    B, H, S, Dh = k.shape
    k, v = (x.transpose(1, 2).reshape(B, S, H * Dh) for x in (k, v))  # (B, S, D)
    same = {"weight": torch.eye(H * Dh), "bias": torch.zeros(H * Dh)}
    return (state | {f"{p}.{w}": same[w] for p in ("k_proj", "v_proj") for w in same},
            {"query": inputs["query"], "key": k, "value": v} | mask)


def _xattn_twin(init: dict, state: dict, inputs: dict, train: bool) -> tuple:
    return mha.mha_twin(init, *_as_mha(state, inputs), train)


def _xattn_variants(init: dict, state: dict, inputs: dict, train: bool) -> dict:
    return mha.mha_variants(init, *_as_mha(state, inputs), train)


def _memory_kv_twin(init: dict, state: dict, inputs: dict, train: bool) -> tuple:
    """The memory through k_proj and v_proj (PyTorch's F.linear), split into heads."""
    return tuple(_heads(F.linear(inputs["memory"], state[f"{p}.weight"], state[f"{p}.bias"]), init["n_heads"])
                 for p in ("k_proj", "v_proj"))


def _S(a: dict) -> int:
    return a["memory"].shape[1] if "memory" in a else a["memory_kv"][0].shape[2]


def _kv_shape(a: dict) -> tuple:
    (B, S, D), H = a["memory"].shape, a["n_heads"]
    return (B, H, S, D // H), (B, H, S, D // H)


def _kv_shape_hint(a: dict, shape: tuple) -> str:
    (B, S, D), H = a["memory"].shape, a["n_heads"]
    return "Split the heads and put them before S." if shape in ((B, S, D), (B, S, H, D // H)) else ""


def _xattn_error(args: dict, error: str) -> str:
    if "memory_kv" in args and "memory" not in args:
        return ("When memory_kv is given, memory is None: take the keys and values from memory_kv (do not project "
                "the memory again).")
    return mha.mha_error(args, error)


_PROJECT_MEMORY = ModuleSpec(
    "CrossAttention.project_memory", None, _memory_kv_twin, names=mha.MHA_NAMES, dtype=lambda a: a["memory"].dtype,
    shape=_kv_shape, outputs=("k", "v"), axes=("B, H, S, Dh", "B, H, S, Dh"), shape_hint=(_kv_shape_hint,) * 2,
    hint={"k": "k is the memory through k_proj, split into heads (B, H, S, Dh).",
          "v": "v is the memory through v_proj, split into heads (B, H, S, Dh)."})

SPECS["CrossAttention"] = ModuleSpec(
    "CrossAttention", _xattn_rows, _xattn_twin, names=mha.MHA_NAMES, dtype=lambda a: a["query"].dtype,
    shape=lambda a: ((*a["query"].shape,), (a["query"].shape[0], a["n_heads"], a["query"].shape[1], _S(a))),
    outputs=("out", "weights"), order=("weights", "out"), axes=("B, T, D", "B, H, T, S"),
    properties=mha.mha_properties, variants=_xattn_variants, on_error=_xattn_error,
    forbidden=("nn.MultiheadAttention", "F.scaled_dot_product_attention", "F.multi_head_attention_forward"),
    methods={"project_memory": _PROJECT_MEMORY},
    hint={"weights": "The weights are softmax(q·k / √Dh) per head, Dh = D // H, q from the query through q_proj and "
                     "k from the memory through k_proj (or memory_kv's k exactly as given: already projected and "
                     "split into heads), split into heads before the product.",
          "out": "The weights are right, so look after them: the values (the memory through v_proj, or memory_kv's v "
                 "as given), merging the heads back side by side (B, H, T, Dh) -> (B, T, D), then out_proj."})


def check_cross_attention(CrossAttention) -> None:  # noqa: N803 - the class under test
    """The spec's rows: nn.MultiheadAttention with the same weights, given the memory or keys and values per head
    (memory_kv), one decoding step, the padded memory not leaking, project_memory's keys and values, and forward
    refusing both memory and memory_kv, or neither; last, written without PyTorch's attention (what the grader
    enforces), watched while it runs."""
    run_module(SPECS["CrossAttention"], CrossAttention)

    def in_every_mode() -> None:
        D, H, B, T, S = 8, 2, 2, 3, 5
        g = torch.Generator().manual_seed(4)
        query, memory = torch.randn(B, T, D, generator=g), torch.randn(B, S, D, generator=g)
        attend = CrossAttention(D, H, dropout=0.1)
        padding = torch.ones(B, 1, 1, S, dtype=torch.bool)
        padding[0, ..., -1] = False  # (B, 1, 1, S): the last key of sequence 0 is padding
        with torch.no_grad():
            for training, allowed in ((True, padding), (False, padding), (False, None)):
                attend.train(training)(query, memory=memory, allowed=allowed)
                attend(query, memory_kv=attend.project_memory(memory), allowed=allowed)

    refuse_forbidden(SPECS["CrossAttention"], in_every_mode)


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
