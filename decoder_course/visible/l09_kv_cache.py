"""Visible checks of lesson 09-kv-cache: the cache object, the aligned causal mask, one cached decoding step, and
greedy decoding with the cache.

The oracle is always the uncached computation the lesson starts from: the full decoder (``model.decode``) for the
logits of a cached step, the given ``greedy_decode`` for the tokens, and a slice of the full ``(S, S)`` causal mask
for the cached mask. :class:`CallCounter` counts calls of a module through a forward hook, to see that the memory
is projected once per layer, not once per step.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from decoder_course.checks import (
    CheckFailed,
    check,
    expect_building_blocks,
    expect_close,
    expect_dtype,
    expect_inputs_unchanged,
    expect_shape,
    expect_type,
    padding_leakage_probe,
)
from decoder_course.conventions import BOS
from decoder_course.spec import Spec, run


def _mask_rows(rng: np.random.Generator) -> list:
    """Queries after a cache, one new query, no cache (T == S), scattered positions with more keys than the last."""
    p, one = int(rng.integers(3, 7)), int(rng.integers(4, 9))
    rows = [(np.arange(p, p + 3), p + 3, "3 new queries after a cache"), (np.array([one]), one + 1,
            "one new query, the usual cached step"), (np.arange(5), 5, "no cache: T == S"),
            (np.array([1, 3, 4]), 6, "queries at scattered positions, more keys than the last query")]
    return [(f"T={len(q)} queries, S={k_len} keys, {what}", {"q_positions": q.astype(np.int64), "k_len": k_len})
            for q, k_len, what in rows]


def _not_top_left(args: dict, got: np.ndarray, desc: str) -> None:
    T, S = got.shape
    if T < S and np.array_equal(got, np.tril(np.ones((T, S), dtype=bool))):
        raise CheckFailed(f"your triangle starts at the top-left corner, as is_causal=True does ({desc}): with a cache "
                          "the queries are the last positions, so compare key positions with the queries' absolute "
                          "positions")


CACHED_CAUSAL_MASK = Spec(
    "cached_causal_mask", _mask_rows, dtype=lambda a: np.bool_, shape=lambda a: (len(a["q_positions"]), a["k_len"]),
    axes="T, S", properties=_not_top_left, tensors=True,
    hint="Key k is allowed for a query at absolute position p when k <= p (itself included).")
SPECS = {"cached_causal_mask": CACHED_CAUSAL_MASK}


class CallCounter:
    """A forward hook that counts the calls of the module it is registered on.

    Example::

        counter = CallCounter()
        handle = layer.cross_attn.k_proj.register_forward_hook(counter)
        ...  # run something
        handle.remove()
        counter.calls  # how many times k_proj ran
    """

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, module, inputs, output) -> None:
        self.calls += 1


def _updated(cache, k, v, layer_idx: int, when: str):
    """``cache.update(k, v, layer_idx)`` with the caller's k and v found unchanged; an update that raises (two
    tensors that cannot be joined) fails naming the axis."""
    try:
        return expect_inputs_unchanged(cache.update, k, v, layer_idx)
    except RuntimeError as exc:
        raise CheckFailed(f"cache.update raised at {when}, layer {layer_idx}, with k of shape {tuple(k.shape)}: "
                          f"{type(exc).__name__}: {str(exc).splitlines()[0]}. New positions are appended on the "
                          "sequence axis, dim 2 of (B, H, S, Dh): the only size that differs between the cached "
                          "keys and the new ones") from None


def check_kv_cache(KVCache) -> None:
    """Appending along the sequence axis, per layer; length and positions; update(k, v) of a one-layer cache."""
    g = torch.Generator().manual_seed(0)
    B, H, Dh = 2, 3, 4
    with check("a new cache is empty: length 0, no positions"):
        cache = KVCache(n_layers=2)
        if cache.length != 0:
            raise CheckFailed(f"a new cache has length {cache.length}, expected 0")
        expect_shape(cache.positions, (0,), "positions of an empty cache")
    with check("update(k, v, layer_idx) appends along the sequence axis and returns everything cached"):
        ks = [torch.randn(B, H, t, Dh, generator=g) for t in (3, 1, 1)]  # a prefill of 3, then one per step
        vs = [torch.randn(B, H, t, Dh, generator=g) for t in (3, 1, 1)]
        for step, (k, v) in enumerate(zip(ks, vs, strict=True)):
            out = _updated(cache, k, v, 0, f"update {step + 1} (a prefill of 3 positions, then 1 per update)")
            expect_type(out, tuple, "cache.update(k, v, 0)")
            k_all, v_all = out
            n = 3 + step
            expect_shape(k_all, (B, H, n, Dh), f"keys after {step + 1} update(s)", names="B, H, S, Dh")
            expect_close(k_all, torch.cat(ks[: step + 1], dim=2), "the cached keys",
                         hint="new positions go after the old ones on the sequence axis: dim 2 of (B, H, S, Dh)")
            expect_close(v_all, torch.cat(vs[: step + 1], dim=2), "the cached values")
            cache.update(k * 10, v * 10, layer_idx=1)  # layer 1 gets its own entries
        if cache.length != 5:
            raise CheckFailed(f"after a prefill of 3 and two steps, length should be 5, got {cache.length}: it counts "
                              "cached positions, not calls")
        expect_close(cache.positions, torch.arange(5), "cache.positions",
                     hint="the absolute positions held: 0 .. length - 1")
    with check("each layer has its own keys and values"):
        k_all, _ = cache.update(torch.zeros(B, H, 1, Dh), torch.zeros(B, H, 1, Dh), layer_idx=1)
        expect_shape(k_all, (B, H, 6, Dh), "layer 1's keys", names="B, H, S, Dh")
        expect_close(k_all[:, :, :5], torch.cat(ks, dim=2) * 10, "layer 1's cached keys",
                     hint="keep one list entry per layer and index it with layer_idx")
    with check("KVCache() with update(k, v): a one-layer cache, layer_idx=0 by default"):
        single = KVCache()
        k_all, v_all = single.update(ks[0], vs[0])
        expect_shape(k_all, (B, H, 3, Dh), "keys of KVCache().update(k, v)", names="B, H, S, Dh")


def check_kv_cache_reorder(KVCache) -> None:
    """reorder(index) keeps batch rows ``index`` (repeated, dropped) of every layer's keys and values."""
    with check("reorder(index) keeps rows index of every layer, keys and values, in that order"):
        g = torch.Generator().manual_seed(3)
        cache = KVCache(2)
        ks = [torch.randn(3, 2, 4, 5, generator=g) for _ in range(2)]
        vs = [torch.randn(3, 2, 4, 5, generator=g) for _ in range(2)]
        for layer in range(2):
            cache.update(ks[layer], vs[layer], layer)
        index = torch.tensor([2, 2, 0, 1])  # beam 2 continued twice: rows repeat, and the batch grows to 4
        if not callable(getattr(cache, "reorder", None)):
            raise CheckFailed("KVCache has no reorder(index) method: beam search needs it")
        cache.reorder(index)
        if cache.length != 4:
            raise CheckFailed(f"after reorder the cache holds {cache.length} positions, not 4: reorder picks batch "
                              "rows (dim 0); the positions stay")
        for layer in range(2):
            new = torch.full((4, 2, 1, 5), float(layer + 1))
            try:
                k_all, v_all = cache.update(new, -new, layer)
            except RuntimeError as exc:
                raise CheckFailed(f"after reorder(index) with 4 rows, update of layer {layer} raised "
                                  f"{type(exc).__name__}: {str(exc).splitlines()[0]}. Layer {layer}'s keys and "
                                  "values kept their old batch rows: reorder every layer, keys and values "
                                  "(k.index_select(0, index))") from None
            expect_close(k_all, torch.cat([ks[layer][index], new], dim=2), f"layer {layer}'s keys after reorder",
                         hint="reorder every layer along the batch axis: k.index_select(0, index)")
            expect_close(v_all, torch.cat([vs[layer][index], -new], dim=2), f"layer {layer}'s values after reorder",
                         hint="the values must follow their beams too, not only the keys")


