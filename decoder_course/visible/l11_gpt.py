"""Visible checks of lesson 11-gpt: the BPE tokenizer, the GPT model, next-token batches and generation.

No reference answer is needed: the tokenizer's worked examples are small enough to do by hand (and are done in
the lesson), round trips and merge order are properties; ``GPT`` is compared with PyTorch's own
``nn.TransformerEncoderLayer(norm_first=True)`` stack run with a causal mask, into which the student's weights are
copied, and probed for leakage; the batches are read back from a stream of distinct ids; generation runs on
``decoder_course.testing.HashedLM``, whose logits are fixed by the prefix and whose past lives only in its cache.
``generate_long`` runs there too, with a spy around the student's own ``generate`` (the notebook's, put back
after the check) that records what each round hands it: only the rounds are on trial.
"""

from __future__ import annotations

import inspect
from collections import Counter
from unittest import mock

import numpy as np
import torch
from torch import nn

from decoder_course.checks import (
    CheckFailed,
    causal_leakage_probe,
    check,
    expect_close,
    expect_inputs_unchanged,
    expect_shape,
    expect_type,
    expect_value_error,
    randomised,
)
from decoder_course.spec import Perturbed, Seeded, Spec, run
from decoder_course.testing import HashedLM
from decoder_course.twins import torch_twin

UNICODE_SAMPLE = "naïve café — λx. x² 😀 漢字\n\tend"


def _expect_merges(got, want, what: str, hint: str) -> None:
    expect_type(got, (list, tuple), what)
    got = [tuple(int(t) for t in pair) for pair in got]
    if got != list(want):
        k = next((i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), min(len(got), len(want)))
        raise CheckFailed(f"{what} should be {list(want)}, got {got} (first difference at merge {k}): {hint}")


def _merged(ids: list[int], pair: tuple[int, int], new: int) -> list[int]:
    """``ids`` with every occurrence of ``pair``, left to right, replaced by ``new``: follows your merges along."""
    out, i = [], 0
    while i < len(ids):
        hit = i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair
        out.append(new if hit else ids[i])
        i += 2 if hit else 1
    return out


WORKED_MERGES = (  # (title, text, vocab_size, the merges, hint)
    ("'aaabdaaabac' with 3 merges: (a, a) -> 256, (256, a) -> 257, (257, b) -> 258", "aaabdaaabac", 259,
     [(97, 97), (256, 97), (257, 98)],
     "count the pairs of the *current* sequence after every merge; merge k makes token 256 + k"),
    ("a tie goes to the pair that occurs first, not the smallest or largest pair", "xy zw zw zw xy xy", 257,
     [(120, 121)], "'xy', ' z', 'zw' and 'w ' all occur 3 times; 'xy' comes first: max(counts, key=counts.get)"),
    ("'aaaa': overlapping pairs, then the new tokens merge too, then no pair is left", "aaaa", 300,
     [(97, 97), (256, 256)],
     "(a, a) occurs 3 times (overlapping), merges into [256, 256], then [257]; one token has no pair, so training "
     "stops early"),
)


def _tie_text(rng: np.random.Generator, smaller_first: bool) -> str:
    """Two pairs with the same count; which occurs first (and which is smaller) is chosen."""
    a, b, c, d = rng.choice(list("klmnpqrstvwxz"), size=4, replace=False)
    low, high = sorted([a + b, c + d])
    first, second = (low, high) if smaller_first else (high, low)
    n = int(rng.integers(3, 6))
    return f"{first} {second} " + " ".join([first] * n + [second] * n)


def _bpe_rows(rng: np.random.Generator) -> list:
    """Ties (the smaller or the larger pair first), random and Unicode texts, runs of one byte (overlapping pairs),
    a text that runs out of pairs, vocab_size <= 256, the empty text."""
    return [(desc, {"text": text, "vocab_size": vocab_size}) for text, vocab_size, desc in [
        (_tie_text(rng, True), 256 + 3, "a tie between two pairs, the smaller one first"),
        (_tie_text(rng, False), 256 + 3, "a tie between two pairs, the larger one first"),
        ("".join(rng.choice(list("ab c\n"), size=400)), 256 + int(rng.integers(20, 30)),
         "400 random characters over 'ab c\\n'"),
        ("".join(rng.choice(list(UNICODE_SAMPLE), size=200)), 256 + 25, "200 characters of 1 to 4 bytes"),
        ("x" * int(rng.integers(7, 12)) + " yy " + "x" * 5, 256 + 6, "long runs of one byte (overlapping pairs)"),
        ("abab", 256 + 10, "'abab' with room for 10 merges (it runs out of pairs)"),
        ("hello hello", 200, "vocab_size=200 (no merge)"),
        ("", 300, "the empty text")]]


