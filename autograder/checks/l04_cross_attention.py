"""Hidden checks of lesson 04-cross-attention: the cross-attention mask, then CrossAttention with reusable memory.

Expected outputs come from PyTorch: ``nn.MultiheadAttention`` (lesson 03's ``torch_mha_expected``: float64, eval,
weights copied by ``decoder_course.twins``, the mask inverted to PyTorch's polarity) for attention over a memory, and
``F.scaled_dot_product_attention`` (whose boolean mask has our polarity, True = may attend) for keys and values
handed in directly through ``memory_kv``. ``CachedCrossAttention`` (find the bug) is judged relative to the
student's ``CrossAttention`` and ``cross_attention_mask``: each call against ``nn.MultiheadAttention`` on that
call's memory, and the spy's record of the projections.
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checks import judges, spec
from autograder.checks import l03_multi_head as mha
from autograder.checks.framework import Case, Exercise, Fail, Result, exercise, expect_close
from autograder.reference import cross_attention as ref
from decoder_course.visible import l04_cross_attention as visible

LESSON = "04-cross-attention"
TOL = {"rtol": mha.RTOL, "atol": mha.ATOL}  # float32 student code against float64 PyTorch (lesson 03's)


# -- cross_attention_mask: a spec (decoder_course.visible.l04_cross_attention) ----------------------------------
spec.register(LESSON, visible.SPECS, ref)


# -- CrossAttention ----------------------------------------------------------------------------------------------
def _heads(x: torch.Tensor, H: int) -> torch.Tensor:
    """(B, L, D) -> (B, H, L, Dh) with PyTorch's own view and transpose."""
    B, L, D = x.shape
    return x.view(B, L, H, D // H).transpose(1, 2)


def _f64(a) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def _linear(state, name: str, x: torch.Tensor) -> torch.Tensor:
    """The course's projection ``name`` (q_proj, ...) of ``state`` applied to ``x``, in float64."""
    return F.linear(x, _f64(state[f"{name}.weight"]), _f64(state[f"{name}.bias"]))


def _projected_memory(state, H, memory) -> tuple[np.ndarray, np.ndarray]:
    """The memory's keys and values per head, computed with F.linear (float64): (B, H, S, Dh) each."""
    return tuple(_heads(_linear(state, name, _f64(memory)), H).numpy() for name in ("k_proj", "v_proj"))


def _attend_to_given_kv(state, H, query, k, v, allowed) -> tuple[np.ndarray, np.ndarray]:
    """Queries projected with q_proj attend to given per-head keys/values; PyTorch's SDPA (True = may attend).

    Shape:
        query: (B, T, D), k/v: (B, H, S, Dh), allowed: bool broadcastable to (B, H, T, S), no empty row
        -> out: (B, T, D), weights: (B, H, T, S)
    """
    k, v, q = _f64(k), _f64(v), _heads(_linear(state, "q_proj", _f64(query)), H)  # q: (B, H, T, Dh)
    mask = torch.from_numpy(np.asarray(allowed, dtype=bool))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, Dh); its mask: True = attend
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, -math.inf)
    weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
    B, _, T, _ = out.shape
    merged = out.transpose(1, 2).reshape(B, T, -1)  # (B, T, D)
    return _linear(state, "out_proj", merged).numpy(), weights.numpy()


# (kind, situation, B, T, S, H, Dh, memory padding: None for no mask, "padded", "empty row" (sequence 2 all padding) or
# "short row" (sequence 1 with 3 real tokens at most)); the kind says which calls the case makes and what it judges
_CROSS_ROWS = [
    ("memory", "forward(query, memory, allowed) with {sizes}, memory padding and one sequence whose memory is all "
     "padding", 3, 4, 6, 2, 3, "empty row"),
    ("given kv", "forward(query, memory_kv=(k, v), allowed) without a memory, {sizes}", 2, 5, 7, 3, 2, "padded"),
    ("reuse", "project_memory once, then forward(query, memory_kv=...) for all T={T} queries and for one query at a "
     "time, B={B}, S={S}, H={H}, Dh={Dh}", 2, 3, 5, 2, 4, "padded"),
    ("positional", "B={B}, H={H}, T={T}, S={S}, Dh={Dh}, no mask", 1, 3, 5, 1, 6, None),
    ("leak", "memory padding, {sizes}", 3, 2, 6, 4, 2, "short row"),
    ("both", "forward given both memory and memory_kv", 2, 3, 4, 2, 3, None),
    ("neither", "forward given neither memory nor memory_kv", 2, 3, 4, 2, 3, None),
]


