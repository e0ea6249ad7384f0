"""Hidden checks of lesson 09-kv-cache (PyTorch): the cache, the aligned causal mask, a cached step, cached greedy.

``decode_step`` and ``greedy_decode_cached`` run on a model built in the kernel from the notebook's given
``Seq2SeqTransformer`` and loaded (strictly, by the contract's parameter names) with random weights drawn here.
The expected logits are the full, uncached decoder's (``model.decode`` of the reference model carrying the same
weights); the expected tokens are the reference ``greedy_decode``'s, compared token for token. The memory's
cross-attention keys and values are handed to ``decode_step`` precomputed, and ``greedy_decode_cached`` is watched
by a forward hook (``decoder_course.visible.l09_kv_cache.CallCounter``) on each layer's ``cross_attn.k_proj``:
projecting the memory once per layer is part of the exercise.

Each model case starts from :func:`_setup` (random weights, a padded source); the cached decoders share one case
maker (:func:`_decoding_case`) and one judge (:func:`_judge_decoding`).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from autograder.course.checks import judges, spec
from autograder.course.checks.exercises import exercise
from autograder.course.checks.framework import Case, Exercise, Fail, Result, expect_close
from autograder.course.reference import generation as ref_gen
from autograder.course.reference import kv_cache as ref
from autograder.course.reference.model import Seq2SeqTransformer
from decoder_course.conventions import BOS
from decoder_course.visible.l08_generation import expect_generated

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


def _wiring(norm_first: bool) -> str:
    return "pre-LN" if norm_first else "post-LN"


def _setup(rng: np.random.Generator, norm_first: bool, B: int, S: int):
    """A random model (and its state dict), source ids (B, S) padded at the end (row 0 full), the padding
    information ``src_is_real`` given to the student's code (None for B = 1), and that situation in words."""
    model, state = _random_model(rng, norm_first)
    is_real = judges.right_padded(rng, B, S)
    mask = is_real if B > 1 else None
    situation = f"{_wiring(norm_first)}, B={B}, S={S}, {'padded sources' if mask is not None else 'no src_is_real'}"
    return model, state, judges.token_ids(rng, B, S, V, is_real), mask, situation


def _build(case: Case, state: dict, norm_first: bool) -> None:
    """Steps binding ``m``: the notebook's Seq2SeqTransformer with the given weights, in eval mode."""
    case.call("Seq2SeqTransformer", V, V, D, H, F, LAYERS, dropout=0.1, tie_weights=False, norm_first=norm_first,
              let="m")
    case.load_state("m", state)
    case.eval("m")


def _tensor(x: np.ndarray | None) -> torch.Tensor | None:
    return None if x is None else torch.from_numpy(np.asarray(x))


def _stepping(case: Case, model, state: dict, norm_first: bool, src: np.ndarray, mask) -> list:
    """Steps binding ``m``, the memory's keys and values ``mkv`` (projected here, per layer) and an empty ``cache``;
    returns the trusted memory_kv."""
    with torch.no_grad():
        memory = model.encode(_tensor(src), _tensor(mask))
        memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]
    _build(case, state, norm_first)
    case.let("mkv", {"list": [{"tuple": [case.tensor(k), case.tensor(v)]} for k, v in memory_kv]})
    case.call("KVCache", LAYERS, let="cache")
    return memory_kv


def _full(model, src: np.ndarray, mask, tgt: np.ndarray, cross_mask: bool = True,
          seed: int | None = None) -> np.ndarray:
    """The full, uncached decoder's logits (B, T, V) for ``tgt``; without ``cross_mask`` its cross-attention sees the
    source padding (a known mistake); with a ``seed``, in training mode right after ``torch.manual_seed(seed)``
    (the memory is encoded in eval mode, as the kernel's memory_kv was)."""
    with torch.no_grad(), torch.random.fork_rng():
        memory = model.encode(_tensor(src), _tensor(mask))
        if seed is not None:
            model.train()
            torch.manual_seed(seed)
        try:
            return model.decode(_tensor(tgt), memory, src_is_real=_tensor(mask) if cross_mask else None).numpy()
        finally:
            model.eval()