def check_cached_causal_mask(cached_causal_mask) -> None:
    """The lesson's example, the rows of the full causal mask, one query at the end, T == S."""
    with check("queries at positions 2, 3 over 4 keys"):
        got = cached_causal_mask(torch.tensor([2, 3]), 4)
        expect_type(got, torch.Tensor, "cached_causal_mask(...)")
        expect_dtype(got, "bool", "cached_causal_mask(...)")
        expect_shape(got, (2, 4), "cached_causal_mask(...)", names="T, S")
        want = torch.tensor([[True, True, True, False], [True, True, True, True]])
        if torch.equal(got, torch.ones(2, 4, dtype=torch.bool).tril()):
            raise CheckFailed("your triangle starts in the top-left corner, as is_causal=True does: query 0 of "
                              "this call is at absolute position 2, so it sees keys 0, 1 and 2")
        expect_close(got, want, "cached_causal_mask(torch.tensor([2, 3]), 4)",
                     hint="key k is allowed for a query at absolute position p when k <= p")
    with check("queries 4..6 over 7 keys are the last 3 rows of the full (7, 7) causal mask"):
        full = torch.ones(7, 7, dtype=torch.bool).tril()  # (S, S)
        expect_close(cached_causal_mask(torch.arange(4, 7), 7), full[4:], "cached_causal_mask(arange(4, 7), 7)")
        expect_close(cached_causal_mask(torch.arange(7), 7), full, "cached_causal_mask(arange(7), 7)",
                     hint="with no cache (T == S) it is the usual causal mask")
        expect_close(cached_causal_mask(torch.tensor([6]), 7), torch.ones(1, 7, dtype=torch.bool),
                     "one new query at the last position", hint="the newest token sees every cached key")
    run(CACHED_CAUSAL_MASK, cached_causal_mask)


