"""Hidden checks of lesson 12-modern (PyTorch): RMSNorm, RoPE, SwiGLU, grouped-query attention, the sliding
window and the modern block.

- ``RMSNorm``, ``rotary_embedding`` and ``SwiGLUFeedForward`` are specs (``decoder_course/visible/l12_modern.py``):
  the same rows as the visible checks on secret draws; the modules against ``nn.RMSNorm`` and ``F.linear``/
  ``F.silu`` with the same weights (bfloat16 in and out, a fresh weight of ones), RoPE by its properties and the
  reference's values; each item's mutants name the mistake the student's values match;
- ``GroupedQueryAttention`` against the reference (itself proven equal to SDPA with ``enable_gqa=True``) for GQA,
  MQA and MHA, with and without RoPE, a random mask with a fully masked row (zeros), the cache path holding only
  the key/value heads, bad sizes raising; judged relative to the student's ``rotary_embedding``;
- ``sliding_window_mask`` by its definition (windows of 1, inside and beyond T), ``window = 0`` raising;
- ``ModernBlock`` against the reference, relative to the student's ``RMSNorm``, ``GroupedQueryAttention`` and
  ``SwiGLUFeedForward``; pre-norm wiring, positions reaching the attention, the cache path.

Generic judges (inputs unchanged, ValueError, the known mistakes' diagnosis) come from
:mod:`autograder.checks.judges`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from autograder.checks import spec
from autograder.checks.framework import Case, Exercise, Fail, Result, exercise, expect_close
from autograder.checks.judges import diagnose, record_after, unchanged, value_error
from autograder.reference import modern as ref
from decoder_course.visible import l12_modern as visible
from decoder_course.visible.l12_modern import SLIDING_WINDOW_MASK

LESSON = "12-modern"


def _state(module: nn.Module) -> dict[str, np.ndarray]:
    return {key: value.detach().numpy().astype(np.float32) for key, value in module.state_dict().items()}


def _load_error(result: Result, case: Case, names: str) -> None:
    error = result.error(case.id)
    if error is not None and "state_dict" in error:
        raise Fail(f"the weights could not be loaded into your module ({case.desc}):\n    "
                   f"{error.splitlines()[-1]}\nThe names are part of the contract: {names}")


def _call_on_x(case: Case, x: np.ndarray, *args, **kwargs) -> None:
    """Call the bound module ``m`` on ``x`` (bound, so that :func:`unchanged` can read it back) and record ``out``."""
    case.let("x", case.tensor(x))
    case.call({"ref": "m"}, {"ref": "x"}, *args, record="out", **kwargs)
    record_after(case, ["x"])


# the cached cases: x (B, 5, D) fed as a prefill of positions 0 .. 2, then positions 3 and 4 one at a time
def _cached_calls(case: Case, x: np.ndarray, *extra) -> None:
    """Bind a one-layer KVCache and run the bound module ``m`` step by step (``extra``: arguments after the cache)."""
    case.call({"global": "KVCache"}, 1, let="cache")
    case.call({"ref": "m"}, case.tensor(x[:, :3]), case.tensor(np.arange(3)),
              case.tensor(np.tril(np.ones((3, 3), bool))), {"ref": "cache"}, *extra, record="step0")
    for t in (3, 4):
        case.call({"ref": "m"}, case.tensor(x[:, t:t + 1]), case.tensor(np.array([t])),
                  case.tensor(np.ones((1, t + 1), bool)), {"ref": "cache"}, *extra, record=f"step{t - 2}")


def _cached_output(result: Result, case: Case, B: int, D: int) -> np.ndarray:
    """The cached steps' outputs joined along T (B, 5, D), each read with its own shape first."""
    parts = [result.get(case.id, "step0", what="the output on the prefill", kind="tensor", dtype="float",
                        shape=(B, 3, D))]
    parts += [result.get(case.id, f"step{s}", what=f"the output at cached step {s}", kind="tensor", dtype="float",
                         shape=(B, 1, D)) for s in (1, 2)]
    return np.concatenate(parts, axis=1)


