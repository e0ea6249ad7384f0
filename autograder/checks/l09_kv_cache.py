"""Hidden checks of lesson 09-kv-cache (PyTorch): the cache, the aligned causal mask, a cached step, cached greedy.

``decode_step`` and ``greedy_decode_cached`` run on a model built in the kernel from the notebook's given
``Seq2SeqTransformer`` and loaded (strictly, by the contract's parameter names) with random weights drawn here.
The expected logits are the full, uncached decoder's (``model.decode`` of the reference model carrying the same
weights); the expected tokens are the reference ``greedy_decode``'s, compared token for token. The memory's
cross-attention keys and values are handed to ``decode_step`` precomputed, and ``greedy_decode_cached`` is watched
by a forward hook (``decoder_course.visible.l09_kv_cache.CallCounter``) on each layer's ``cross_attn.k_proj``:
projecting the memory once per layer is part of the exercise.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from autograder.checks.framework import Case, Exercise, Fail, Result, exercise, expect_close
from autograder.reference import generation as ref_gen
from autograder.reference import kv_cache as ref
from autograder.reference.model import Seq2SeqTransformer
from decoder_course.conventions import BOS

LESSON = "09-kv-cache"
COUNTER = "decoder_course.visible.l09_kv_cache:CallCounter"
V, D, H, F, LAYERS = 20, 32, 4, 64, 2  # Dh = 8, T != S != H


# -- a model with random weights, in the kernel and here ---------------------------------------------------------------
def _random_model(rng: np.random.Generator, norm_first: bool) -> tuple[Seq2SeqTransformer, dict[str, np.ndarray]]:
    """The reference model with fresh random weights (greedy outputs that vary, PAD/BOS never chosen), and its state
    dict as float32 arrays for the kernel."""
    with torch.random.fork_rng():
        torch.manual_seed(int(rng.integers(2**31)))
        model = Seq2SeqTransformer(V, V, D, H, F, LAYERS, dropout=0.1, tie_weights=False, norm_first=norm_first)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0.0, 0.2)  # biases far from 0, so that a forgotten one shows
            model.out_proj.weight.mul_(3.0)  # sharper logits: greedy outputs differ from row to row
            model.out_proj.bias[:2] -= 100.0  # never PAD (0) or BOS (1)
    model.eval()
    state = {key: value.detach().numpy().astype(np.float32) for key, value in model.state_dict().items()}
    return model, state


def _build(case: Case, state: dict, norm_first: bool) -> None:
    """Steps binding ``m``: the notebook's Seq2SeqTransformer with the given weights, in eval mode."""
    case.call("Seq2SeqTransformer", V, V, D, H, F, LAYERS, dropout=0.1, tie_weights=False, norm_first=norm_first,
              let="m")
    case.load_state("m", state)
    case.eval("m")


def _source(rng: np.random.Generator, B: int, S: int) -> tuple[np.ndarray, np.ndarray]:
    """Source ids (B, S) padded at the end to random lengths (row 0 full), and is_real."""
    lengths = rng.integers(1, S + 1, size=B)
    lengths[0] = S
    is_real = np.arange(S)[None, :] < lengths[:, None]  # (B, S)
    return np.where(is_real, rng.integers(3, V, size=(B, S)), 0), is_real


def _tensor(x: np.ndarray | None) -> torch.Tensor | None:
    return None if x is None else torch.from_numpy(np.asarray(x))


def _raise_with_dependencies(result: Result, case: Case, uses: str) -> None:
    """An exception on a case of an exercise built on others: show it, and say which of the student's own pieces
    ran inside it (their bugs surface here too)."""
    error = result.error(case.id)
    if error is not None:
        raise Fail(f"your code raised an exception on a case with {case.desc}:\n    {error.splitlines()[-1]}\n"
                   f"This exercise runs your {uses}: if one of their checks fails, fix it first.")