def _raise_with_dependencies(result: Result, case: Case, uses: tuple[str, ...], own: str = "") -> None:
    """An exception on a case of an exercise built on others: show it, say what of the item's own code to look at
    (``own``), and which of the student's own pieces ran inside it (their bugs surface here too)."""
    error = result.error(case.id)
    if error is not None:
        runs = ", ".join(uses[:-1]) + f" and {uses[-1]}"
        raise Fail(f"your code raised an exception on a case with {case.desc}:\n    {error.splitlines()[-1]}\n"
                   + (f"{own} " if own else "")
                   + f"This exercise runs your {runs}: if one of their checks fails, fix it first.")


# -- KVCache -----------------------------------------------------------------------------------------------------------
@exercise(LESSON, "KVCache")
class KVCacheCheck(Exercise):
    """Appends along the sequence axis, per layer; returns everything cached; length counts positions; positions
    are 0 .. length - 1; one-layer update(k, v); the caller's k and v unchanged; reorder(index) keeps batch
    rows index (repeated or dropped) of every layer's keys and values."""

    def cases(self, rng):
        cases = []
        # (case id, situation, n_layers or None for KVCache() and update(k, v), (B, H, Dh), positions per update)
        rows = [("layers", "KVCache(n_layers=3), (B, H, Dh) = (2, 3, 4), a prefill of 2 positions then 2 single steps",
                 3, (2, 3, 4), [2, 1, 1]),
                ("single", "KVCache() and update(k, v) without layer_idx, (B, H, Dh) = (1, 2, 6)", None, (1, 2, 6),
                 [3, 1])]
        for case_id, desc, n_layers, (B, Hh, Dh), steps in rows:
            layers = range(n_layers or 1)
            ks, vs = ([[rng.standard_normal((B, Hh, t, Dh)).astype(np.float32) for t in steps] for _ in layers]
                      for _ in "kv")
            case = Case(case_id, desc, data={"ks": ks, "vs": vs, "steps": steps})
            case.call("KVCache", *([n_layers] if n_layers else []), let="cache")
            case.record("len0", {"attr": ["cache", "length"]})
            case.let("k", case.tensor(ks[0][0]))  # the first keys, found unchanged after every update
            for s in range(len(steps)):
                for layer in layers:
                    k = {"ref": "k"} if s == layer == 0 else case.tensor(ks[layer][s])
                    case.call({"attr": ["cache", "update"]}, k, case.tensor(vs[layer][s]),
                              *([layer] if n_layers else []), record=f"out{s}{layer}")
                case.record(f"len{s + 1}", {"attr": ["cache", "length"]})
            case.record("positions", {"attr": ["cache", "positions"]})
            judges.record_after(case, ["k"])
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
        for case_id in ("layers", "single"):  # appending first: reorder's case appends too
            case = result.cases[case_id]
            d = case.data
            error = result.error(case.id) or ""
            if "Sizes of tensors must match" in error:
                raise Fail(f"your update raised an exception ({case.desc}):\n    {error.splitlines()[-1]}\n"
                           "New positions are appended on the sequence axis: dim 2 of (B, H, S, Dh), where the "
                           "other sizes always match.")
            length = result.get(case.id, "len0", what="the length of a new cache", kind="any")
            if int(length) != 0:
                raise Fail(f"a new cache should have length 0, got {int(length)} ({case.desc}).")
            total = 0
            for s, t in enumerate(d["steps"]):
                total += t
                for layer in range(len(d["ks"])):
                    self._judge_update(result, case, f"out{s}{layer}", layer, s, total)
                length = result.get(case.id, f"len{s + 1}", what="cache.length", kind="any")
                if int(length) != total:
                    raise Fail(f"cache.length is {int(length)} after {total} cached positions ({case.desc}): it counts "
                               "positions (dim 2 of layer 0's keys), not calls to update.")
            positions = result.get(case.id, "positions", what="cache.positions", kind="tensor", dtype="int")
            if positions.tolist() != list(range(total)):
                raise Fail(f"cache.positions should be the absolute positions 0 .. {total - 1} ({case.desc}).")
            judges.unchanged(result, case.id, {"k": d["ks"][0][0]}, "update")
        if "reorder" in result.cases:
            self._judge_reorder(result)

    @staticmethod
    def _judge_update(result: Result, case: Case, name: str, layer: int, s: int, total: int) -> None:
        """What update returned at step s: every position cached so far for this layer, keys and values."""
        d = case.data
        meta = result.meta(case.id, name)
        if meta.get("type") not in ("tuple", "list") or meta.get("len") != 2:
            raise Fail(f"update should return a pair (k_all, v_all), got {meta.get('type')} ({case.desc}).")
        for i, (what, parts) in enumerate((("keys", d["ks"]), ("values", d["vs"]))):
            got = result.get(case.id, f"{name}/{i}", what=f"the {what} returned by update", kind="tensor",
                             dtype="float")
            want = np.concatenate(parts[layer][: s + 1], axis=2)  # (B, H, S, Dh)
            if got.shape != want.shape:
                hint = ("along the wrong axis: new positions go on the sequence axis, dim 2 of (B, H, S, Dh)"
                        if got.size == want.size else
                        "with the wrong number of positions: return everything cached for this layer, old "
                        "positions first")
                raise Fail(f"update returned {what} of shape {got.shape}, expected (B, H, S, Dh) = {want.shape} "
                           f"after {total} positions ({case.desc}): appended {hint}.")
            expect_close(got, want, f"the {what} of layer {layer} after {total} positions", case.desc, rtol=0, atol=0,
                         hint="Each layer keeps its own entries (index them with layer_idx); new positions are "
                              "appended after the old ones, nothing is changed.")

    @staticmethod
    def _judge_reorder(result: Result) -> None:
        case = result.cases["reorder"]
        d = case.data
        error = result.error(case.id)
        if error is not None:
            if "Sizes of tensors must match" in error:
                raise Fail(f"after reorder(index), update raised an exception ({case.desc}):\n    "
                           f"{error.splitlines()[-1]}\nA layer's keys or values kept their old batch rows: reorder "
                           "every layer, keys and values, along the batch axis: k.index_select(0, index).")
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