def _each_most_frequent(ids: list[int], merges: list) -> bool:
    """Whether each of ``merges``, replayed on ``ids`` in order, is a most frequent pair of its step."""
    for k, pair in enumerate(merges):
        counts = Counter(zip(ids, ids[1:]))
        if not counts or counts.get(pair, 0) != max(counts.values()):
            return False
        ids = _merged(ids, pair, 256 + k)
    return True


def _most_frequent_each_step(args: dict, got: list, desc: str) -> None:
    """Replaying the merges: each is a pair of the sequence at its step, as frequent as any; no more than
    vocab_size - 256 of them, and fewer only when the sequence has no pair left."""
    ids, due = list(args["text"].encode("utf-8")), max(args["vocab_size"] - 256, 0)
    if len(got) > due:
        raise CheckFailed(f"train_bpe learned {len(got)} merges, at most vocab_size - 256 = {due} are due ({desc})")
    for k, pair in enumerate(got):
        counts = Counter(zip(ids, ids[1:]))
        n = counts.get(pair, 0)
        if not counts or n != max(counts.values()):
            code_points = [ord(c) for c in args["text"]]
            if code_points != list(args["text"].encode("utf-8")) and _each_most_frequent(code_points, got[:k + 1]):
                raise CheckFailed(f"merge {k}, {pair}, is the most frequent pair of the text's code points, not of its "
                                  f"UTF-8 bytes ({desc}): start from list(text.encode('utf-8')), where a character "
                                  "such as 'é' or '😀' is two to four bytes, never from ord(c)")
            if any(t >= 256 + k for t in pair):
                idea = "it uses an id that does not exist yet: merge k makes token 256 + k"
            elif n == 0:
                idea = ("it does not occur in the sequence at that step: after each merge, replace the pair "
                        "everywhere (merge_pair) and count again on the new sequence")
            else:
                idea = (f"another pair occurs {max(counts.values())} times: count every adjacent pair (overlapping, "
                        "pair_counts) and take the most frequent")
            raise CheckFailed(f"merge {k}, {pair}, occurs {n} times at its step ({desc}): {idea}")
        ids = _merged(ids, pair, 256 + k)
    if len(got) < due and len(ids) >= 2:
        raise CheckFailed(f"train_bpe stopped after {len(got)} merges, {due} were due ({desc}): merge vocab_size - "
                          "256 times, stopping early only when fewer than two tokens are left")


def check_train_bpe(train_bpe) -> None:
    """The lesson's worked examples (a tie, runs of one byte), then the rows: each merge the most frequent pair of
    its step, vocab_size - 256 of them unless the pairs run out."""
    for title, text, vocab_size, want, hint in WORKED_MERGES:
        with check(title):
            _expect_merges(train_bpe(text, vocab_size), want, f"train_bpe({text!r}, {vocab_size})", hint)
    run(SPECS["train_bpe"], train_bpe)