# -- KVCache -----------------------------------------------------------------------------------------------------------
@exercise(LESSON, "KVCache", points=2)
class KVCacheCheck(Exercise):
    """Appends along the sequence axis, per layer; returns everything cached; length counts positions; positions
    are 0 .. length - 1; one-layer update(k, v); the caller's k and v unchanged; reorder(index) keeps batch
    rows index (repeated or dropped) of every layer's keys and values."""

    def cases(self, rng):
        cases = []
        B, Hh, Dh, n_layers = 2, 3, 4, 3
        steps = [2, 1, 1]  # a prefill of 2 positions, then one per step
        ks = [[rng.standard_normal((B, Hh, t, Dh)).astype(np.float32) for t in steps] for _ in range(n_layers)]
        vs = [[rng.standard_normal((B, Hh, t, Dh)).astype(np.float32) for t in steps] for _ in range(n_layers)]
        case = Case("layers", f"KVCache(n_layers={n_layers}), (B, H, Dh) = {(B, Hh, Dh)}, a prefill of 2 positions "
                              "then 2 single steps", data={"ks": ks, "vs": vs, "steps": steps})
        case.call("KVCache", n_layers, let="cache")
        case.record("len0", {"attr": ["cache", "length"]})
        for s in range(len(steps)):
            for layer in range(n_layers):
                case.let(f"k{s}{layer}", case.tensor(ks[layer][s]))
                case.call({"attr": ["cache", "update"]}, {"ref": f"k{s}{layer}"}, case.tensor(vs[layer][s]), layer,
                          record=f"out{s}{layer}")
            case.record(f"len{s + 1}", {"attr": ["cache", "length"]})
        case.record("positions", {"attr": ["cache", "positions"]})
        case.record("k00_after", {"ref": "k00"})
        cases.append(case)
        # the one-layer form: update(k, v)
        k1 = [rng.standard_normal((1, 2, t, 6)).astype(np.float32) for t in (3, 1)]
        v1 = [rng.standard_normal((1, 2, t, 6)).astype(np.float32) for t in (3, 1)]
        case = Case("single", "KVCache() and update(k, v) without layer_idx, (B, H, Dh) = (1, 2, 6)",
                    data={"ks": [k1], "vs": [v1], "steps": [3, 1]})
        case.call("KVCache", let="cache")
        for s in range(2):
            case.call({"attr": ["cache", "update"]}, case.tensor(k1[s]), case.tensor(v1[s]), record=f"out{s}0")
            case.record(f"len{s + 1}", {"attr": ["cache", "length"]})
        cases.append(case)
        if getattr(self, "judged_as", ""):
            return cases  # a find-the-bug cache judged by these cases has no reorder of its own
        # reorder(index): beam search keeps rows index of every layer (a row repeated, one dropped, B changes)
        B, n_layers = 3, 2
        kr = [rng.standard_normal((B, 2, 4, 3)).astype(np.float32) for _ in range(n_layers)]
        vr = [rng.standard_normal((B, 2, 4, 3)).astype(np.float32) for _ in range(n_layers)]
        index = np.array([2, 0, 2, 1][: int(rng.integers(3, 5))], dtype=np.int64)
        case = Case("reorder", f"KVCache(n_layers=2), (B, H, S, Dh) = (3, 2, 4, 3), then reorder(index) with "
                               f"{len(index)} rows, one repeated, then one more update",
                    data={"ks": kr, "vs": vr, "index": index})
        case.call("KVCache", n_layers, let="cache")
        for layer in range(n_layers):
            case.call({"attr": ["cache", "update"]}, case.tensor(kr[layer]), case.tensor(vr[layer]), layer)
        case.call({"attr": ["cache", "reorder"]}, case.tensor(index))
        case.record("len", {"attr": ["cache", "length"]})
        for layer in range(n_layers):
            new = np.full((len(index), 2, 1, 3), float(layer + 1), dtype=np.float32)
            case.call({"attr": ["cache", "update"]}, case.tensor(new), case.tensor(-new), layer, record=f"after{layer}")
        cases.append(case)
        return cases

    def judge(self, result: Result):
        if "reorder" in result.cases:
            self._judge_reorder(result)
        for case in result.cases.values():
            if case.id == "reorder":
                continue
            d = case.data
            n_layers = len(d["ks"])
            error = result.error(case.id) or ""
            if "Sizes of tensors must match" in error:
                raise Fail(f"your update raised an exception ({case.desc}):\n    {error.splitlines()[-1]}\n"
                           "New positions are appended on the sequence axis: dim 2 of (B, H, S, Dh), where the "
                           "other sizes always match.")
            if case.id == "layers":
                length = result.get(case.id, "len0", what="the length of a new cache", kind="any")
                if int(length) != 0:
                    raise Fail(f"a new cache should have length 0, got {int(length)} ({case.desc}).")
            total = 0
            for s, t in enumerate(d["steps"]):
                total += t
                for layer in range(n_layers):
                    name = f"out{s}{layer}"
                    meta = result.meta(case.id, name)
                    if meta.get("type") not in ("tuple", "list") or meta.get("len") != 2:
                        raise Fail(f"update should return a pair (k_all, v_all), got {meta.get('type')} "
                                   f"({case.desc}).")
                    B, Hh, _, Dh = d["ks"][layer][0].shape
                    for i, (what, parts) in enumerate((("keys", d["ks"]), ("values", d["vs"]))):
                        got = result.get(case.id, f"{name}/{i}", what=f"the {what} returned by update", kind="tensor",
                                         dtype="float")
                        want = np.concatenate(parts[layer][: s + 1], axis=2)  # (B, H, S, Dh)
                        if got.shape != want.shape:
                            hint = ("along the wrong axis: new positions go on the sequence axis, dim 2 of "
                                    "(B, H, S, Dh)" if got.size == want.size else
                                    "with the wrong number of positions: return everything cached for this layer, "
                                    "old positions first")
                            raise Fail(f"update returned {what} of shape {got.shape}, expected (B, H, S, Dh) = "
                                       f"{want.shape} after {total} positions ({case.desc}): appended {hint}.")
                        expect_close(got, want, f"the {what} of layer {layer} after {total} positions", case.desc,
                                     rtol=0, atol=0,
                                     hint="Each layer keeps its own entries (index them with layer_idx); new "
                                          "positions are appended after the old ones, nothing is changed.")
                length = result.get(case.id, f"len{s + 1}", what="cache.length", kind="any")
                if int(length) != total:
                    raise Fail(f"cache.length is {int(length)} after {total} cached positions ({case.desc}): it counts "
                               "positions (dim 2 of layer 0's keys), not calls to update.")
            if case.id == "layers":
                positions = result.get(case.id, "positions", what="cache.positions", kind="tensor", dtype="int")
                if positions.tolist() != list(range(total)):
                    raise Fail(f"cache.positions should be the absolute positions 0 .. {total - 1} ({case.desc}).")
                after = result.get(case.id, "k00_after", what="k after update", kind="tensor")
                if not np.array_equal(after, d["ks"][0][0]):
                    raise Fail("update modified the caller's k in place: build new tensors with torch.cat.")


    @staticmethod
    def _judge_reorder(result: Result) -> None:
        case = result.cases["reorder"]
        d = case.data
        error = result.error(case.id)
        if error is not None:
            raise Fail(f"reorder raised an exception ({case.desc}):\n    {error.splitlines()[-1]}\nreorder(index) "
                       "keeps batch rows index of every layer's keys and values: k.index_select(0, index).")
        if int(result.get(case.id, "len", what="cache.length after reorder", kind="any")) != 4:
            raise Fail(f"cache.length changed after reorder ({case.desc}): reorder picks batch rows (dim 0), the "
                       "positions stay.")
        for layer in range(len(d["ks"])):
            for i, (what, parts) in enumerate((("keys", d["ks"]), ("values", d["vs"]))):
                got = result.get(case.id, f"after{layer}/{i}", what=f"the {what} after reorder and update",
                                 kind="tensor", dtype="float")
                new = np.full((len(d["index"]), 2, 1, 3), float(layer + 1), dtype=np.float32) * (1 if i == 0 else -1)
                want = np.concatenate([parts[layer][d["index"]], new], axis=2)
                if got.shape != want.shape or not np.array_equal(got, want):
                    raise Fail(f"after reorder(index) layer {layer}'s {what} are not rows index of the old ones "
                               f"({case.desc}): reorder every layer, keys and values, along the batch axis "
                               "(dim 0), in the order index gives; a row may appear twice.")


