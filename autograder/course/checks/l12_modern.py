"""Hidden checks of lesson 12-modern (PyTorch): RMSNorm, RoPE, SwiGLU, grouped-query attention, the sliding
window, the modern block and the MHA-to-GQA conversion.

- ``RMSNorm``, ``rotary_embedding``, ``SwiGLUFeedForward``, ``GroupedQueryAttention``, ``sliding_window_mask`` and
  ``ModernBlock`` are specs (``decoder_course/visible/l12_modern.py``): the same rows as the visible checks on
  secret draws; the modules against PyTorch's own functions with the same weights (``nn.RMSNorm``, ``F.silu``,
  SDPA with ``enable_gqa=True``), their cached calls against the full forward, RoPE and the window by their
  properties and the reference's values; each item's mutants name the mistake the student's values match;
- ``mha_to_gqa`` (find the bug): pooled weights against the consecutive groups' means, the converted module's
  output against SDPA, judged relative to the student's ``GroupedQueryAttention``.
"""

from __future__ import annotations

import numpy as np
import torch

from autograder.course.checks import spec
from autograder.course.checks.exercises import exercise
from autograder.course.checks.framework import Case, Exercise, Fail, Result, expect_close
from autograder.course.checks.judges import unchanged
from autograder.course.reference import modern as ref
from decoder_course.visible import l12_modern as visible

LESSON = "12-modern"


def _load_error(result: Result, case: Case, names: str) -> None:
    error = result.error(case.id)
    if error is not None and "state_dict" in error:
        raise Fail(f"the weights could not be loaded into your module ({case.desc}):\n    "
                   f"{error.splitlines()[-1]}\nThe names are part of the contract: {names}")


