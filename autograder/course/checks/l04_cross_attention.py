"""Hidden checks of lesson 04-cross-attention: the mask and CrossAttention are specs; CachedCrossAttention.

``cross_attention_mask`` and ``CrossAttention`` (with its ``project_memory``) are rows of
``decoder_course/visible/l04_cross_attention.py``. ``CachedCrossAttention`` (find the bug) is judged relative to the
student's ``CrossAttention`` and ``cross_attention_mask``: each call against ``nn.MultiheadAttention`` on that
call's memory (CrossAttention's spec: its twin, contract and known wrong twins), and the spy's record of the
projections.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from autograder.course.checks import judges, spec
from autograder.course.checks.exercises import exercise
from autograder.course.checks.framework import Case, Exercise, Fail, Result, expect_close
from autograder.course.reference import cross_attention as ref
from decoder_course.spec import Build, Keyword, agrees, compared, expected, hint_for, judge_items, what_of
from decoder_course.visible import l04_cross_attention as visible

LESSON = "04-cross-attention"


# -- CachedCrossAttention: find the bug (autograder.course.bugs), judged relative to the student's blocks --------------
# each call judged as CrossAttention's forward on that call's memory and mask (its spec: contract, twin, hints)
_CALL = dataclasses.replace(visible.SPECS["CrossAttention"], name="CachedCrossAttention")
_CALL_TOL = (_CALL.rtol, _CALL.atol)


def _call_row(d: dict, query: np.ndarray, memory: int, mask: int) -> Build:
    """One call as a row of CrossAttention's spec: ``query`` attending to memory ``memory`` with ``mask``'s padding."""
    D = query.shape[-1]
    return Build("", {"d_model": D, "n_heads": d["H"]}, {"query": query, "memory": d["memories"][memory],
                                                         "allowed": Keyword(d["is_real"][mask][:, None, None, :])},
                 state=d["state"])


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
        state = visible.mha.random_mha_state(rng, D)
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
            result.raise_if_error(case.id)
            d = case.data
            plan, memories = d["plan"], d["memories"]
            new = [step == 0 or plan[step][0] != plan[step - 1][0] for step in range(len(plan))]  # memory changed
            for step, ((i, _), query) in enumerate(zip(plan, d["queries"], strict=True)):
                got = spec._recorded_items(result, case, _CALL, what, f"step{step}", kind="tensor")
                desc = f"call {step} of {case.desc}"
                if step and new[step] and memories[plan[step - 1][0]].shape == memories[i].shape:
                    stale = expected(_CALL, _call_row(d, query, plan[step - 1][0], i))[0]
                    if agrees(got[0], stale, *_CALL_TOL):
                        raise Fail(f"call {step} of {what} attends to the memory of the previous calls, not to the "
                                   f"one it was given ({case.desc}): the keys and values of one batch are reused for "
                                   "the next. They belong to the memory they came from: a call with another memory "
                                   "must project that memory.")
                row = _call_row(d, query, i, i)
                with spec.shared():
                    judge_items(_CALL, row, got, desc)
                want = expected(_CALL, row)
                for n in compared(_CALL):
                    expect_close(got[n], want[n], what_of(_CALL, n), desc, hint=hint_for(_CALL, n), rtol=_CALL_TOL[0],
                                 atol=_CALL_TOL[1])
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