# -- cached_causal_mask ------------------------------------------------------------------------------------------------
@exercise(LESSON, "cached_causal_mask")
class CachedCausalMask(Exercise):
    def cases(self, rng):
        p = int(rng.integers(3, 7))
        specs = [(np.arange(p, p + 3), p + 3, "3 new queries after a cache"),
                 (np.array([int(rng.integers(4, 9))]), None, "one new query, the usual cached step"),
                 (np.arange(5), 5, "no cache: T == S"),
                 (np.array([1, 3, 4]), 6, "queries at scattered positions, more keys than the last query")]
        cases = []
        for i, (q_pos, k_len, what) in enumerate(specs):
            k_len = int(q_pos[-1]) + 1 if k_len is None else k_len
            desc = f"T={len(q_pos)} queries, S={k_len} keys, {what}"
            case = Case(f"c{i}", desc, data={"q": q_pos, "k_len": k_len})
            case.let("q", case.tensor(q_pos.astype(np.int64)))
            case.call("cached_causal_mask", {"ref": "q"}, k_len, record="out")
            case.record("q_after", {"ref": "q"})
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            q_pos, k_len = case.data["q"], case.data["k_len"]
            got = result.get(case.id, "out", what="cached_causal_mask(...)", kind="tensor", dtype="bool",
                             shape=(len(q_pos), k_len))
            want = ref.cached_causal_mask(torch.from_numpy(q_pos), k_len).numpy()
            top_left = np.tril(np.ones((len(q_pos), k_len), dtype=bool))
            hint = ("Key k is allowed for a query at absolute position p when k <= p (itself included)."
                    if not np.array_equal(got, top_left) else
                    "Your triangle starts at the top-left corner, as is_causal=True does: with a cache the queries "
                    "are the last positions, so compare key positions with the queries' absolute positions.")
            expect_close(got, want, "cached_causal_mask(q_positions, k_len)", case.desc, hint=hint)
            after = result.get(case.id, "q_after", what="q_positions after the call", kind="tensor")
            if not np.array_equal(after, q_pos):
                raise Fail("cached_causal_mask modified the caller's q_positions in place.")