# -- decode_step -------------------------------------------------------------------------------------------------------
UNMASKED = ("the logits of a decoder whose cross-attention sees the source padding: pass src_is_real to every "
            "layer's cross-attention as allowed=src_is_real[:, None, None, :] (B, 1, 1, S), so that no query attends "
            "to padded memory positions")


IN_TRAINING = ("In training mode the docstring applies dropout as in the layers, where they apply it and in their "
               "order: the positional encoding's dropout on the embeddings, the self-attention weights' dropout, "
               "then dropout1, dropout2, dropout3 after the sublayers (the cross-attention and the feed-forward drop "
               "out inside their own modules).")


def _known_in_training(case: Case, got: np.ndarray) -> str:
    """The known mistake of decode_step whose training-mode logits on this case, after the case's seed, are the
    student's; or ""."""
    d = case.data
    model = d["model"]

    def produce(wrong):
        with torch.no_grad(), torch.random.fork_rng():
            memory = model.encode(_tensor(d["src"]), _tensor(d["is_real"]))
            memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]
            model.train()
            torch.manual_seed(d["seed"])
            try:
                return wrong(model, _tensor(d["tgt"]), memory_kv, ref.KVCache(LAYERS), 0, _tensor(d["is_real"]))[0]
            finally:
                model.eval()

    return spec.known_mistake(LESSON, "decode_step", got, produce, 1e-4, 1e-4)