# -- mha_to_gqa: find the bug (autograder.course.bugs), judged relative to the student's GroupedQueryAttention ---------
def _pooled(w: np.ndarray, H: int, Hkv: int) -> np.ndarray:
    """k_proj/v_proj (H·Dh, D) pooled into Hkv heads: kv head j the mean of the consecutive heads j·g .. j·g + g - 1."""
    D = w.shape[-1]
    return w.reshape(Hkv, H // Hkv, w.shape[0] // H, D).mean(1).reshape(-1, D)  # (Hkv, g, Dh, D) -> (Hkv·Dh, D)


def _converted(wrong, state: dict, H: int, Hkv: int) -> list:
    """What a conversion (a known mistake, here on the trusted side) makes of mha: its k_proj and v_proj weights."""
    mha = ref.GroupedQueryAttention(state["q_proj.weight"].shape[0], H, H)
    mha.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    gqa = wrong(mha, H, Hkv)
    return [gqa.k_proj.weight.detach(), gqa.v_proj.weight.detach()]


def _attend(state: dict, H: int, Hkv: int, d: dict) -> np.ndarray:
    """PyTorch's grouped-query attention over ``state`` on the case's x, positions and causal mask."""
    t = {k: torch.from_numpy(v) for k, v in state.items()}
    return visible._gqa(t, H, Hkv, *(torch.from_numpy(d[k]) for k in ("x", "positions", "causal"))).numpy()


def _grouped_state(rng: np.random.Generator, D: int, H: int, Hkv: int) -> dict[str, np.ndarray]:
    """A multi-head state whose key/value heads already agree within each group of consecutive heads."""
    state = visible._gqa_state(rng, D, H, H)
    Dh, g = D // H, H // Hkv
    for name in ("k_proj.weight", "v_proj.weight"):
        heads = state[name].reshape(Hkv, g, Dh, D)
        state[name] = np.repeat(heads[:, :1], g, axis=1).reshape(H * Dh, D)
    return state


@exercise(LESSON, "mha_to_gqa")
class MHAToGQA(Exercise):
    """The given conversion builds the student's GroupedQueryAttention and mean-pools key/value heads; the shown bug
    pools heads j, j + n_kv_heads, ... (repeat's layout) instead of the consecutive heads kv head j serves. Pooled
    weights against the consecutive groups' means, q/out copied; the converted module's output against the
    reference (GQA in float64) with RoPE and a causal mask; a model whose heads agree per group converts exactly;
    MQA; mha unchanged."""

    uses = ("GroupedQueryAttention", "rotary_embedding")  # built from the student's class, run with positions
    reference = ref

    def cases(self, rng):
        cases = []
        for case_id, (D, H, Hkv), grouped, what in (
                ("gqa", (24, 6, 2), False, "6 query heads in 2 groups of 3, random weights"),
                ("gqa4", (32, 8, 4), False, "8 query heads in 4 groups of 2, random weights"),
                ("grouped", (24, 6, 3), True, "6 heads in 3 groups of 2 whose keys and values already agree per "
                                              "group (the conversion is exact)"),
                ("mqa", (16, 4, 1), False, "n_kv_heads=1 (MQA): every head averaged")):
            state = _grouped_state(rng, D, H, Hkv) if grouped else visible._gqa_state(rng, D, H, H)
            B, T = 2, 5
            x = rng.normal(size=(B, T, D)).astype(np.float32)
            positions = (np.arange(T) + int(rng.integers(0, 20))).astype(np.int64)
            causal = np.tril(np.ones((T, T), bool))
            case = Case(case_id, f"mha = GroupedQueryAttention(D={D}, n_heads={H}, n_kv_heads={H}), converted to "
                                 f"n_kv_heads={Hkv}: {what}; its output on x ({B}, {T}, {D}) with positions and a "
                                 "causal mask",
                        data={"state": state, "H": H, "Hkv": Hkv, "x": x, "positions": positions, "causal": causal})
            case.call("GroupedQueryAttention", D, H, H, let="mha")
            case.load_state("mha", state)
            case.call("mha_to_gqa", {"ref": "mha"}, H, Hkv, let="gqa")
            for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
                case.record(name, {"attr": ["gqa", name, "weight", "data"]})
            case.call({"ref": "gqa"}, case.tensor(x), case.tensor(positions), case.tensor(causal), record="out")
            case.record("mha.k_proj.weight_after", {"attr": ["mha", "k_proj", "weight", "data"]})  # read by unchanged
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            d = case.data
            state, H, Hkv = d["state"], d["H"], d["Hkv"]
            _load_error(result, case, "q_proj, k_proj, v_proj, out_proj, nn.Linear without bias.")
            for name in ("q_proj", "out_proj"):
                got = result.get(case.id, name, what=f"the converted {name}.weight", kind="tensor", dtype="float",
                                 shape=state[f"{name}.weight"].shape)
                expect_close(got, state[f"{name}.weight"], f"the converted {name}.weight", case.desc, rtol=0,
                             atol=0, hint="the query and output projections are copied from mha unchanged.")
            want = [_pooled(state[f"{name}.weight"], H, Hkv) for name in ("k_proj", "v_proj")]
            got = [result.get(case.id, name, what=f"the converted {name}.weight", kind="tensor", dtype="float",
                              shape=want[0].shape) for name in ("k_proj", "v_proj")]
            known = "" if spec.all_agree(got, want, 1e-5, 1e-6) else spec.known_mistake(
                LESSON, "mha_to_gqa", got, lambda wrong, s=state, h=H, k=Hkv: _converted(wrong, s, h, k), 1e-5, 1e-6)
            for name, g, w in zip(("k_proj", "v_proj"), got, want):
                expect_close(g, w, f"the converted {name}.weight", case.desc, rtol=1e-5, atol=1e-6, hint=(
                    f"Your values are those of a known mistake: {known}. " if known else "") + f"kv head j is the "
                    f"mean of mha's heads j·g .. j·g + g - 1 (g = {H // Hkv}), the query heads it serves.")
            if case.id == "grouped":  # nothing is lost: the same outputs as mha itself
                want = _attend(state, H, H, d)
            else:
                pooled = {**state, "k_proj.weight": want[0], "v_proj.weight": want[1]}
                want = _attend(pooled, H, Hkv, d)
            got = result.get(case.id, "out", what="the converted module's output", kind="tensor", dtype="float",
                             shape=want.shape)
            expect_close(got, want, "the converted module's output", case.desc, rtol=1e-4, atol=1e-4,
                         hint="the weights above decide it: pooled key/value heads, copied q_proj and out_proj.")
            unchanged(result, case.id, {"mha.k_proj.weight": state["k_proj.weight"]}, "mha_to_gqa")