def check_bpe_tokenizer(BPETokenizer) -> None:  # noqa: N803 - the class under test
    """Hand-made merges: the vocabulary, encode in merge order, exact round trips, cut characters, a bad id."""
    with check("vocab: 256 bytes then one token per merge; vocab_size = 256 + len(merges)"):
        tok = BPETokenizer([(97, 97), (256, 98)])  # "aa", then "aab"
        if tok.vocab_size != 258:
            raise CheckFailed(f"vocab_size is {tok.vocab_size}, should be 256 + 2 = 258")
        if tok.decode([257]) != "aab":
            raise CheckFailed(f"decode([257]) is {tok.decode([257])!r}, should be 'aab': vocab[256 + k] is "
                              "vocab[a] + vocab[b], the bytes of the merged pair")
    with check("encode applies the merges in the order they were learned"):
        tok = BPETokenizer([(97, 97), (256, 98)])
        got = tok.encode("aaaab aab")
        expect_type(got, list, "encode('aaaab aab')")
        if got != [256, 257, 32, 257]:
            raise CheckFailed(f"encode('aaaab aab') should be [256, 257, 32, 257] (merge (a, a) everywhere, left to "
                              f"right, then (256, b)), got {got}")
        tok = BPETokenizer([(98, 99), (97, 98)])  # "bc" first, then "ab"
        if tok.encode("abc") != [97, 256]:
            raise CheckFailed(f"with merges [(b, c), (a, b)], encode('abc') should be [97, 256]: 'bc' was learned "
                              f"first, so it is merged first; got {tok.encode('abc')}")
    with check("decode(encode(text)) == text for Unicode, text the merges never saw, and the empty string"):
        tok = BPETokenizer([(32, 0xCE), (256, 0xBB), (101, 32)])  # " " + the first byte of "λ", then " λ"
        for text in (" λ λx", UNICODE_SAMPLE, "", "\x00\x7f 🙂"):
            ids = tok.encode(text)
            if any(not isinstance(i, int) or not 0 <= i < tok.vocab_size for i in ids):
                raise CheckFailed(f"encode({text!r}) holds ids that are not Python ints in 0 .. vocab_size - 1")
            back = tok.decode(ids)
            expect_type(back, str, f"decode(encode({text!r}))")
            if back != text:
                raise CheckFailed(f"decode(encode({text!r})) gave {back!r}: join every token's bytes first, then "
                                  "decode them once as UTF-8 (a character may be split across tokens)")
    with check("decode of cut characters gives U+FFFD; a tensor of ids decodes; an id out of range raises"):
        tok = BPETokenizer([(32, 0xCE)])
        lam = list("λ".encode())
        if tok.decode([lam[0]]) != "\ufffd":
            raise CheckFailed(f"decode([0xce]) gave {tok.decode([lam[0]])!r}, should be '\\ufffd': decode with "
                              "errors='replace'")
        if tok.decode(torch.tensor([104, 105])) != "hi":
            raise CheckFailed("decode(torch.tensor([104, 105])) should be 'hi': accept a 1-D tensor too")
        try:
            tok.decode([104, tok.vocab_size])
        except (ValueError, IndexError, KeyError):
            pass
        else:
            raise CheckFailed("decode([104, vocab_size]) returned: an id outside the vocabulary should raise")


def _torch_layers(model, n_heads: int, d_ff: int) -> list:
    """PyTorch's own encoder layers (norm_first=True) holding the student's weights (``decoder_course.twins``): a
    decoder-only layer's feed-forward norm is its norm3, the encoder layer's norm2."""
    return [torch_twin({key.replace("norm3.", "norm2.", 1): value for key, value in layer.state_dict().items()},
                       "encoder", n_heads, d_ff=d_ff, norm_first=True) for layer in model.layers]


def _expect_seeded(run, what: str, hint: str, other: str | None = None):
    """``run(generator)`` gives the same result twice with generator seed 5 under two different global random states
    (the generator alone decides), and, where ``other`` says why it must, another result with seed 6."""
    torch.manual_seed(1)
    first = run(torch.Generator().manual_seed(5))
    torch.manual_seed(2)
    if not torch.equal(run(torch.Generator().manual_seed(5)), first):
        raise CheckFailed(f"two calls of {what} with generator seed 5 gave different results: {hint}")
    if other is not None and torch.equal(run(torch.Generator().manual_seed(6)), first):
        raise CheckFailed(f"{what} gave the same result with generator seeds 5 and 6: {other}")
    return first