@exercise(LESSON, "decode_step")
class DecodeStep(Exercise):
    """Logits of a prefill and of single steps against the full decoder (both norm placements, padded memory,
    B = 1 without a prefill); the cache grows by the new positions."""

    uses = ("KVCache", "cached_causal_mask")  # the steps use the notebook's cache and mask
    reference = ref

    def cases(self, rng):
        cases = []
        for norm_first, B, prefill, T in ((True, 3, 3, 7), (False, 2, 2, 6), (bool(rng.integers(2)), 1, 1, 4)):
            model, state, src, mask, situation = _setup(rng, norm_first, B, 6)
            tgt = np.concatenate([np.full((B, 1), BOS), rng.integers(3, V, size=(B, T - 1))], axis=1)  # (B, T)
            steps = [(0, prefill)] + [(a, a + 1) for a in range(prefill, T)]  # positions a .. b - 1 fed at once
            case = Case(f"{_wiring(norm_first)}_{B}", f"{situation}, a prefill of {prefill} token(s) then single "
                        f"steps up to position {T - 1}", data={"model": model, "src": src, "is_real": mask, "tgt": tgt,
                                                               "steps": steps})
            _stepping(case, model, state, norm_first, src, mask)
            real = None if mask is None else case.tensor(mask)
            for i, (a, b) in enumerate(steps):
                case.call("decode_step", {"ref": "m"}, case.tensor(tgt[:, a:b]), {"ref": "mkv"}, {"ref": "cache"}, a,
                          src_is_real=real, let=f"r{i}")
                case.record(f"logits{i}", {"index": [f"r{i}", 0]})
                case.let("cache", {"index": [f"r{i}", 1]})  # the returned cache goes into the next step
            case.record("length", {"attr": ["cache", "length"]})
            cases.append(case)
        # training mode: dropout acts where the layers apply it, so after one seed a prefill draws the very masks the
        # full decoder draws (the same tensors, shapes and order)
        model, state, src, mask, situation = _setup(rng, bool(rng.integers(2)), 2, 6)
        T, seed = 5, int(rng.integers(2**31))
        tgt = np.concatenate([np.full((2, 1), BOS), rng.integers(3, V, size=(2, T - 1))], axis=1)  # (B, T)
        case = Case("train", f"{situation}, training mode (dropout 0.1), a prefill of {T} tokens right after "
                    "torch.manual_seed", data={"model": model, "src": src, "is_real": mask, "tgt": tgt,
                                                "steps": [(0, T)], "seed": seed})
        _stepping(case, model, state, model.decoder.layers[0].norm_first, src, mask)
        case.call({"attr": ["m", "train"]})
        case.seed(seed)
        case.call("decode_step", {"ref": "m"}, case.tensor(tgt), {"ref": "mkv"}, {"ref": "cache"}, 0,
                  src_is_real=case.tensor(mask), let="r0")
        case.record("logits0", {"index": ["r0", 0]})
        case.let("cache", {"index": ["r0", 1]})
        case.record("length", {"attr": ["cache", "length"]})
        cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            _raise_with_dependencies(result, case, self.uses)
            d = case.data
            B, T = d["tgt"].shape
            full = _full(d["model"], d["src"], d["is_real"], d["tgt"], seed=d.get("seed"))
            unmasked = None if d["is_real"] is None else _full(d["model"], d["src"], d["is_real"], d["tgt"], False,
                                                               seed=d.get("seed"))
            if d.get("seed") is not None:  # training mode
                got = result.get(case.id, "logits0", what="decode_step's logits", kind="tensor", dtype="float",
                                 shape=(B, V))
                known = "" if np.allclose(got, full[:, -1], rtol=1e-4, atol=1e-4) else _known_in_training(case, got)
                hint = f"Your values are those of a known mistake: {known}. " if known else ""
                expect_close(got, full[:, -1], f"decode_step's logits at position {T - 1} in training mode (vs the "
                             "full decoder after the same seed)", case.desc, rtol=1e-4, atol=1e-4,
                             hint=hint + IN_TRAINING)
            for i, (a, b) in enumerate(d["steps"]):
                got = result.get(case.id, f"logits{i}", what="decode_step's logits", kind="tensor", dtype="float",
                                 shape=(B, V))
                hint = (f"These are the logits of position {b - 1} after a prefill of positions {a}..{b - 1}: the "
                        "new tokens attend causally among themselves (cached_causal_mask), every layer uses its own "
                        "wiring (norm_first), the stack ends with model.decoder.norm and model.out_proj, and only "
                        "the last new position's logits are returned." if i == 0 else
                        f"The prefill was right but the single step at position {a} is not: its positional encoding "
                        f"is row {a} of the table (not row 0), its query must see every cached key (a mask aligned "
                        "to absolute positions), and the cache must hold every earlier position of every layer.")
                hint = judges.diagnose(got, {UNMASKED: None if unmasked is None else unmasked[:, b - 1]}) or hint
                expect_close(got, full[:, b - 1], f"decode_step's logits at position {b - 1} (vs the full decoder)",
                             case.desc, rtol=1e-4, atol=1e-4, hint=hint)
            length = result.get(case.id, "length", what="the cache's length after the last step", kind="any")
            if int(length) != T:
                raise Fail(f"after positions 0..{T - 1} the returned cache holds {int(length)} positions "
                           f"({case.desc}): update the cache in every layer and return it.")