# -- decode_step -------------------------------------------------------------------------------------------------------
@exercise(LESSON, "decode_step", points=2)
class DecodeStep(Exercise):
    """Logits of a prefill and of single steps against the full decoder (both norm placements, padded memory,
    B = 1 without a prefill); the cache grows by the new positions."""

    uses = ("KVCache", "cached_causal_mask")  # the steps use the notebook's cache and mask
    reference = ref

    def cases(self, rng):
        cases = []
        for norm_first, B, prefill, T in ((True, 3, 3, 7), (False, 2, 2, 6), (bool(rng.integers(2)), 1, 1, 4)):
            model, state = _random_model(rng, norm_first)
            src, is_real = _source(rng, B, 6)
            tgt = np.concatenate([np.full((B, 1), BOS), rng.integers(3, V, size=(B, T - 1))], axis=1)  # (B, T)
            use_mask = B > 1
            with torch.no_grad():
                memory = model.encode(_tensor(src), _tensor(is_real) if use_mask else None)
                memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]
            name = "pre-LN" if norm_first else "post-LN"
            desc = (f"{name}, B={B}, S=6 {'padded sources' if use_mask else 'no src_is_real'}, "
                    f"a prefill of {prefill} token(s) then single steps up to position {T - 1}")
            case = Case(f"{name}_{B}", desc, data={"model": model, "src": src, "is_real": is_real if use_mask else None,
                                                   "tgt": tgt, "prefill": prefill})
            _build(case, state, norm_first)
            case.let("mkv", {"list": [{"tuple": [case.tensor(k), case.tensor(v)]} for k, v in memory_kv]})
            case.call("KVCache", LAYERS, let="cache")
            mask = case.tensor(is_real) if use_mask else None
            starts = [0] + list(range(prefill, T))
            ends = [prefill] + list(range(prefill + 1, T + 1))
            for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
                case.call("decode_step", {"ref": "m"}, case.tensor(tgt[:, a:b]), {"ref": "mkv"}, {"ref": "cache"}, a,
                          src_is_real=mask, let=f"r{i}")
                case.record(f"logits{i}", {"index": [f"r{i}", 0]})
                case.let("cache", {"index": [f"r{i}", 1]})  # the returned cache goes into the next step
            case.record("length", {"attr": ["cache", "length"]})
            case.data["steps"] = list(zip(starts, ends, strict=True))
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            _raise_with_dependencies(result, case, "KVCache and cached_causal_mask")
            d = case.data
            B = d["tgt"].shape[0]
            with torch.no_grad():
                memory = d["model"].encode(_tensor(d["src"]), _tensor(d["is_real"]))
                full = d["model"].decode(_tensor(d["tgt"]), memory, src_is_real=_tensor(d["is_real"])).numpy()
                # the known mistake: a cross-attention that sees the source padding
                unmasked = d["model"].decode(_tensor(d["tgt"]), memory).numpy() if d["is_real"] is not None else None
            for i, (a, b) in enumerate(d["steps"]):
                got = result.get(case.id, f"logits{i}", what="decode_step's logits", kind="tensor", dtype="float",
                                 shape=(B, V))
                if (unmasked is not None and not np.allclose(got, full[:, b - 1], rtol=1e-4, atol=1e-4)
                        and np.allclose(got, unmasked[:, b - 1], rtol=1e-4, atol=1e-4)):
                    raise Fail(f"decode_step's logits at position {b - 1} are those of a decoder whose cross-attention "
                               f"sees the source padding ({case.desc}): pass src_is_real to every layer's "
                               "cross-attention as allowed=src_is_real[:, None, None, :] (B, 1, 1, S), so that no "
                               "query attends to padded memory positions.")
                if i == 0:
                    hint = (f"These are the logits of position {b - 1} after a prefill of positions {a}..{b - 1}: the "
                            "new tokens attend causally among themselves (cached_causal_mask), every layer uses its "
                            "own wiring (norm_first), the stack ends with model.decoder.norm and model.out_proj, and "
                            "only the last new position's logits are returned.")
                else:
                    hint = (f"The prefill was right but the single step at position {a} is not: its positional "
                            f"encoding is row {a} of the table (not row 0), its query must see every cached key "
                            "(a mask aligned to absolute positions), and the cache must hold every earlier position "
                            "of every layer.")
                expect_close(got, full[:, b - 1], f"decode_step's logits at position {b - 1} (vs the full decoder)",
                             case.desc, rtol=1e-4, atol=1e-4, hint=hint)
            length = result.get(case.id, "length", what="the cache's length after the last step", kind="any")
            if int(length) != d["tgt"].shape[1]:
                raise Fail(f"after positions 0..{d['tgt'].shape[1] - 1} the returned cache holds {int(length)} "
                           f"positions ({case.desc}): update the cache in every layer and return it.")