# -- RMSNorm, rotary_embedding, SwiGLUFeedForward: specs (decoder_course/visible/l12_modern.py) ----------------------
spec.register(LESSON, visible.SPECS, ref)


# -- GroupedQueryAttention ---------------------------------------------------------------------------------------------
def _gqa_state(rng: np.random.Generator, D: int, H: int, Hkv: int) -> dict[str, np.ndarray]:
    Dh = D // H
    shapes = {"q_proj.weight": (D, D), "k_proj.weight": (Hkv * Dh, D), "v_proj.weight": (Hkv * Dh, D),
              "out_proj.weight": (D, D)}
    return {k: rng.normal(0, 0.4, s).astype(np.float32) for k, s in shapes.items()}


def _gqa_variant(state: dict, H: int, Hkv: int, x: np.ndarray, positions, allowed, *, tile: bool = False,
                 rope: str = "both", scale_by: str = "Dh") -> np.ndarray:
    """Grouped-query attention written out in float64, and the variants common mistakes compute."""
    w = {k: torch.from_numpy(v).double() for k, v in state.items()}
    xt = torch.from_numpy(x).double()
    B, T, D = xt.shape
    Dh = D // H
    q = (xt @ w["q_proj.weight"].T).view(B, T, H, Dh).transpose(1, 2)  # (B, H, T, Dh)
    k = (xt @ w["k_proj.weight"].T).view(B, T, Hkv, Dh).transpose(1, 2)  # (B, Hkv, T, Dh)
    v = (xt @ w["v_proj.weight"].T).view(B, T, Hkv, Dh).transpose(1, 2)
    if positions is not None:
        pos = np.asarray(positions)
        q = visible.complex_rotation(q, torch.from_numpy(pos))
        if rope == "both":
            k = visible.complex_rotation(k, torch.from_numpy(pos))
    group = H // Hkv
    k, v = ((t.repeat(1, group, 1, 1) if tile else t.repeat_interleave(group, dim=1)) for t in (k, v))  # (B, H, T, Dh)
    scores = q @ k.transpose(-2, -1) / np.sqrt(Dh if scale_by == "Dh" else D)  # (B, H, T, T)
    if allowed is not None:
        scores = scores.masked_fill(~torch.from_numpy(np.asarray(allowed)), float("-inf"))
    weights = torch.softmax(scores, -1).nan_to_num(0.0)  # a fully masked row: zeros
    out = (weights @ v).transpose(1, 2).reshape(B, T, D)
    return (out @ w["out_proj.weight"].T).numpy()


def _gqa_mistakes(d: dict) -> dict[str, np.ndarray]:
    """What the usual mistakes compute on a case's data, by the idea each one misses."""
    args = (d["state"], d["H"], d["Hkv"], d["x"])
    mistakes = {"tiles the key/value heads (kv head h % n_kv_heads for query head h): query heads h·g .. h·g + g - 1 "
                "share kv head h, so repeat_interleave(g, dim=1), not repeat":
                    _gqa_variant(*args, d["positions"], d["allowed"], tile=True)}
    if d["positions"] is not None:
        mistakes["rotates the queries only: rotate the keys at their positions too, or the score depends on absolute "
                 "positions"] = _gqa_variant(*args, d["positions"], d["allowed"], rope="q_only")
        mistakes["ignores `positions`: rotate q and k with rotary_embedding(.., positions)"] = \
            _gqa_variant(*args, None, d["allowed"])
    mistakes["scales the scores by 1/sqrt(D): the scale is 1/sqrt(Dh), the head width"] = \
        _gqa_variant(*args, d["positions"], d["allowed"], scale_by="D")
    return {f"a version that {idea}": alt for idea, alt in mistakes.items()}


GQA_NAMES = "q_proj (D -> D), k_proj and v_proj (D -> n_kv_heads·Dh), out_proj (D -> D), nn.Linear without bias."