# -- greedy_decode_cached and beam_search_cached: one case maker, one judge ------------------------------------------
def _decoding_case(case_id: str, desc: str, fn: str, model, state: dict, norm_first: bool, src: np.ndarray, mask,
                   max_len: int, eos_id: int, want: np.ndarray, **kwargs) -> Case:
    """``fn(m, src_ids, max_len, BOS, eos_id, src_is_real=mask, **kwargs)`` on the notebook's model, recorded as
    ``out``, with a CallCounter on each layer's ``cross_attn.k_proj`` (``calls{i}``) and ``src_ids`` recorded again
    after the call."""
    case = Case(case_id, desc, data={"want": want, "src": src, "B": len(src), "eos_id": eos_id, "max_len": max_len,
                                     "pad_id": kwargs.get("pad_id", 0), "model": model, "mask": mask,
                                     "kwargs": kwargs})
    _build(case, state, norm_first)
    case.let("layers", {"attr": ["m", "decoder", "layers"]})
    for i in range(LAYERS):
        case.let(f"l{i}", {"index": ["layers", i]})
        case.let(f"count{i}", {"new": COUNTER})
        case.call({"attr": [f"l{i}", "cross_attn", "k_proj", "register_forward_hook"]}, {"ref": f"count{i}"})
    case.let("src_ids", case.tensor(src))
    case.call(fn, {"ref": "m"}, {"ref": "src_ids"}, max_len, BOS, eos_id,
              src_is_real=None if mask is None else case.tensor(mask), record="out", **kwargs)
    for i in range(LAYERS):
        case.record(f"calls{i}", {"attr": [f"count{i}", "calls"]})
    judges.record_after(case, ["src_ids"])
    return case


def _known_decoding_mistake(fn: str, case: Case, got: np.ndarray) -> str:
    """The known mistake of ``fn`` (its reference's MISTAKES) whose tokens on this case are the student's, or ""."""
    d = case.data

    def produce(wrong):
        with torch.no_grad():
            return wrong(d["model"], _tensor(d["src"]), d["max_len"], BOS, d["eos_id"], src_is_real=_tensor(d["mask"]),
                         **d["kwargs"])

    return spec.known_mistake(LESSON, fn, got, produce, 0.0, 0.0)