# -- greedy_decode_cached ----------------------------------------------------------------------------------------------
@exercise(LESSON, "greedy_decode_cached", points=2)
class GreedyDecodeCached(Exercise):
    """Token for token the reference greedy_decode on a model with loaded weights (both norm placements, several
    EOS ids so that rows stop at different steps, max_len 1, an EOS that never comes, B = 1, pad_id != 0); the
    memory's keys projected once per layer; the caller's source unchanged."""

    uses = ("KVCache", "cached_causal_mask", "decode_step")  # built from them
    reference = ref

    def cases(self, rng):
        cases = []
        for norm_first, B, pad_id in ((True, 4, int(rng.integers(3, 9))), (False, 3, 0), (bool(rng.integers(2)), 1,
                                                                                          int(rng.integers(3, 9)))):
            model, state = _random_model(rng, norm_first)
            src, is_real = _source(rng, B, 7)
            mask = is_real if B > 1 else None
            endless = ref_gen.greedy_decode(model, _tensor(src), 10, BOS, -1, src_is_real=_tensor(mask))
            # EOS ids taken from the tokens generated at steps 1..4: rows stop at different steps
            candidates = sorted(set(endless[:, 1:5].flatten().tolist()))
            eos_ids = [int(rng.choice(candidates)), 1]  # and BOS's id, which this model never emits: no stop
            name = "pre-LN" if norm_first else "post-LN"
            for eos_id in eos_ids:
                for max_len in ((1, 10) if eos_id != 1 else (6,)):
                    want = ref_gen.greedy_decode(model, _tensor(src), max_len, BOS, eos_id, src_is_real=_tensor(mask),
                                                 pad_id=pad_id).numpy()
                    situation = "an EOS id never generated" if eos_id == 1 else "rows ending at different steps"
                    desc = (f"{name}, B={B}, S=7, {'padded sources' if mask is not None else 'no src_is_real'}, "
                            f"max_len={max_len}, pad_id={pad_id}, {situation}")
                    case = Case(f"{name}_{B}_{eos_id}_{max_len}", desc,
                                data={"want": want, "src": src, "B": B, "max_len": max_len, "eos_id": eos_id,
                                      "pad_id": pad_id})
                    _build(case, state, norm_first)
                    case.let("layers", {"attr": ["m", "decoder", "layers"]})
                    for i in range(LAYERS):
                        case.let(f"l{i}", {"index": ["layers", i]})
                        case.let(f"count{i}", {"new": COUNTER})
                        case.call({"attr": [f"l{i}", "cross_attn", "k_proj", "register_forward_hook"]},
                                  {"ref": f"count{i}"})
                    case.let("src", case.tensor(src))
                    case.call("greedy_decode_cached", {"ref": "m"}, {"ref": "src"}, max_len, BOS, eos_id,
                              src_is_real=None if mask is None else case.tensor(mask), pad_id=pad_id, record="out")
                    for i in range(LAYERS):
                        case.record(f"calls{i}", {"attr": [f"count{i}", "calls"]})
                    case.record("src_after", {"ref": "src"})
                    cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            _raise_with_dependencies(result, case, "KVCache, cached_causal_mask and decode_step")
            d = case.data
            want = d["want"]
            got = result.get(case.id, "out", what="greedy_decode_cached(...)", kind="tensor", dtype="int")
            if got.ndim != 2 or got.shape[0] != d["B"]:
                raise Fail(f"greedy_decode_cached should return (B, L) ids with B = {d['B']}, got shape "
                           f"{tuple(got.shape)} ({case.desc}).")
            for b, row in enumerate(got.tolist()):
                if d["eos_id"] in row and any(t != d["pad_id"] for t in row[row.index(d["eos_id"]) + 1:]):
                    raise Fail(f"row {b} of greedy_decode_cached's output goes on after its EOS ({case.desc}): a "
                               "finished row gets pad_id at every later step, as in greedy_decode.")
            if got.shape != want.shape or not np.array_equal(got, want):
                if got.shape[1] == want.shape[1] + 1 and got.shape[1] > 0 and (got[:, 0] == BOS).all():
                    hint = "Your output starts with BOS: return the generated tokens only."
                elif got.shape[1] > want.shape[1]:
                    hint = ("Your output is longer than greedy_decode's: stop when every row has emitted EOS, and "
                            "give finished rows pad_id.")
                else:
                    hint = ("Each step feeds only the newest token, at position = the number of tokens fed so far "
                            "(BOS at 0); take the argmax of the returned logits; finished rows get pad_id.")
                raise Fail(f"greedy_decode_cached does not give greedy_decode's tokens ({case.desc}). {hint}")
            for i in range(LAYERS):
                calls = int(result.get(case.id, f"calls{i}", what="the number of memory projections", kind="any"))
                if calls > 1:
                    raise Fail(f"layer {i}'s cross_attn.k_proj ran {calls} times in one generation ({case.desc}): "
                               "project the memory once per layer before the loop (cross_attn.project_memory) and "
                               "pass the result to every step as memory_kv.")
            after = result.get(case.id, "src_after", what="src_ids after the call", kind="tensor")
            if not np.array_equal(after, d["src"]):
                raise Fail(f"greedy_decode_cached modified the caller's src_ids in place ({case.desc}).")