def check_gpt(GPT, KVCache) -> None:  # noqa: N803 - the classes under test
    """Names and tied weights, equal to PyTorch's encoder layers with a causal mask, no leakage, the cache path."""
    V, D, H, F, L, M = 40, 32, 4, 48, 2, 16
    torch.manual_seed(0)
    model = GPT(V, D, H, F, L, M, dropout=0.1)
    with check("submodules tok_embed, pos_embed, layers (no cross-attention), norm, out_proj tied to tok_embed"):
        for name in ("tok_embed", "pos_embed", "layers", "norm", "out_proj"):
            if not hasattr(model, name):
                raise CheckFailed(f"GPT has no `{name}`: the names are part of the contract")
        if len(model.layers) != L or any(layer.cross_attn is not None for layer in model.layers):
            raise CheckFailed(f"layers should be {L} DecoderLayer(..., norm_first=True, cross_attn=False)")
        if model.out_proj.weight is not model.tok_embed.weight:
            raise CheckFailed("out_proj.weight is not tok_embed.weight: tie them (self.out_proj.weight = "
                              "self.tok_embed.weight)")
        if model.out_proj.bias is not None:
            raise CheckFailed("out_proj has a bias: nn.Linear(d_model, vocab, bias=False)")
        std = float(model.tok_embed.weight.detach().std())
        if std > 0.1:
            raise CheckFailed(f"tok_embed starts with std {std:.2f}: initialise both embeddings at N(0, 0.02²); "
                              "tied to the output, N(0, 1) gives logits of size ~sqrt(D) at the start")
    randomised(model, 0, scale=0.3).eval()  # weights far from their initial values, so that every part shows
    ids = torch.randint(0, V, (3, 9), generator=torch.Generator().manual_seed(0))  # (B, T)
    with check("logits (B, T, V) equal PyTorch's nn.TransformerEncoderLayer stack with a causal mask"):
        logits = model(ids)
        expect_type(logits, torch.Tensor, "GPT(...)(ids)")
        causal = nn.Transformer.generate_square_subsequent_mask(9)  # PyTorch's polarity: -inf = blocked
        with torch.no_grad():
            x = model.tok_embed(ids) + model.pos_embed(torch.arange(9))  # (B, T, D)
            for layer in _torch_layers(model, H, F):
                x = layer(x, src_mask=causal, is_causal=True)
            want = model.norm(x) @ model.tok_embed.weight.T  # (B, T, V)
        expect_close(logits, want, "logits", atol=1e-4, rtol=1e-4, names="B T V",
                     hint="token + position embeddings, every layer with the causal mask as self_allowed, the final "
                          "norm, then out_proj")
    with check("no leakage: changing the tokens after any position leaves the logits up to it unchanged"):
        causal_leakage_probe(model, ids, time_axis=1, what="the logits: pass the causal mask to every layer")
    with check("with a KVCache: a prefill of 4 tokens, a chunk of 3 (several new tokens after a non-empty cache), "
               "then one at a time, gives the full forward's logits"):
        cache = KVCache(L)
        with torch.no_grad():
            full = model(ids)
            parts = []
            for a, b in ((0, 4), (4, 7), (7, 8), (8, 9)):
                try:
                    parts.append(model(ids[:, a:b], cache))
                except Exception as exc:  # noqa: BLE001 - any failure here is the promise broken
                    raise CheckFailed(
                        f"GPT raised on {b - a} new tokens after a cache of {a} positions ({type(exc).__name__}: "
                        f"{exc}): the docstring promises any number of new positions per call, so the mask is "
                        "(T_new, S), aligned to absolute positions (cached_causal_mask(positions, S)), not a "
                        "(T_new, T_new) causal mask") from None
            cached = torch.cat(parts, 1)
        if cache.length != 9:
            raise CheckFailed(f"after 9 positions the cache holds {cache.length}: each layer appends its keys and "
                              "values with cache.update(k, v, layer_idx)")
        expect_close(cached, full, "cached logits", atol=1e-4, rtol=1e-4,
                     hint="the new tokens are at positions cache.length .. (read it before the first layer updates "
                          "it); attend over all cached keys with cached_causal_mask(positions, S): a chunk of "
                          "several new tokens sees the cached past and its own earlier tokens")
    with check("more than max_len positions raise ValueError"):
        expect_value_error(lambda: model(torch.zeros(1, M + 1, dtype=torch.long)),
                           f"GPT was given {M + 1} positions with max_len={M}")