def _judge_decoding(result: Result, uses: tuple[str, ...], fn: str, like: str, outputs: str, hint, run: str,
                    memory: str, raised: str = "") -> None:
    """Each :func:`_decoding_case`: the ids of a generated batch (the public property), then the ``outputs`` of
    ``like`` (``hint(got, want)`` says what to look at, unless they are a known mistake's), the memory projected
    once per layer in one ``run``, ``src_ids`` unchanged; ``raised`` says where to look when it raised."""
    for case in result.cases.values():
        _raise_with_dependencies(result, case, uses, raised)
        d = case.data
        got = result.get(case.id, "out", what=f"{fn}(...)", kind="tensor", dtype="int")
        known = "" if got.shape == d["want"].shape and np.array_equal(got, d["want"]) else (
            _known_decoding_mistake(fn, case, got))
        if known:  # the mistake itself, before what its tokens happen to break (EOS and padding, say)
            raise Fail(f"{fn} does not give {like}'s {outputs} ({case.desc}): yours are those of a known mistake, "
                       f"{known}.")
        with spec.shared():
            expect_generated(got, d["B"], d["max_len"], d["pad_id"], f"{fn}'s output", case.desc, d["eos_id"],
                             special=False)  # pad_id may be a token the model generates
        if got.shape != d["want"].shape or not np.array_equal(got, d["want"]):
            with_bos = got.shape[1] == d["want"].shape[1] + 1 and got.shape[1] > 0 and (got[:, 0] == BOS).all()
            raise Fail(f"{fn} does not give {like}'s {outputs} ({case.desc}). " + (
                "Your output starts with BOS: return the generated tokens only." if with_bos else hint(got, d["want"])))
        for i in range(LAYERS):
            calls = int(result.get(case.id, f"calls{i}", what="the number of memory projections", kind="any"))
            if calls > 1:
                raise Fail(f"layer {i}'s cross_attn.k_proj ran {calls} times in one {run} ({case.desc}): project "
                           f"the {memory} once per layer before the loop (cross_attn.project_memory) and pass the "
                           "result to every step as memory_kv.")
        judges.unchanged(result, case.id, {"src_ids": d["src"]}, fn)


def _eos_id(rng: np.random.Generator, model, src: np.ndarray, mask, steps: slice) -> int:
    """An EOS id taken from the tokens greedy decoding generates at ``steps`` (rows then stop at different steps)."""
    endless = ref_gen.greedy_decode(model, _tensor(src), 10, BOS, -1, src_is_real=_tensor(mask))
    return int(rng.choice(sorted(set(endless[:, steps].flatten().tolist()))))


@exercise(LESSON, "greedy_decode_cached")
class GreedyDecodeCached(Exercise):
    """Token for token the reference greedy_decode on a model with loaded weights (both norm placements, several
    EOS ids so that rows stop at different steps, max_len 1, an EOS that never comes, B = 1, pad_id != 0); the
    memory's keys projected once per layer; the caller's source unchanged."""

    uses = ("KVCache", "cached_causal_mask", "decode_step")  # built from them
    reference = ref

    def cases(self, rng):
        cases = []
        for norm_first, B, pad_id in ((True, 4, int(rng.integers(3, 9))), (False, 3, 0),
                                      (bool(rng.integers(2)), 1, int(rng.integers(3, 9)))):
            model, state, src, mask, situation = _setup(rng, norm_first, B, 7)
            eos = _eos_id(rng, model, src, mask, slice(1, 5))  # a token of steps 1..4: rows stop at different steps
            for eos_id, max_len in ((eos, 1), (eos, 10), (1, 6)):  # 1, BOS's id, this model never emits: no stop
                want = ref_gen.greedy_decode(model, _tensor(src), max_len, BOS, eos_id, src_is_real=_tensor(mask),
                                             pad_id=pad_id).numpy()
                desc = (f"{situation}, max_len={max_len}, pad_id={pad_id}, "
                        f"{'an EOS id never generated' if eos_id == 1 else 'rows ending at different steps'}")
                cases.append(_decoding_case(f"{_wiring(norm_first)}_{B}_{eos_id}_{max_len}", desc,
                                            "greedy_decode_cached", model, state, norm_first, src, mask, max_len,
                                            eos_id, want, pad_id=pad_id))
        return cases

    def judge(self, result: Result):
        def hint(got, want):
            if got.shape[1] > want.shape[1]:
                return ("Your output is longer than greedy_decode's: stop when every row has emitted EOS, and give "
                        "finished rows pad_id.")
            return ("Each step feeds only the newest token, at position = the number of tokens fed so far (BOS at "
                    "0); take the argmax of the returned logits; finished rows get pad_id.")

        _judge_decoding(result, self.uses, "greedy_decode_cached", "greedy_decode", "tokens", hint, "generation",
                        "memory")