# -- beam_search_cached ------------------------------------------------------------------------------------------------
@exercise(LESSON, "beam_search_cached", points=2)
class BeamSearchCached(Exercise):
    """Beam for beam the reference beam_search (lesson 08) on a model with loaded weights (both norm placements,
    beam sizes 1 to 4, length penalties 0 to 1, EOS ids that end rows at different steps and one never generated,
    B = 1, pad_id != 0); the memory's keys projected once per layer; the caller's source unchanged."""

    uses = ("KVCache", "cached_causal_mask", "decode_step")  # built from them
    reference = ref
    # Judged on a wrong KVCache or decode_step, the answers alone cannot show a cache that was never reordered
    # (the student's recorded steps already saw their unreordered cache): the reorder calls themselves must match.
    required_calls = ("KVCache.reorder",)
    required_message = ("after each step's top-k, reorder the cache with cache.reorder(rows), the same parent rows "
                        "(b * K + beam index) that reorder the token histories; your code did not make that call "
                        "with those rows")

    def cases(self, rng):
        cases = []
        specs = ((True, 3, 3, 0.6, int(rng.integers(3, 9))), (False, 2, 2, 1.0, 0),
                 (bool(rng.integers(2)), 1, 4, 0.0, int(rng.integers(3, 9))), (True, 2, 1, 0.6, 0))
        for index, (norm_first, B, K, alpha, pad_id) in enumerate(specs):
            model, state = _random_model(rng, norm_first)
            src, is_real = _source(rng, B, 7)
            mask = is_real if B > 1 else None
            endless = ref_gen.greedy_decode(model, _tensor(src), 10, BOS, -1, src_is_real=_tensor(mask))
            # EOS ids from the later greedy tokens: beams run long enough for their order to change, then end
            candidates = sorted(set(endless[:, 4:8].flatten().tolist()))
            eos_id = 1 if index == 2 else int(rng.choice(candidates))  # BOS's id is never generated: no stop
            max_len = 8 if eos_id == 1 else 10
            want = ref_gen.beam_search(model, _tensor(src), max_len, BOS, eos_id, beam_size=K, length_penalty=alpha,
                                       src_is_real=_tensor(mask), pad_id=pad_id).numpy()
            name = "pre-LN" if norm_first else "post-LN"
            desc = (f"{name}, B={B}, S=7, {'padded sources' if mask is not None else 'no src_is_real'}, "
                    f"beam_size={K}, length_penalty={alpha}, max_len={max_len}, pad_id={pad_id}, "
                    f"{'an EOS id never generated' if eos_id == 1 else 'beams ending at different steps'}")
            case = Case(f"beam{index}", desc, data={"want": want, "src": src, "B": B, "eos_id": eos_id,
                                                    "pad_id": pad_id})
            _build(case, state, norm_first)
            case.let("layers", {"attr": ["m", "decoder", "layers"]})
            for i in range(LAYERS):
                case.let(f"l{i}", {"index": ["layers", i]})
                case.let(f"count{i}", {"new": COUNTER})
                case.call({"attr": [f"l{i}", "cross_attn", "k_proj", "register_forward_hook"]}, {"ref": f"count{i}"})
            case.let("src", case.tensor(src))
            case.call("beam_search_cached", {"ref": "m"}, {"ref": "src"}, max_len, BOS, eos_id, beam_size=K,
                      length_penalty=alpha, src_is_real=None if mask is None else case.tensor(mask), pad_id=pad_id,
                      record="out")
            for i in range(LAYERS):
                case.record(f"calls{i}", {"attr": [f"count{i}", "calls"]})
            case.record("src_after", {"ref": "src"})
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            _raise_with_dependencies(result, case, "KVCache, cached_causal_mask and decode_step")
            d = case.data
            want = d["want"]
            got = result.get(case.id, "out", what="beam_search_cached(...)", kind="tensor", dtype="int")
            if got.ndim != 2 or got.shape[0] != d["B"]:
                raise Fail(f"beam_search_cached should return (B, L) ids with B = {d['B']}, got shape "
                           f"{tuple(got.shape)} ({case.desc}).")
            if got.shape != want.shape or not np.array_equal(got, want):
                if got.shape[1] == want.shape[1] + 1 and got.shape[1] > 0 and (got[:, 0] == BOS).all():
                    hint = "Your output starts with BOS: return the generated tokens only."
                else:
                    hint = ("Feed each beam's newest token only, at position = the step; after the top-k, reorder "
                            "the token histories and the cache with the same parent rows (cache.reorder(rows)); "
                            "rank, stop and pad as beam_search does.")
                raise Fail(f"beam_search_cached does not give beam_search's beams ({case.desc}). {hint}")
            for i in range(LAYERS):
                calls = int(result.get(case.id, f"calls{i}", what="the number of memory projections", kind="any"))
                if calls > 1:
                    raise Fail(f"layer {i}'s cross_attn.k_proj ran {calls} times in one search ({case.desc}): "
                               "project the (repeated) memory once per layer before the loop and pass it to every "
                               "step as memory_kv.")
            after = result.get(case.id, "src_after", what="src_ids after the call", kind="tensor")
            if not np.array_equal(after, d["src"]):
                raise Fail(f"beam_search_cached modified the caller's src_ids in place ({case.desc}).")