def _batch_rows(rng: np.random.Generator) -> list:
    """Streams of distinct ids (each window's offset is read back), a seeded generator; a short stream drawn 300
    times (every start must come up), int32 ids. The first row is called twice with the same seed: the second
    call must draw the same windows, whatever the global random state has become."""
    N, block = int(rng.integers(40, 60)), int(rng.integers(5, 9))
    draws = {"ids": rng.permutation(1000)[:N].astype(np.int64) + 3, "block": block, "batch": 6,
             "generator": Seeded(int(rng.integers(2**31)))}
    short = {"ids": rng.permutation(500)[:8].astype(np.int32), "block": 5, "batch": 300,
             "generator": Seeded(int(rng.integers(2**31)))}
    return [(f"a stream of N={N} distinct ids, block={block}, batch=6, a seeded generator", draws,
             Perturbed(draws, lambda x: x, "two calls with generators of the same seed gave different batches: draw "
                                           "the offsets with torch.randint(..., generator=generator), never from the "
                                           "global random state")),
            ("a stream of N=8 int32 ids, block=5, batch=300 (3 possible starts)", short)]


def _windows(args: dict, got: list, desc: str) -> None:
    """Targets are the inputs shifted by one; each row is a window of the stream; a long batch draws every start."""
    (x, y), ids, block = got, args["ids"], args["block"]
    if not np.array_equal(x[:, 1:], y[:, :-1]):
        raise CheckFailed(f"targets are not the inputs shifted by one ({desc}): targets[:, t] is the token that "
                          "follows inputs[:, t], i.e. ids[o + 1 : o + block + 1]")
    where = {int(v): i for i, v in enumerate(ids.tolist())}
    starts = [where.get(int(row[0]), -1) for row in x]
    for r, o in enumerate(starts):
        if o < 0 or o + block + 1 > len(ids) or not np.array_equal(x[r], ids[o:o + block]) \
                or not np.array_equal(y[r], ids[o + 1:o + block + 1]):
            raise CheckFailed(f"row {r} is not a window ids[o : o + block] with its targets ids[o + 1 : o + block + "
                              f"1] ({desc})")
    if len(x) >= 100 * (len(ids) - block) and set(starts) != set(range(len(ids) - block)):
        raise CheckFailed(f"the starts drawn were {sorted(set(starts))}, but every start 0 .. N - block - 1 = "
                          f"{len(ids) - block - 1} must be possible ({desc}): torch.randint(0, N - block, (batch,)) "
                          "(its high end is exclusive)")


def _window_error(args: dict, error: str) -> str:
    """An index past the stream: a start drawn too high, whose window or target runs off the end."""
    if "IndexError" in error or "out of bounds" in error or "out of range" in error:
        return ("An index ran past the end of the stream: the last start is N - block - 1, so that the window's "
                "target ids[o + block] still exists; draw torch.randint(0, N - block, (batch,)) (its high end is "
                "exclusive).")
    return ""


SPECS = {
    "train_bpe": Spec(
        "train_bpe", _bpe_rows, dtype=lambda a: None, shape=lambda a: (), listed=True,
        properties=_most_frequent_each_step,
        hint="On a tie take the pair that occurs first in the current sequence (max(counts, key=counts.get) over "
             "pair_counts, whose keys are in order of first occurrence), not the smallest or the largest pair."),
    "lm_batches": Spec(
        "lm_batches", _batch_rows, dtype=lambda a: np.int64, shape=lambda a: ((a["batch"], a["block"]),) * 2,
        outputs=("inputs", "targets"), axes=("batch, block",) * 2, properties=_windows, tensors=True,
        on_error=_window_error,
        refused=(("a stream of N = block tokens", {"ids": np.arange(6), "block": 6, "batch": 2,
                                                    "generator": Seeded(0)},
                  "lm_batches was handed a stream of N = block tokens, and there is no window with a target"),),
        hint="The windows are valid but not the ones the generator's draws select: draw exactly torch.randint(0, "
             "N - block, (batch,), generator=generator), once, as the offsets."),
}


def check_lm_batches(lm_batches) -> None:
    """(batch, block) int64 pairs, shifted targets, windows of the stream, every start reachable, the generator
    decides, a stream of N <= block refused."""
    run(SPECS["lm_batches"], lm_batches)