@exercise(LESSON, "beam_search_cached")
class BeamSearchCached(Exercise):
    """Beam for beam the reference beam_search (lesson 08) on a model with loaded weights: both norm placements,
    beam sizes 1 to 4, length penalties 0 to 2 (2 on a case where it changes a winner), EOS ids that end rows at
    different steps and one never generated, B = 1, pad_id != 0; the memory's keys projected once per layer; the
    caller's source unchanged."""

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
        rows = ((True, 3, 3, 0.6, int(rng.integers(3, 9))), (False, 2, 2, 2.0, 0),
                (bool(rng.integers(2)), 1, 4, 0.0, int(rng.integers(3, 9))), (True, 2, 1, 0.6, 0))
        for index, (norm_first, B, K, alpha, pad_id) in enumerate(rows):
            for _ in range(20):  # for the penalty of 2, a model and EOS id on which it changes a winner (with random
                # weights long beams score far lower: a penalty of 2 tips them, 0.6 seldom does)
                model, state, src, mask, situation = _setup(rng, norm_first, B, 7)
                # EOS ids from the later greedy tokens: beams run long enough for their order to change, then end;
                # BOS's id is never generated: no stop
                eos_id = 1 if index == 2 else _eos_id(rng, model, src, mask, slice(4, 8))
                max_len = 8 if eos_id == 1 else 10

                want, flat = (ref_gen.beam_search(model, _tensor(src), max_len, BOS, eos_id, beam_size=K,
                                                  length_penalty=penalty, src_is_real=_tensor(mask),
                                                  pad_id=pad_id).numpy() for penalty in (alpha, 0.0))
                if alpha < 1 or K == 1 or eos_id == 1 or not np.array_equal(want, flat):
                    break
            desc = (f"{situation}, beam_size={K}, length_penalty={alpha}, max_len={max_len}, pad_id={pad_id}, "
                    f"{'an EOS id never generated' if eos_id == 1 else 'beams ending at different steps'}")
            cases.append(_decoding_case(f"beam{index}", desc, "beam_search_cached", model, state, norm_first, src,
                                        mask, max_len, eos_id, want, beam_size=K, length_penalty=alpha,
                                        pad_id=pad_id))
        return cases

    def judge(self, result: Result):
        _judge_decoding(result, self.uses, "beam_search_cached", "beam_search", "beams", lambda got, want: (
            "Feed each beam's newest token only, at position = the step; after the top-k, reorder the token "
            "histories and the cache with the same parent rows (cache.reorder(rows)); rank, stop and pad as "
            "beam_search does."), "search", "(repeated) memory",
            raised="Every tensor decode_step gets has B * K rows, row b * K + j for beam j of sequence b: the "
                   "memory and src_is_real too, both repeated with repeat_interleave(beam_size, dim=0).")