# -- prefill: find the bug (autograder.bugs), judged relative to the student's decode_step, KVCache, mask --------------
def _chunked(model, prefix: torch.Tensor, memory_kv, is_real, chunk_size: int, start) -> torch.Tensor:
    """The reference decode_step fed chunk i at position start(i, its width, chunk_size): a known wrong position."""
    cache, P = ref.KVCache(LAYERS), prefix.shape[1]
    for i in range((P + chunk_size - 1) // chunk_size):
        chunk = prefix[:, i * chunk_size: (i + 1) * chunk_size]
        logits, cache = ref.decode_step(model, chunk, memory_kv, cache, start(i, chunk.shape[1], chunk_size), is_real)
    return logits.numpy()


@exercise(LESSON, "prefill")
class Prefill(Exercise):
    """The given loop feeds a prefix to the student's decode_step chunk by chunk; the shown bug passes the chunk's
    index as its position. Against the full decoder at the prefix's last position and at one more token after it
    (the cache must hold every position), chunk sizes that divide the prefix, that do not, 1 and one chunk, both
    norm placements, padded sources; the cache's length; known wrong positions named."""

    uses = ("decode_step", "KVCache", "cached_causal_mask")  # decode_step runs the student's cache and mask
    reference = ref

    def cases(self, rng):
        cases = []
        specs = (("uneven", True, 3, 8, 3, "chunks of 3, 3 and 2 tokens"),
                 ("even", False, 2, 6, 2, "three chunks of 2 tokens"),
                 ("tokens", bool(rng.integers(2)), 1, 4, 1, "one token per chunk"),
                 ("whole", bool(rng.integers(2)), 2, 5, 8, "one chunk (chunk_size > P)"))
        for case_id, norm_first, B, P, chunk_size, what in specs:
            model, state = _random_model(rng, norm_first)
            src, is_real = _source(rng, B, 6)
            mask = is_real if B > 1 else None
            prefix = np.concatenate([np.full((B, 1), BOS), rng.integers(3, V, size=(B, P))], axis=1)  # (B, P + 1)
            with torch.no_grad():
                memory = model.encode(_tensor(src), _tensor(mask))
                memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]
            name = "pre-LN" if norm_first else "post-LN"
            desc = (f"{name}, B={B}, {'padded sources' if mask is not None else 'no src_is_real'}, a prefix of "
                    f"P={P} tokens, chunk_size={chunk_size}: {what}")
            case = Case(case_id, desc, data={"model": model, "src": src, "is_real": mask, "prefix": prefix,
                                             "P": P, "chunk_size": chunk_size, "memory_kv": memory_kv})
            _build(case, state, norm_first)
            case.let("mkv", {"list": [{"tuple": [case.tensor(k), case.tensor(v)]} for k, v in memory_kv]})
            case.call("KVCache", LAYERS, let="cache")
            case.let("prefix", case.tensor(prefix[:, :P]))
            real = case.tensor(mask) if mask is not None else None
            case.call("prefill", {"ref": "m"}, {"ref": "prefix"}, {"ref": "mkv"}, {"ref": "cache"}, chunk_size,
                      src_is_real=real, let="r")
            case.record("logits", {"index": ["r", 0]})
            case.let("cache", {"index": ["r", 1]})
            case.record("length", {"attr": ["cache", "length"]})
            # one more token after the prefix, at position P: it reads every cached position
            case.call("decode_step", {"ref": "m"}, case.tensor(prefix[:, P:]), {"ref": "mkv"}, {"ref": "cache"}, P,
                      src_is_real=real, let="r2")
            case.record("next", {"index": ["r2", 0]})
            case.record("prefix_after", {"ref": "prefix"})
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            _raise_with_dependencies(result, case, "decode_step, KVCache and cached_causal_mask")
        for case in result.cases.values():
            d = case.data
            B, P, chunk = d["prefix"].shape[0], d["P"], d["chunk_size"]
            prefix, is_real = _tensor(d["prefix"]), _tensor(d["is_real"])
            with torch.no_grad():
                memory = d["model"].encode(_tensor(d["src"]), is_real)
                full = d["model"].decode(prefix, memory, src_is_real=is_real).numpy()  # (B, P + 1, V)
            got = result.get(case.id, "logits", what="prefill's logits", kind="tensor", dtype="float", shape=(B, V))
            if not np.allclose(got, full[:, P - 1], rtol=1e-4, atol=1e-4):
                with torch.no_grad():
                    fed = functools.partial(_chunked, d["model"], prefix[:, :P], d["memory_kv"], is_real, chunk)
                    mistakes = {
                        "chunk i fed at position i, its index: right for one token per chunk or a single chunk, "
                        "and wrong for every later chunk of several tokens": fed(lambda i, width, size: i),
                        "each chunk fed at the position of its last token: decode_step's position is its first "
                        "token's": fed(lambda i, width, size: (i + 1) * size - 1),
                        "chunk i fed at i times the length of this chunk: a shorter last chunk lands too early":
                            fed(lambda i, width, size: i * width),
                    }
                hint = next((f"Your logits are those of {why}." for why, want in mistakes.items()
                             if np.allclose(got, want, rtol=1e-4, atol=1e-4)),
                            "Each chunk must be fed at the absolute position of its first token in the prefix.")
                raise Fail(f"prefill's logits differ from the full decoder's at the prefix's last position "
                           f"({case.desc}). {hint}")
            length = int(result.get(case.id, "length", what="the cache's length after prefill", kind="any"))
            if length != P:
                raise Fail(f"after prefill of P={P} tokens the cache holds {length} positions ({case.desc}): every "
                           "chunk's keys and values go into the cache, and the cache decode_step returns is the "
                           "one the next chunk gets.")
            nxt = result.get(case.id, "next", what="decode_step's logits after prefill", kind="tensor",
                             dtype="float", shape=(B, V))
            expect_close(nxt, full[:, P], f"the logits of one more token at position {P} after prefill (vs the full "
                         "decoder)", case.desc, rtol=1e-4, atol=1e-4,
                         hint="The prefill's own logits were right, but the cache it returned does not hold the "
                              "prefix's keys and values at their positions: return the cache of the last chunk.")
            after = result.get(case.id, "prefix_after", what="prefix_ids after the call", kind="tensor")
            if not np.array_equal(after, d["prefix"][:, :P]):
                raise Fail(f"prefill modified the caller's prefix_ids in place ({case.desc}).")