def _small_model(Seq2SeqTransformer, norm_first: bool, seed: int = 0, V: int = 20):
    """An untrained model whose greedy outputs still vary (sharpened output layer; PAD and BOS never chosen)."""
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(V, V, 32, 4, 64, 2, dropout=0.1, tie_weights=False, norm_first=norm_first).eval()
    with torch.no_grad():
        model.out_proj.weight.mul_(3.0)
        model.out_proj.bias[:2] -= 100.0
    return model


def _source(B: int = 3, S: int = 6, V: int = 20, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([S, 3, 5, 2, 4, 6][:B])
    is_real = torch.arange(S)[None, :] < lengths[:, None]  # (B, S)
    return torch.randint(3, V, (B, S), generator=g).masked_fill(~is_real, 0), is_real


def _target(T: int, seed: int, B: int = 3, V: int = 20) -> torch.Tensor:
    """BOS, then T - 1 random tokens (never PAD, BOS or EOS). Shape: (B, T)."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.full((B, 1), BOS), torch.randint(3, V, (B, T - 1), generator=g)], dim=1)


def _memory_kv(model, memory) -> list:
    """Each decoder layer's cross-attention keys and values of the memory, projected once."""
    return [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]


def _uncached(model, src, is_real, tgt):
    """The oracle: the full decoder's logits at every position of tgt at once (B, T, V), and the memory's keys and
    values per layer for the cached calls."""
    with torch.no_grad():
        memory = model.encode(src, is_real)
        return model.decode(tgt, memory, src_is_real=is_real), _memory_kv(model, memory)


_NORMS = ((True, "pre-LN"), (False, "post-LN"))


def check_decode_step(decode_step, KVCache, Seq2SeqTransformer) -> None:
    """Source padding does not leak; cached logits equal the full decoder's at every step: a prefill of 3 tokens,
    then one at a time."""
    with check("source padding does not leak: the logits ignore what the memory holds at padded positions"):
        model = _small_model(Seq2SeqTransformer, True)
        src, is_real = _source()
        with torch.no_grad():
            memory = model.encode(src, is_real)

        def step(m):  # the logits of one step from BOS, reading the memory m: (B, 1, V)
            out = decode_step(model, torch.full((3, 1), BOS), _memory_kv(model, m), KVCache(len(model.decoder.layers)),
                              0, src_is_real=is_real)
            expect_type(out[0], torch.Tensor, "decode_step(...)[0], the logits")
            return out[0][:, None]

        try:
            padding_leakage_probe(step, memory, is_real, what="the step's logits")
        except CheckFailed as exc:
            raise CheckFailed(f"{exc}: the cross-attention attends to the source padding. Pass src_is_real to every "
                              "layer's cross-attention, allowed=src_is_real[:, None, None, :] (B, 1, 1, S)") from None
    for norm_first, name in _NORMS:
        with check(f"{name}: a prefill of 3 tokens then 4 single steps give the full decoder's logits"):
            model = _small_model(Seq2SeqTransformer, norm_first)
            src, is_real = _source()
            tgt = _target(7, seed=2)  # (B, 7)
            full, kv = _uncached(model, src, is_real, tgt)  # (B, 7, V): every position at once
            out = decode_step(model, tgt[:, :3], kv, KVCache(len(model.decoder.layers)), 0, src_is_real=is_real)
            expect_type(out, tuple, "decode_step(...)")
            logits, cache = out
            expect_shape(logits, (3, 20), "decode_step's logits", names="B, V")
            expect_close(logits, full[:, 2], "the logits after the prefill (position 2)", atol=1e-4,
                         hint="the new tokens attend causally among themselves too: pass cached_causal_mask(...) "
                              "to the self-attention; and only the last new position's logits are returned")
            for t in range(3, 7):
                logits, cache = decode_step(model, tgt[:, t : t + 1], kv, cache, t, src_is_real=is_real)
                expect_close(logits, full[:, t], f"the logits of the single step at position {t}", atol=1e-4,
                             hint="the new token's positional encoding is row `position` of the table (not row 0), "
                                  "its query sees every cached key (mask aligned to absolute positions), and the "
                                  "residual/norm wiring follows the layer's norm_first")
            if cache.length != 7:
                raise CheckFailed(f"after 7 positions the cache holds {cache.length}: update it in every layer")
    with check("in training mode dropout acts as in the layers: after one seed, a prefill gives the full decoder's "
               "logits in training mode"):
        model = _small_model(Seq2SeqTransformer, True).train()  # dropout 0.1
        src, is_real = _source()
        tgt = _target(5, seed=3)  # (B, 5)
        with torch.no_grad():
            memory = model.encode(src, is_real)
            kv = _memory_kv(model, memory)
            torch.manual_seed(11)
            full = model.decode(tgt, memory, src_is_real=is_real)[:, -1]  # (B, V): dropout drawn by the layers
            torch.manual_seed(11)
            logits, _ = decode_step(model, tgt, kv, KVCache(len(model.decoder.layers)), 0, src_is_real=is_real)
        expect_close(logits, full, "the logits of a prefill of 5 tokens in training mode, after torch.manual_seed(11)",
                     atol=1e-4, hint="in training mode the docstring applies dropout as in the layers, where they "
                                     "apply it and in their order: the positional encoding's dropout on the "
                                     "embeddings, the self-attention weights' dropout, then dropout1, dropout2, "
                                     "dropout3 after the sublayers (the cross-attention and the feed-forward drop "
                                     "out inside their own modules)")


def _building_blocks(item, Seq2SeqTransformer, reorder: bool = False) -> None:
    """The student's KVCache (with reorder, for beam search), cached_causal_mask and decode_step pass their own
    checks before ``item``'s are run: a wrong one is named, not blamed on ``item``."""
    KVCache = (getattr(inspect.unwrap(item), "__globals__", None) or {}).get("KVCache")  # the notebook's
    blocks = {"KVCache": (lambda block: (check_kv_cache(block), check_kv_cache_reorder(block))) if reorder
              else check_kv_cache, "cached_causal_mask": check_cached_causal_mask,
              "decode_step": lambda block: check_decode_step(block, KVCache, Seq2SeqTransformer)}
    *first, last = blocks
    names = f"{', '.join(first)} and {last}"
    with check(f"{item.__name__}'s building blocks, your {names}, pass their own checks"):
        expect_building_blocks(item, blocks)


def _check_as_uncached(cached, uncached, Seq2SeqTransformer, name, what, B, rows, hint, raised, **endless) -> None:
    """cached(...) gives uncached(...)'s tokens, for both norms, two EOS ids the model emits, and each row of
    keyword arguments (max_len among them); ``raised`` says where to look when it raises (its building blocks
    passed their checks: the shapes it hands them)."""
    for norm_first, norm in _NORMS:
        with check(f"{norm}: the same {what}"):
            model = _small_model(Seq2SeqTransformer, norm_first, seed=1)
            src, is_real = _source(B=B, seed=2)
            emitted = uncached(model, src, 8, BOS, eos_id=-1, src_is_real=is_real, **endless)  # an EOS never chosen
            for eos_id in sorted(set(emitted[:, 1:5].flatten().tolist()))[:2]:
                for row in rows:
                    args = (model, src, row["max_len"], BOS, eos_id)
                    kwargs = {key: value for key, value in row.items() if key != "max_len"}
                    want = uncached(*args, src_is_real=is_real, **kwargs)
                    try:
                        got = expect_inputs_unchanged(cached, *args, src_is_real=is_real, **kwargs)
                    except RuntimeError as exc:
                        raise CheckFailed(f"{name} raised {type(exc).__name__} on B={B} padded sources: "
                                          f"{str(exc).splitlines()[0]}. {raised}") from None
                    expect_type(got, torch.Tensor, f"{name}(...)")
                    setting = ", ".join(f"{key}={value}" for key, value in row.items())
                    expect_close(got, want, f"{name} with eos_id={eos_id}, {setting}", hint=hint)


def _check_memory_projected_once(cached, Seq2SeqTransformer, name, memory="memory", **kwargs) -> None:
    """A forward hook on every layer's cross_attn.k_proj counts its calls during 9 steps: at most one."""
    with check("the memory's keys and values are projected once per layer, not once per step"):
        model = _small_model(Seq2SeqTransformer, True, seed=2)
        src, is_real = _source(B=2, seed=3)
        counters = [CallCounter() for _ in model.decoder.layers]
        hooks = [layer.cross_attn.k_proj.register_forward_hook(c) for layer, c in zip(model.decoder.layers, counters)]
        try:
            out = cached(model, src, 9, BOS, eos_id=-1, src_is_real=is_real, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()
        expect_shape(out, (2, 9), f"{name}(..., max_len=9) with an EOS that never comes")
        calls = [c.calls for c in counters]
        if max(calls) > 1:
            raise CheckFailed(f"cross_attn.k_proj ran {calls} times per layer for 9 steps: project the {memory} "
                              "once per layer before the loop (layer.cross_attn.project_memory) and pass memory_kv")


def check_greedy_decode_cached(greedy_decode_cached, greedy_decode, Seq2SeqTransformer) -> None:
    """Exactly greedy_decode's tokens (several EOS ids and lengths, both norms), and the memory projected once."""
    _building_blocks(greedy_decode_cached, Seq2SeqTransformer)
    _check_as_uncached(greedy_decode_cached, greedy_decode, Seq2SeqTransformer, "greedy_decode_cached",
                       "tokens as greedy_decode for several EOS ids and max_len", 4, [{"max_len": 1}, {"max_len": 8}],
                       hint="feed only the newest token each step, at position = tokens generated so far; finished "
                            "rows get pad_id; stop when every row has finished",
                       raised="decode_step takes the newest token (B, 1), memory_kv from project_memory once per "
                              "layer, one KVCache with a slot per layer, and src_is_real (B, S)")
    _check_memory_projected_once(greedy_decode_cached, Seq2SeqTransformer, "greedy_decode_cached")


def check_beam_search_cached(beam_search_cached, beam_search, Seq2SeqTransformer) -> None:
    """Exactly beam_search's beams (several EOS ids, beam sizes, both norms), and the memory projected once."""
    rows = [dict(max_len=8, beam_size=3, length_penalty=0.6, pad_id=0),
            dict(max_len=8, beam_size=2, length_penalty=1.0, pad_id=5)]
    _building_blocks(beam_search_cached, Seq2SeqTransformer, reorder=True)
    _check_as_uncached(beam_search_cached, beam_search, Seq2SeqTransformer, "beam_search_cached",
                       "beams as beam_search for several EOS ids and beam sizes", 3, rows, beam_size=2,
                       hint="feed each beam's newest token only; after the top-k reorder the histories and the cache "
                            "by the same parent rows b * K + beam_idx (cache.reorder)",
                       raised="Every tensor decode_step gets has B * K rows, row b * K + j for beam j of sequence "
                              "b: the memory (before project_memory) and src_is_real too, both repeated with "
                              "repeat_interleave(beam_size, dim=0)")
    with check("beams that change places for 10 steps: the cache follows its beams (cache.reorder)"):
        model = _small_model(Seq2SeqTransformer, True, seed=4)
        src, is_real = _source(B=3, seed=1)
        want = beam_search(model, src, 10, BOS, eos_id=-1, beam_size=4, src_is_real=is_real)
        got = beam_search_cached(model, src, 10, BOS, eos_id=-1, beam_size=4, src_is_real=is_real)
        expect_close(got, want, "beam_search_cached with beam_size=4 over 10 steps (an EOS that never comes)",
                     hint="here the surviving beams come from different parents from step to step: after every "
                          "top-k, reorder the cache by the same rows b * K + beam_idx as the histories, or each "
                          "beam attends to another beam's past")
    with check("length_penalty decides between finished beams of different lengths, as in beam_search"):
        for seed in range(12):  # a model and EOS id on which the penalty changes the winner (beam_search says which)
            model = _small_model(Seq2SeqTransformer, seed % 2 == 0, seed=10 + seed)
            src, is_real = _source(B=3, seed=seed)
            emitted = beam_search(model, src, 8, BOS, eos_id=-1, beam_size=3, src_is_real=is_real)
            for eos_id in sorted(set(emitted[:, 1:6].flatten().tolist())):
                args, kwargs = (model, src, 8, BOS, eos_id), dict(beam_size=3, src_is_real=is_real)
                want = beam_search(*args, length_penalty=2.0, **kwargs)
                if not torch.equal(want, beam_search(*args, length_penalty=0.0, **kwargs)):
                    got = beam_search_cached(*args, length_penalty=2.0, **kwargs)
                    expect_close(got, want, f"beam_search_cached with eos_id={eos_id}, beam_size=3, length_penalty=2",
                                 hint="at the end pick each row's beam by the length-normalised score "
                                      "log_prob / ((5 + len) / 6) ** length_penalty, len counting tokens up to EOS")
                    break
            else:
                continue
            break
        else:
            raise RuntimeError("no case where length_penalty changes a winner: the check itself needs mending")
    _check_memory_projected_once(beam_search_cached, Seq2SeqTransformer, "beam_search_cached", "repeated memory",
                                 beam_size=3)


# -- prefill (find the bug) --------------------------------------------------------------------------------------------
def check_prefill(prefill, decode_step, KVCache, Seq2SeqTransformer) -> None:
    """Find the bug: the probe first (every chunk size gives the full decoder's logits at the prefix's last
    position), then the cache it leaves (one more token after it), its length, and the prefix unchanged."""
    _building_blocks(prefill, Seq2SeqTransformer)
    model = _small_model(Seq2SeqTransformer, True, seed=4)
    src, is_real = _source(seed=3)
    prefix = _target(8, seed=5)  # (B, 8)
    P = prefix.shape[1] - 1  # the prefix is the first 7 tokens; the 8th comes after it
    full, kv = _uncached(model, src, is_real, prefix)  # (B, 8, V): every position at once

    def run(chunk_size):
        return prefill(model, prefix[:, :P], kv, KVCache(len(model.decoder.layers)), chunk_size, src_is_real=is_real)

    with check(f"the probe: every chunk size gives the full decoder's logits at the prefix's last position ({P - 1})"):
        out = expect_inputs_unchanged(run, 1)
        expect_type(out, tuple, "prefill(...)")
        expect_shape(out[0], (3, 20), "prefill's logits", names="B, V")
        agree = {size: bool(torch.allclose(run(size)[0], full[:, P - 1], atol=1e-4)) for size in (1, 2, 3, P)}
        if not all(agree.values()):
            rows = "\n".join(f"        chunk_size {size}: {(P + size - 1) // size} chunk(s), "
                             f"{'the full decoder' if ok else 'differs'}" for size, ok in agree.items())
            raise CheckFailed(f"the logits after a prefix of {P} tokens depend on the chunk size:\n{rows}\n    Which "
                              "chunks do the sizes that work never have? Print, for each call of decode_step, the "
                              "positions of the chunk's tokens in the prefix and the position it is given.")

    with check(f"after prefill with chunk_size 3 the cache holds {P} positions, and one more token at position {P} "
               "gets the full decoder's logits"):
        logits, cache = run(3)
        if cache.length != P:
            raise CheckFailed(f"after prefill of {P} tokens the cache holds {cache.length} positions: every chunk "
                              "is cached, and each call gets the cache the one before returned")
        nxt, _ = decode_step(model, prefix[:, P:], kv, cache, P, src_is_real=is_real)
        expect_close(nxt, full[:, P], f"the logits of one more token at position {P}", atol=1e-4,
                     hint="the cache prefill returns must hold the prefix's keys and values at their own positions")