def check_generate(generate) -> None:
    """On HashedLM: greedy tokens, the prompt kept, the cache used (one position per token), seeded draws,
    top-k, temperature."""
    with check("temperature 0: the greedy tokens, the prompt first, (B, T + max_new_tokens)"):
        model = HashedLM(12, seed=1, n_layers=2, max_len=16)
        prompt = torch.tensor([[3, 4, 5], [6, 7, 8]])
        out = expect_inputs_unchanged(generate, model, prompt, 6, temperature=0)
        expect_type(out, torch.Tensor, "generate(...)")
        expect_shape(out, (2, 9), "generate(...)")
        if not torch.equal(out[:, :3], prompt):
            raise CheckFailed("the output should start with the prompt")
        for b in range(2):
            for t in range(3, 9):
                best = int(model.next_logits(out[b, :t].tolist()).argmax())
                if int(out[b, t]) != best:
                    first = (" The first new token is the argmax of the prefill's last position: feed no prompt "
                             "token again after the prefill" if t == 3 else "")
                    raise CheckFailed(f"row {b}, position {t}: {int(out[b, t])} is not the argmax {best} of the "
                                      "logits after the tokens so far (feed the prompt once with a KVCache, then "
                                      f"only each new token).{first}")
    with check("the mode is left as it is: a model in training mode is still in training mode after generate"):
        if not model.training:
            raise CheckFailed("generate switched the model out of training mode: the caller puts the model in eval "
                              "mode before calling, and generate leaves the mode as it is (no model.eval() inside)")
    with check("the cache is used: the model runs the prompt once, then one position per new token"):
        if model.positions_run > 3 + 6:
            raise CheckFailed(f"the model ran {model.positions_run} positions per row for a prompt of 3 and 6 new "
                              "tokens: with a KVCache(len(model.layers)) feed the prompt once, then only each new "
                              "token (B, 1)")
    with check("a seeded generator reproduces the draws; another seed gives others"):
        model = HashedLM(12, seed=2, max_len=16)
        _expect_seeded(lambda g: generate(model, torch.zeros(6, 2, dtype=torch.long), 8, generator=g), "generate",
                       "draw with torch.multinomial(probs, 1, generator=generator)",
                       "at temperature 1 draw at random")
    with check("top_k=2: every drawn token is one of the 2 most likely, and both come up"):
        model = HashedLM(12, seed=3, max_len=8, scale=2.0)
        out = generate(model, torch.full((300, 1), 4), 1, top_k=2, generator=torch.Generator().manual_seed(0))
        top2 = set(model.next_logits([4]).topk(2).indices.tolist())
        if set(out[:, 1].tolist()) != top2:
            raise CheckFailed(f"with top_k=2 the first tokens drawn were {sorted(set(out[:, 1].tolist()))}, should be "
                              f"exactly {sorted(top2)}: keep the k largest logits (top_k_filter), then sample")
    with check("temperature 0.5 sharpens: first-token frequencies follow softmax(logits / 0.5)"):
        model = HashedLM(6, seed=4, max_len=8)
        out = generate(model, torch.full((3000, 1), 2), 1, temperature=0.5, generator=torch.Generator().manual_seed(0))
        want = torch.softmax(model.next_logits([2]).double() / 0.5, -1)
        freq = torch.bincount(out[:, 1], minlength=6).double() / 3000
        if ((freq - want).abs() > 5 * (want * (1 - want) / 3000).sqrt() + 0.01).any():
            raise CheckFailed(f"frequencies {[round(f, 3) for f in freq.tolist()]} vs softmax(logits / 0.5) "
                              f"{[round(w, 3) for w in want.tolist()]}: divide the logits by the temperature before "
                              "the softmax")


class _GenerateSpy:
    """Your own ``generate``, recording what each call was handed and what it returned."""

    def __init__(self, generate):
        self.generate, self.calls = generate, []

    def __call__(self, model, prompt_ids, max_new_tokens, *args, **kwargs):
        out = self.generate(model, prompt_ids, max_new_tokens, *args, **kwargs)
        self.calls.append((prompt_ids.clone(), int(max_new_tokens), out.clone()))
        return out