@exercise(LESSON, "GroupedQueryAttention")
class GroupedQueryAttentionCheck(Exercise):
    """Against the reference (= SDPA with enable_gqa=True) with copied weights: GQA (groups of consecutive query
    heads), MQA, MHA; RoPE on queries and keys at the given positions; 1/sqrt(Dh); a random mask with a fully
    masked row (zeros); the cache holds (B, n_kv_heads, S, Dh) and gives the full forward's output; bad sizes
    raise; x unchanged."""

    forbidden = ("scaled_dot_product_attention", "enable_gqa", "nn.MultiheadAttention")
    uses = ("rotary_embedding",)  # queries and keys are rotated by the student's own RoPE
    reference = ref

    def _build(self, case: Case, D: int, H: int, Hkv: int, state: dict) -> None:
        case.call("GroupedQueryAttention", D, H, Hkv, let="m")
        case.load_state("m", state)
        case.eval("m")

    def cases(self, rng):
        cases = []
        for case_id, D, H, Hkv, B, T, rope, causal, what in (
                ("gqa", 24, 6, 2, 3, 7, True, False, "GQA"), ("mqa", 16, 4, 1, 2, 6, True, True, "MQA (n_kv_heads=1)"),
                ("mha", 12, 3, 3, 2, 5, False, True, "MHA (n_kv_heads=n_heads)"),
                ("gqa_plain", 16, 4, 2, 2, 5, False, False, "GQA")):
            state = _gqa_state(rng, D, H, Hkv)
            x = rng.normal(size=(B, T, D)).astype(np.float32)
            positions = (np.arange(T) + int(rng.integers(0, 40))).astype(np.int64) if rope else None
            if causal:
                allowed = np.tril(np.ones((T, T), dtype=bool))
            else:
                allowed = rng.random((B, 1, T, T)) < 0.6
                allowed[..., 0] = True
                allowed[-1, 0, 1] = False  # one fully masked query row: zeros before out_proj
            desc = (f"{what}: D={D}, n_heads={H}, n_kv_heads={Hkv}, B={B}, T={T}, "
                    f"{f'RoPE at positions from {int(positions[0])}' if rope else 'no positions'}, "
                    f"{'a causal mask' if causal else 'a random mask with a fully masked row'}")
            case = Case(case_id, desc, data={"state": state, "H": H, "Hkv": Hkv, "x": x, "positions": positions,
                                             "allowed": allowed})
            self._build(case, D, H, Hkv, state)
            _call_on_x(case, x, allowed=case.tensor(allowed),
                       **({} if positions is None else {"positions": case.tensor(positions)}))
            cases.append(case)
        D, H, Hkv, B, T = 16, 4, 2, 2, 5
        state = _gqa_state(rng, D, H, Hkv)
        x = rng.normal(size=(B, T, D)).astype(np.float32)
        case = Case("cache", f"GQA D={D}, n_heads={H}, n_kv_heads={Hkv}, B={B}: a KVCache prefilled with 3 positions "
                             "(RoPE at 0 .. 2), then 2 single positions", data={"state": state, "x": x, "H": H,
                                                                                "Hkv": Hkv})
        self._build(case, D, H, Hkv, state)
        _cached_calls(case, x)
        case.record("cached", {"attr": ["cache", "keys"]})
        cases.append(case)
        for case_id, args in (("bad_heads", (16, 3, 1)), ("bad_groups", (16, 4, 3))):
            case = Case(case_id, f"GroupedQueryAttention{args}", relative=False)
            case.call("GroupedQueryAttention", *args, let="m")
            case.record("made", {"attr": ["m", "training"]})
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case_id in ("gqa", "mqa", "mha", "gqa_plain"):
            case, d = result.cases[case_id], result.cases[case_id].data
            _load_error(result, case, GQA_NAMES)
            want = _gqa_variant(d["state"], d["H"], d["Hkv"], d["x"], d["positions"], d["allowed"])
            got = result.get(case.id, "out", what="GroupedQueryAttention's output", kind="tensor", dtype="float",
                             shape=want.shape)
            hint = diagnose(got, _gqa_mistakes(d), rtol=1e-4, atol=1e-4) or (
                "Project, split into n_heads query and n_kv_heads key/value heads, rotate q and k at the positions, "
                "repeat each key/value head for its group (repeat_interleave on the head axis), attend with the "
                "mask, merge, out_proj.")
            expect_close(got, want, "GroupedQueryAttention's output", case.desc, hint=hint, rtol=1e-4, atol=1e-4)
            unchanged(result, case.id, {"x": d["x"]}, "GroupedQueryAttention")
        case = result.cases["gqa"]
        got = result.get(case.id, "out", what="GroupedQueryAttention's output", kind="tensor")
        if not np.allclose(got[-1, 1], 0.0, atol=1e-6):
            raise Fail(f"a fully masked query row should give zeros ({case.desc}): zero its weights, as lesson 03's "
                       "attention does (out_proj has no bias, so the output row is zero).")
        case, d = result.cases["cache"], result.cases["cache"].data
        _load_error(result, case, GQA_NAMES)
        B, T, D = d["x"].shape
        want = _gqa_variant(d["state"], d["H"], d["Hkv"], d["x"], np.arange(T), np.tril(np.ones((T, T), bool)))
        expect_close(_cached_output(result, case, B, D), want, "GroupedQueryAttention's output with a KVCache",
                     case.desc, rtol=1e-4, atol=1e-4, hint="Rotate the new keys at their positions, then "
                     "cache.update(k, v, layer_idx) with the n_kv_heads heads, then repeat them for the groups and "
                     "attend over everything cached.")
        k_all = result.get(case.id, "cached/0", what="the cached keys", kind="tensor")
        if k_all.shape != (B, d["Hkv"], T, D // d["H"]):
            raise Fail(f"the cache holds keys of shape {k_all.shape}, should be (B, n_kv_heads, S, Dh) = "
                       f"{(B, d['Hkv'], T, D // d['H'])} ({case.desc}): cache the n_kv_heads heads, before repeating "
                       "them for the query groups; that is where the memory is saved.")
        for case_id in ("bad_heads", "bad_groups"):
            value_error(result, case_id, f"{result.cases[case_id].desc} has sizes that do not divide: D must divide "
                                         "into n_heads heads and n_heads into n_kv_heads groups")


# -- sliding_window_mask -----------------------------------------------------------------------------------------------
spec.register(LESSON, {"sliding_window_mask": SLIDING_WINDOW_MASK}, ref)  # a spec: decoder_course.visible.l12_modern


# -- ModernBlock -------------------------------------------------------------------------------------------------------
def _block_state(rng: np.random.Generator, D: int, H: int, Hkv: int, Fw: int) -> dict[str, np.ndarray]:
    with torch.random.fork_rng():
        torch.manual_seed(int(rng.integers(2**31)))
        block = ref.ModernBlock(D, H, Hkv, Fw, eps=1e-5)
        with torch.no_grad():
            for name, p in block.named_parameters():
                if "norm" in name:
                    p.normal_(1.0, 0.3)  # two different norms, far from ones
                else:
                    p.normal_(0.0, 0.3)
    return _state(block)


def _block_outputs(state: dict, cfg: tuple, x: np.ndarray, positions: np.ndarray, allowed) -> tuple[np.ndarray, dict]:
    """The reference block's output, and what the usual miswirings compute (by the idea each one misses)."""
    block = ref.ModernBlock(*cfg, eps=1e-5)
    block.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    xt, pos = torch.from_numpy(x), torch.from_numpy(positions)
    mask = None if allowed is None else torch.from_numpy(allowed)
    with torch.no_grad():
        want = block(xt, pos, mask)
        h = block.attn_norm(xt + block.attn(xt, pos, mask))
        post = block.ffn_norm(h + block.feed_forward(h))
        h = xt + block.attn(block.attn_norm(xt), None, mask)
        no_pos = h + block.feed_forward(block.ffn_norm(h))
        h = xt + block.attn(block.attn_norm(xt), pos, mask)
        one_norm = h + block.feed_forward(block.attn_norm(h))
    mistakes = {"normalises after adding (post-norm): pre-norm normalises each sublayer's input and adds its output "
                "to the unnormalised stream": post,
                "does not pass `positions` to the attention: without them RoPE never happens and the block cannot "
                "tell positions apart": no_pos,
                "uses attn_norm before the feed-forward too: each sublayer has its own norm (ffn_norm)": one_norm}
    return want.numpy(), {f"a block that {idea}": alt.numpy() for idea, alt in mistakes.items()}


@exercise(LESSON, "ModernBlock")
class ModernBlockCheck(Exercise):
    """Against the reference with copied weights (two different norms): pre-norm, each sublayer added to the
    stream; positions reach the attention (RoPE); the mask passed on; the cache path equals the full forward;
    judged relative to the student's RMSNorm, GroupedQueryAttention and SwiGLUFeedForward; x unchanged."""

    uses = ("RMSNorm", "GroupedQueryAttention", "SwiGLUFeedForward")
    reference = ref
    NAMES = "attn_norm, ffn_norm (RMSNorm), attn (GroupedQueryAttention), feed_forward (SwiGLUFeedForward)."

    def _build(self, case: Case, cfg: tuple, state: dict) -> None:
        case.call("ModernBlock", *cfg, eps=1e-5, let="m")
        case.load_state("m", state, lenient=("attn_norm.", "ffn_norm.", "attn.", "feed_forward."))
        case.eval("m")

    def cases(self, rng):
        cases = []
        for case_id, cfg, B, T, causal in (("gqa", (16, 4, 2, 24), 3, 6, True), ("mha", (8, 2, 2, 12), 2, 5, False)):
            state = _block_state(rng, *cfg)
            x = rng.normal(size=(B, T, cfg[0])).astype(np.float32)
            positions = (np.arange(T) + int(rng.integers(1, 30))).astype(np.int64)
            allowed = np.tril(np.ones((T, T), bool)) if causal else None
            want, mistakes = _block_outputs(state, cfg, x, positions, allowed)
            D, H, Hkv, Fw = cfg
            case = Case(case_id, f"ModernBlock(D={D}, n_heads={H}, n_kv_heads={Hkv}, d_ff={Fw}, eps=1e-5) with random "
                                 f"weights, B={B}, T={T}, positions from {int(positions[0])}, "
                                 f"{'a causal mask' if causal else 'no mask'}",
                        data={"want": want, "mistakes": mistakes, "x": x})
            self._build(case, cfg, state)
            _call_on_x(case, x, case.tensor(positions), None if allowed is None else case.tensor(allowed))
            cases.append(case)
        cfg, B, T = (16, 4, 1, 24), 2, 5
        state = _block_state(rng, *cfg)
        x = rng.normal(size=(B, T, cfg[0])).astype(np.float32)
        case = Case("cache", "ModernBlock(16, 4, 1, 24), B=2: a KVCache prefilled with 3 positions, then 2 single ones",
                    data={"want": _block_outputs(state, cfg, x, np.arange(T), np.tril(np.ones((T, T), bool)))[0]})
        self._build(case, cfg, state)
        _cached_calls(case, x, 0)  # layer_idx 0
        cases.append(case)
        return cases

    def judge(self, result: Result):
        for case_id in ("gqa", "mha"):
            case, d = result.cases[case_id], result.cases[case_id].data
            _load_error(result, case, self.NAMES)
            got = result.get(case.id, "out", what="ModernBlock's output", kind="tensor", dtype="float",
                             shape=d["want"].shape)
            hint = diagnose(got, d["mistakes"], rtol=1e-4, atol=1e-4) or (
                "x + attn(attn_norm(x), positions, allowed), then + feed_forward(ffn_norm(x)).")
            expect_close(got, d["want"], "ModernBlock's output", case.desc, hint=hint, rtol=1e-4, atol=1e-4)
            unchanged(result, case.id, {"x": d["x"]}, "ModernBlock")
        case = result.cases["cache"]
        B, _, D = case.data["want"].shape
        expect_close(_cached_output(result, case, B, D), case.data["want"], "ModernBlock's output with a KVCache",
                     case.desc, rtol=1e-4, atol=1e-4, hint="Pass cache and layer_idx on to the attention.")


# -- mha_to_gqa: find the bug (autograder.bugs), judged relative to the student's GroupedQueryAttention --------------
def _pooled(w: np.ndarray, H: int, Hkv: int, how: str = "groups") -> np.ndarray:
    """k_proj/v_proj (H·Dh, D) pooled into Hkv heads: the right groups, and what the usual mistakes compute."""
    D = w.shape[-1]
    Dh, g = w.shape[0] // H, H // Hkv
    heads = {"groups": lambda: w.reshape(Hkv, g, Dh, D).mean(1),  # consecutive heads j·g .. j·g + g - 1
             "strided": lambda: w.reshape(g, Hkv, Dh, D).mean(0),  # heads j, j + Hkv, ...: repeat's layout
             "first": lambda: w.reshape(Hkv, g, Dh, D)[:, 0],
             "sum": lambda: w.reshape(Hkv, g, Dh, D).sum(1),
             "rows": lambda: w.reshape(Hkv, Dh, g, D).mean(2)}[how]()
    return heads.reshape(Hkv * Dh, D)


POOLING_MISTAKES = {
    "strided": "averages heads j, j + n_kv_heads, j + 2·n_kv_heads, ... (the layout of repeat): your "
               "GroupedQueryAttention gives kv head j to the consecutive query heads j·g .. j·g + g - 1 "
               "(repeat_interleave), so those are the heads to average",
    "first": "keeps the first head of each group: average all g of them",
    "sum": "sums each group's heads: average them (a sum scales the scores and outputs by g)",
    "rows": "averages rows across heads: a head is Dh consecutive rows, so cut the rows into whole heads first, then "
            "average the g heads of each group"}


def _grouped_state(rng: np.random.Generator, D: int, H: int, Hkv: int) -> dict[str, np.ndarray]:
    """A multi-head state whose key/value heads already agree within each group of consecutive heads."""
    state = _gqa_state(rng, D, H, H)
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
            state = _grouped_state(rng, D, H, Hkv) if grouped else _gqa_state(rng, D, H, H)
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
            for name in ("k_proj", "v_proj"):
                w = state[f"{name}.weight"]
                want = _pooled(w, H, Hkv)
                got = result.get(case.id, name, what=f"the converted {name}.weight", kind="tensor", dtype="float",
                                 shape=want.shape)
                alts = {how: _pooled(w, H, Hkv, how) for how in POOLING_MISTAKES}  # only those that differ here
                hint = diagnose(got, {f"a conversion that {idea}": None if np.allclose(want, alts[how], atol=1e-6)
                                      else alts[how] for how, idea in POOLING_MISTAKES.items()}, rtol=1e-5, atol=1e-5)
                expect_close(got, want, f"the converted {name}.weight", case.desc, rtol=1e-5, atol=1e-6,
                             hint=hint or f"kv head j is the mean of mha's heads j·g .. j·g + g - 1 (g = {H // Hkv}), "
                                          "the query heads it serves.")
            if case.id == "grouped":  # nothing is lost: the same outputs as mha itself
                want = _gqa_variant(state, H, H, d["x"], d["positions"], d["causal"])
            else:
                pooled = {**state, **{f"{name}.weight": _pooled(state[f"{name}.weight"], H, Hkv)
                                      for name in ("k_proj", "v_proj")}}
                want = _gqa_variant(pooled, H, Hkv, d["x"], d["positions"], d["causal"])
            got = result.get(case.id, "out", what="the converted module's output", kind="tensor", dtype="float",
                             shape=want.shape)
            expect_close(got, want, "the converted module's output", case.desc, rtol=1e-4, atol=1e-4,
                         hint="the weights above decide it: pooled key/value heads, copied q_proj and out_proj.")
            unchanged(result, case.id, {"mha.k_proj.weight": state["k_proj.weight"]}, "mha_to_gqa")