# -- prefill: find the bug (autograder.course.bugs), judged relative to the student's decode_step, KVCache, mask -------
def _chunked(model, prefix: torch.Tensor, memory_kv, is_real, chunk_size: int, start) -> torch.Tensor:
    """The reference decode_step fed chunk i at position start(i, its width, chunk_size): a known wrong position."""
    cache, P = ref.KVCache(LAYERS), prefix.shape[1]
    for i in range((P + chunk_size - 1) // chunk_size):
        chunk = prefix[:, i * chunk_size: (i + 1) * chunk_size]
        logits, cache = ref.decode_step(model, chunk, memory_kv, cache, start(i, chunk.shape[1], chunk_size), is_real)
    return logits.numpy()


# known wrong chunk positions (i, the chunk's width, chunk_size) -> position, named when the logits match
WRONG_STARTS = {
    "the logits of chunk i fed at position i, its index: right for one token per chunk or a single chunk, and wrong "
    "for every later chunk of several tokens": lambda i, width, size: i,
    "the logits of each chunk fed at the position of its last token: decode_step's position is its first token's":
        lambda i, width, size: (i + 1) * size - 1,
    "the logits of chunk i fed at i times the length of this chunk: a shorter last chunk lands too early":
        lambda i, width, size: i * width,
}


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
        rows = (("uneven", True, 3, 8, 3, "chunks of 3, 3 and 2 tokens"),
                ("even", False, 2, 6, 2, "three chunks of 2 tokens"),
                ("tokens", bool(rng.integers(2)), 1, 4, 1, "one token per chunk"),
                ("whole", bool(rng.integers(2)), 2, 5, 8, "one chunk (chunk_size > P)"))
        for case_id, norm_first, B, P, chunk_size, what in rows:
            model, state, src, mask, situation = _setup(rng, norm_first, B, 6)
            prefix = np.concatenate([np.full((B, 1), BOS), rng.integers(3, V, size=(B, P))], axis=1)  # (B, P + 1)
            case = Case(case_id, f"{situation}, a prefix of P={P} tokens, chunk_size={chunk_size}: {what}",
                        data={"model": model, "src": src, "is_real": mask, "prefix": prefix, "P": P,
                              "chunk_size": chunk_size})
            case.data["memory_kv"] = _stepping(case, model, state, norm_first, src, mask)
            case.let("prefix_ids", case.tensor(prefix[:, :P]))
            real = case.tensor(mask) if mask is not None else None
            case.call("prefill", {"ref": "m"}, {"ref": "prefix_ids"}, {"ref": "mkv"}, {"ref": "cache"}, chunk_size,
                      src_is_real=real, let="r")
            case.record("logits", {"index": ["r", 0]})
            case.let("cache", {"index": ["r", 1]})
            case.record("length", {"attr": ["cache", "length"]})
            # one more token after the prefix, at position P: it reads every cached position
            case.call("decode_step", {"ref": "m"}, case.tensor(prefix[:, P:]), {"ref": "mkv"}, {"ref": "cache"}, P,
                      src_is_real=real, let="r2")
            case.record("next", {"index": ["r2", 0]})
            judges.record_after(case, ["prefix_ids"])
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            _raise_with_dependencies(result, case, self.uses)
        for case in result.cases.values():
            d = case.data
            B, P, chunk = d["prefix"].shape[0], d["P"], d["chunk_size"]
            full = _full(d["model"], d["src"], d["is_real"], d["prefix"])  # (B, P + 1, V)
            got = result.get(case.id, "logits", what="prefill's logits", kind="tensor", dtype="float", shape=(B, V))
            if not np.allclose(got, full[:, P - 1], rtol=1e-4, atol=1e-4):
                with torch.no_grad():
                    fed = functools.partial(_chunked, d["model"], _tensor(d["prefix"][:, :P]), d["memory_kv"],
                                            _tensor(d["is_real"]), chunk)
                    mistakes = {why: fed(start) for why, start in WRONG_STARTS.items()}
                hint = (judges.diagnose(got, mistakes)
                        or "Each chunk must be fed at the absolute position of its first token in the prefix.")
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
            judges.unchanged(result, case.id, {"prefix_ids": d["prefix"][:, :P]}, "prefill")