def _rounds(generate_long, model, prompt, new: int, keep: int) -> tuple[torch.Tensor, list]:
    """Run ``generate_long`` greedily with a spy in place of the notebook's ``generate`` (restored after)."""
    names = inspect.unwrap(generate_long).__globals__  # the notebook's names (under torch.no_grad's wrapper)
    if "generate" not in names:
        raise CheckFailed("generate_long calls generate, which is not defined: run generate's cell first")
    spy = _GenerateSpy(names["generate"])
    with mock.patch.dict(names, {"generate": spy}):
        out = expect_inputs_unchanged(generate_long, model, prompt, new, keep, temperature=0)
    return out, spy.calls


def _follow(out, calls, prompt, new: int, keep: int, max_len: int) -> None:
    """Each round must be handed the last ``keep`` tokens so far and append only its new tokens."""
    seq = prompt.clone()  # (B, L): the sequence as it must be after each round
    for r, (handed, n, answer) in enumerate(calls, start=1):
        L, want = seq.shape[1], seq[:, -keep:]
        if tuple(handed.shape) != tuple(want.shape) or not torch.equal(handed, want):
            width = handed.shape[1]
            start = next((s for s in range(L - width + 1) if torch.equal(seq[:, s:s + width], handed)), None)
            where = (f"positions {start}..{start + width - 1}" if start is not None else
                     f"{width} tokens that are no window")
            raise CheckFailed(
                f"round {r} handed generate {where} of the {L} tokens so far (the prompt, then each earlier round's "
                f"new tokens, all of them), expected the last {want.shape[1]}: positions {L - want.shape[1]}..{L - 1}. "
                "A round that is not handed the latest tokens continues another part of the text; a greedy model "
                "fed a window twice writes the same continuation twice. Print each round's prompt beside the "
                "sequence.")
        due = min(max_len - handed.shape[1], prompt.shape[1] + new - L)
        if n != due:
            raise CheckFailed(f"round {r} asked generate for {n} new tokens, expected min(max_len - len(prompt), "
                              f"tokens still due) = {due}")
        seq = torch.cat([seq, answer[:, handed.shape[1]:]], dim=1)  # this round's new tokens
    expect_shape(out, tuple(seq.shape), "generate_long(...)", names=["B", "T + max_new_tokens"])
    if not torch.equal(out, seq):
        raise CheckFailed("the output is not the prompt followed by every round's new tokens (each round's output "
                          "minus the prompt it was handed), in order")


LONG_RUNS = (  # (title, HashedLM seed, n_layers, max_len, prompt, new tokens, keep, rounds, their new tokens)
    ("one round (the continuation fits in max_len): exactly your generate's tokens, the prompt unchanged",
     5, 2, 12, [[3, 4, 5], [6, 7, 8]], 6, 8, 1, "6 new tokens after 3 fit in max_len = 12"),
    ("the probe: 14 new tokens with max_len = 8 and keep = 5; every round sees the latest 5 tokens",
     3, 2, 8, [[1, 2, 3], [9, 9, 4]], 14, 5, 4, "5, 3, 3 and 3 new tokens"),
    ("a prompt longer than keep: the first round already sees only its last keep tokens",
     4, 1, 8, [[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]], 5, 4, 2, "4 then 1 new tokens"),
)


def check_generate_long(generate_long) -> None:
    """Find the bug: a spy around your own ``generate`` records what each round hands it, so only the rounds are on
    trial: the latest ``keep`` tokens each time, as many new tokens as fit, every new token kept."""
    for title, seed, n_layers, max_len, prompt, new, keep, rounds, why in LONG_RUNS:
        with check(title):
            prompt = torch.tensor(prompt)  # (B, T)
            out, calls = _rounds(generate_long, HashedLM(11, seed=seed, n_layers=n_layers, max_len=max_len), prompt,
                                 new, keep)
            expect_type(out, torch.Tensor, "generate_long(...)")
            _follow(out, calls, prompt, new, keep, max_len)
            if len(calls) != rounds:
                raise CheckFailed(f"generate was called {len(calls)} times, expected {rounds} round(s) ({why})")