@exercise(LESSON, "CrossAttention")
class CrossAttentionCheck(Exercise):
    # PyTorch's own multi-head attention, or its fused kernel, would do the exercise's work
    forbidden = ("nn.MultiheadAttention", "F.scaled_dot_product_attention", "F.multi_head_attention_forward")

    def cases(self, rng):
        cases = []
        for i, (kind, situation, B, T, S, H, Dh, padding) in enumerate(_CROSS_ROWS):
            D = H * Dh
            is_real = None if padding is None else judges.right_padded(rng, B, S, empty_row=2 if padding == "empty row"
                                                                       else None)  # (B, S)
            if padding == "short row":
                is_real[1, 3:] = False
            allowed = None if is_real is None else np.repeat(is_real[:, None, None, :], T, axis=2)  # (B, 1, T, S)
            state = mha.random_mha_state(rng, D)
            query, memory = (rng.normal(size=(B, L, D)).astype(np.float32) for L in (T, S))
            desc = situation.format(B=B, T=T, S=S, H=H, Dh=Dh, sizes=f"B={B}, T={T}, S={S}, H={H}, Dh={Dh}")
            case = Case(f"c{i}", desc, data={"kind": kind, "state": state, "H": H, "query": query, "memory": memory,
                                             "allowed": allowed})
            case.call("CrossAttention", D, H, let="m")
            case.load_state("m", state)
            case.eval("m")
            for name in ("query", "memory") + (() if allowed is None else ("allowed",)):
                case.let(name, case.tensor(case.data[name]))
            mask = {} if allowed is None else {"allowed": {"ref": "allowed"}}
            if kind in ("memory", "positional", "leak"):
                case.call({"ref": "m"}, {"ref": "query"}, {"ref": "memory"}, **mask, record="res")
            if kind == "memory":  # then project_memory on its own
                case.method("m", "project_memory", {"ref": "memory"}, record="kv")
                judges.record_after(case, ["query", "memory"])
            elif kind == "given kv":  # keys and values that come from no memory at all
                case.data.update(k=rng.normal(size=(B, H, S, Dh)).astype(np.float32),
                                 v=rng.normal(size=(B, H, S, Dh)).astype(np.float32))
                case.let("k", case.tensor(case.data["k"]))
                case.let("v", case.tensor(case.data["v"]))
                case.call({"ref": "m"}, {"ref": "query"}, memory_kv={"tuple": [{"ref": "k"}, {"ref": "v"}]}, **mask,
                          record="res")
                judges.record_after(case, ["k", "v"])
            elif kind == "reuse":  # project once, reuse for the whole query and for one decoding step at a time
                case.method("m", "project_memory", {"ref": "memory"}, let="kv")
                case.call({"ref": "m"}, {"ref": "query"}, memory_kv={"ref": "kv"}, **mask, record="res")
                for t in range(T):
                    case.call({"ref": "m"}, case.tensor(query[:, t:t + 1]), memory_kv={"ref": "kv"},
                              allowed=case.tensor(allowed[:, :, t:t + 1]), record=f"step{t}")  # (B, 1, D), (B, 1, 1, S)
                judges.record_after(case, ["memory"])
            elif kind == "leak":  # padded memory positions replaced by huge values in a second call
                memory2 = memory.copy()
                memory2[~is_real] = 100.0 * rng.normal(size=memory2[~is_real].shape)
                case.call({"ref": "m"}, {"ref": "query"}, case.tensor(memory2), **mask, record="res2")
            elif kind == "both":  # ambiguous: must be refused
                case.method("m", "project_memory", case.tensor(rng.normal(size=(B, S, D)).astype(np.float32)),
                            let="kv_other")
                case.call({"ref": "m"}, {"ref": "query"}, {"ref": "memory"}, memory_kv={"ref": "kv_other"},
                          record="res")
            elif kind == "neither":  # nothing to attend to: must be refused
                case.call({"ref": "m"}, {"ref": "query"}, record="res")
            cases.append(case)
        return cases

    def judge(self, result: Result):
        what = "CrossAttention"
        for case in result.cases.values():
            d, kind = case.data, case.data["kind"]
            if kind == "both":
                if result.error(case.id) is None:
                    raise Fail("given both memory and memory_kv, forward silently used one of them. The two could "
                               "disagree: raise a ValueError and ask for exactly one.")
                judges.value_error(result, case.id, "given both memory and memory_kv, which could disagree")
                continue
            if kind == "neither":
                judges.value_error(result, case.id, "given neither memory nor memory_kv, there is nothing to attend to")
                continue
            error = result.error(case.id)
            if kind == "given kv" and error is not None and "NotImplementedError" not in error:
                raise Fail(f"your code raised an exception on a case with {case.desc}:\n    {error.splitlines()[-1]}\n"
                           "When memory_kv is given, memory is None: take the keys and values from memory_kv (do not "
                           "project the memory again).")
            mha.raise_module_error(result, case.id)
            if kind == "given kv":
                self._judge_given_kv(result, case)
                continue
            out, _ = mha.judge_attention_output(result, case.id, "res", d["state"], d["H"], d["query"], d["memory"],
                                            d["memory"], d["allowed"], what, key_name="memory", value_name="memory")
            if kind == "memory":
                self._judge_project_memory(result, case)
                judges.unchanged(result, case.id, {"query": d["query"], "memory": d["memory"]}, what)
            elif kind == "reuse":
                for t in range(d["query"].shape[1]):
                    mha.get_pair(result, case.id, f"step{t}", what)
                    step = result.get(case.id, f"step{t}/0", what=f"the output of decoding step {t}", kind="tensor",
                                      dtype="float")
                    if step.shape != (out.shape[0], 1, out.shape[2]):
                        raise Fail(f"with one query (T=1) the output should have shape (B, 1, D), got {step.shape} "
                                   f"({case.desc}).")
                    if not np.allclose(step[:, 0], out[:, t], **TOL):
                        raise Fail(f"decoding step {t} alone (one query, the same memory_kv) differs from row {t} of "
                                   f"the full pass ({case.desc}): each query's output may depend only on that query "
                                   "and the memory.")
                judges.unchanged(result, case.id, {"memory": d["memory"]}, what)
            elif kind == "leak":
                mha.get_pair(result, case.id, "res2", what)
                out2 = result.get(case.id, "res2/0", what="the output of the second call", kind="tensor",
                                  shape=out.shape)
                judges.leak(out, out2, f"the output changed when only padded memory positions changed ({case.desc}): "
                            "memory padding leaks into the output. Is `allowed` passed on to attention?",
                            atol=TOL["atol"])

    def _judge_project_memory(self, result: Result, case: Case) -> None:
        d = case.data
        (B, S, D), H = d["memory"].shape, d["H"]
        meta = result.meta(case.id, "kv")
        if meta.get("type") not in ("tuple", "list") or meta.get("len") != 2:
            raise Fail(f"project_memory should return a pair `(k, v)`, got `{meta.get('type')}` ({case.desc}).")
        want_k, want_v = _projected_memory(d["state"], H, d["memory"])
        for index, (name, want, proj) in enumerate([("k", want_k, "k_proj"), ("v", want_v, "v_proj")]):
            got = result.get(case.id, f"kv/{index}", what=f"the {name} of project_memory", kind="tensor", dtype="float")
            if got.shape != (B, H, S, D // H):
                hint = ": split the heads and put them before S" if got.shape in ((B, S, D), (B, S, H, D // H)) else ""
                raise Fail(f"project_memory's {name} should have shape (B, H, S, Dh) = {(B, H, S, D // H)}, got "
                           f"{got.shape} ({case.desc}){hint}.")
            expect_close(got.astype(np.float64), want, f"project_memory's {name}", case.desc, **TOL,
                         hint=f"{name} is the memory through {proj}, split into heads (B, H, S, Dh).")

    def _judge_given_kv(self, result: Result, case: Case) -> None:
        d = case.data
        B, T, D = d["query"].shape
        H, S = d["H"], d["k"].shape[2]
        mha.get_pair(result, case.id, "res", "CrossAttention")
        out = result.get(case.id, "res/0", what="the output of CrossAttention", kind="tensor", dtype="float")
        weights = result.get(case.id, "res/1", what="the weights of CrossAttention", kind="tensor", dtype="float")
        if out.shape != (B, T, D) or weights.shape != (B, H, T, S):
            raise Fail(f"with memory_kv the output should be (B, T, D) = {(B, T, D)} and the weights (B, H, T, S) = "
                       f"{(B, H, T, S)}; got {out.shape} and {weights.shape} ({case.desc}).")
        want_out, want_w = _attend_to_given_kv(d["state"], H, d["query"], d["k"], d["v"], d["allowed"])
        expect_close(weights.astype(np.float64), want_w, "the weight tensor of CrossAttention", case.desc, **TOL,
                     hint="With memory_kv = (k, v) the keys are k exactly as given (already projected and split into "
                          "heads): only the query goes through q_proj.")
        expect_close(out.astype(np.float64), want_out, "the output of CrossAttention", case.desc, **TOL,
                     hint="With memory_kv = (k, v) the values are v exactly as given: average them with the weights, "
                          "merge the heads, then out_proj.")
        judges.unchanged(result, case.id, {"k": d["k"], "v": d["v"]}, "CrossAttention")


# -- CachedCrossAttention: find the bug (autograder.bugs), judged relative to the student's blocks --------------
def _calls(result: Result, case_id: str, label: str) -> int:
    """How many calls of the student's ``label`` (``CrossAttention.project_memory``, ...) the spy recorded."""
    meta = result.report_cases.get(case_id, {}).get("outputs", {})
    pattern = re.compile(rf"~{re.escape(label)}/(\d+)/args")
    return len({m[1] for key in (meta if isinstance(meta, dict) else ()) if (m := pattern.fullmatch(key))})


def _memory_handed_to_forward(result: Result, case_id: str) -> bool:
    """Whether a recorded ``forward`` call was handed a memory to project rather than ``memory_kv``."""
    meta = result.report_cases.get(case_id, {}).get("outputs", {})
    return any(re.fullmatch(r"~CrossAttention\.forward/\d+/(args/1|kwargs/memory)", key) and
               isinstance(info, dict) and info.get("type") not in (None, "None")
               for key, info in (meta.items() if isinstance(meta, dict) else ()))


@exercise(LESSON, "CachedCrossAttention")
class CachedCrossAttentionCheck(Exercise):
    """The given wrapper keeps one memory's keys and values for a decoding loop; the shown bug projects the first
    memory only, so every later batch reads it. Each call is judged by CrossAttention's own output check on that
    call's memory, after a check that names the stale memory, and the projections are counted (once per new
    memory, never at a step whose memory did not change)."""

    # built on the student's own project_memory / forward and cross_attention_mask: their mistakes cost their cells
    uses = ("CrossAttention", "cross_attention_mask")
    reference = ref

    def _case(self, rng, cid, desc, H, Dh, batches, plan):
        """``batches``: (B, S, lengths) per memory; ``plan``: (batch index, T) per call, in order."""
        D = H * Dh
        state = mha.random_mha_state(rng, D)
        memories = [rng.normal(size=(B, S, D)).astype(np.float32) for B, S, _ in batches]
        is_real = [np.arange(S)[None, :] < np.asarray(lengths)[:, None] for _, S, lengths in batches]  # (B, S)
        queries = [rng.normal(size=(batches[i][0], T, D)).astype(np.float32) for i, T in plan]
        case = Case(cid, desc, data={"state": state, "H": H, "memories": memories, "is_real": is_real,
                                     "queries": queries, "plan": plan})
        case.call("CrossAttention", D, H, let="m")
        case.load_state("m", state)
        case.eval("m")
        case.call("CachedCrossAttention", {"ref": "m"}, let="cached")
        for i, (memory, real) in enumerate(zip(memories, is_real, strict=True)):
            case.let(f"memory{i}", case.tensor(memory))  # one tensor per batch, passed again at every step
            case.let(f"is_real{i}", case.tensor(real))
        for step, ((i, _), query) in enumerate(zip(plan, queries, strict=True)):
            case.call({"ref": "cached"}, case.tensor(query), {"ref": f"memory{i}"}, {"ref": f"is_real{i}"},
                      record=f"step{step}")
        judges.record_after(case, [f"memory{i}" for i in range(len(memories))])
        return case

    def cases(self, rng):
        S = int(rng.choice([5, 6]))
        same = [(2, S, [S, 3]), (2, S, [2, S])]  # two batches of the same shape, padded differently
        return [
            self._case(rng, "batches", f"two batches of the same shape (B=2, S={S}), three decoding steps (T=1) on "
                       "the first, then two on the second; H=2, Dh=3", 2, 3, same,
                       [(0, 1), (0, 1), (0, 1), (1, 1), (1, 1)]),
            self._case(rng, "back", f"the first batch (T=3 queries), another (B=2, S={S}), then the first again; "
                       "H=3, Dh=2", 3, 2, same, [(0, 3), (1, 3), (0, 2)]),
            self._case(rng, "shapes", "batches of different shapes (B=2, S=5, then B=3, S=4), two steps each; H=2, "
                       "Dh=2", 2, 2, [(2, 5, [5, 2]), (3, 4, [4, 1, 3])], [(0, 1), (0, 1), (1, 1), (1, 1)]),
        ]

    def judge(self, result: Result):
        what = "CachedCrossAttention"
        for case in result.cases.values():
            mha.raise_module_error(result, case.id)
            d = case.data
            H, plan, memories, is_real = d["H"], d["plan"], d["memories"], d["is_real"]
            new = [step == 0 or plan[step][0] != plan[step - 1][0] for step in range(len(plan))]  # memory changed
            for step, ((i, T), query) in enumerate(zip(plan, d["queries"], strict=True)):
                mha.get_pair(result, case.id, f"step{step}", what)
                B, S, D = memories[i].shape
                out = result.get(case.id, f"step{step}/0", what=f"the output of call {step}", kind="tensor",
                                 dtype="float", shape=(B, T, D))
                allowed = is_real[i][:, None, None, :]  # (B, 1, 1, S)
                if step and new[step] and memories[plan[step - 1][0]].shape == memories[i].shape:
                    previous = memories[plan[step - 1][0]]
                    stale, _ = mha.torch_mha_expected(d["state"], H, query, previous, previous, allowed)
                    if np.allclose(out, stale, **TOL):
                        raise Fail(f"call {step} of {what} attends to the memory of the previous calls, not to the "
                                   f"one it was given ({case.desc}): the keys and values of one batch are reused for "
                                   "the next. They belong to the memory they came from: a call with another memory "
                                   "must project that memory.")
                mha.judge_attention_output(result, case.id, f"step{step}", d["state"], H, query, memories[i],
                                           memories[i], allowed, f"call {step} of {what}", key_name="memory",
                                           value_name="memory")
            if _memory_handed_to_forward(result, case.id):
                raise Fail(f"{what} hands xattn the memory to project at every call ({case.desc}): the point of the "
                           "wrapper is to project each memory once and hand the later calls its keys and values "
                           "(memory_kv).")
            projected, wanted = _calls(result, case.id, "CrossAttention.project_memory"), sum(new)
            if projected != wanted:
                raise Fail(f"{what} projected a memory {projected} times in {len(plan)} calls, where the memory "
                           f"changed {wanted} times ({case.desc}): project each new memory once, and let the calls "
                           "that pass the same memory again reuse its keys and values.")
            judges.unchanged(result, case.id, {f"memory{i}": m for i, m in enumerate(memories)}, what)
