"""Lesson 11's reference, proven: GPT against PyTorch's own encoder layers with a causal mask (copied weights), the
decoder-only DecoderLayer against nn.TransformerEncoderLayer, the cached path against the full forward; the BPE
tokenizer by properties on random texts (round trips, the most frequent pair first, ties to the first occurrence,
encode = training's sequence); batches and generation by their contracts."""

import random
from collections import Counter

import pytest
import torch
from torch import nn

from autograder.course.reference.decoder_layer import DecoderLayer
from autograder.course.reference.gpt import (
    GPT,
    BPETokenizer,
    KVCache,
    causal_allowed,
    generate,
    generate_long,
    lm_batches,
    load_from_torch_encoder_layers,
    merge_pair,
    train_bpe,
)
from autograder.course.reference.multi_head import load_from_torch_mha
from decoder_course.data import python_source_text
from decoder_course.testing import HashedLM

V, D, H, F_, L, M = 53, 32, 4, 64, 3, 20


def _torch_stack(seed: int) -> list[nn.TransformerEncoderLayer]:
    torch.manual_seed(seed)
    layers = [nn.TransformerEncoderLayer(D, H, F_, dropout=0.1, batch_first=True, norm_first=True).double().eval()
              for _ in range(L)]
    with torch.no_grad():
        for layer in layers:
            for p in layer.parameters():
                p.normal_(0.0, 0.3)
    return layers


def _gpt_from(layers) -> GPT:
    torch.manual_seed(1)
    model = GPT(V, D, H, F_, L, M, dropout=0.1).double()
    with torch.no_grad():
        model.tok_embed.weight.normal_(0.0, 0.5)
        model.pos_embed.weight.normal_(0.0, 0.5)
        model.norm.weight.normal_(1.0, 0.2)
        model.norm.bias.normal_(0.0, 0.2)
    return load_from_torch_encoder_layers(model, layers).eval()


@pytest.mark.parametrize("T", [1, 7, M])
def test_gpt_equals_pytorch_encoder_layers_with_a_causal_mask(T):
    theirs = _torch_stack(0)
    ours = _gpt_from(theirs)
    ids = torch.randint(0, V, (3, T))
    causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)  # PyTorch: -inf = blocked
    with torch.no_grad():
        x = ours.tok_embed(ids) + ours.pos_embed(torch.arange(T))
        for layer in theirs:
            x = layer(x, src_mask=causal, is_causal=True)
        want = nn.functional.linear(ours.norm(x), ours.tok_embed.weight)  # tied output, no bias
        got = ours(ids)
    assert got.shape == (3, T, V)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_decoder_only_layer_equals_encoder_layer_both_norm_placements():
    for norm_first in (False, True):
        torch.manual_seed(3)
        theirs = nn.TransformerEncoderLayer(D, H, F_, dropout=0.1, batch_first=True, norm_first=norm_first)
        theirs = theirs.double().eval()
        ours = DecoderLayer(D, H, F_, dropout=0.1, norm_first=norm_first, cross_attn=False).double().eval()
        assert ours.cross_attn is None and ours.norm2 is None
        assert not any(k.startswith(("cross_attn", "norm2")) for k in ours.state_dict())
        load_from_torch_mha(ours.self_attn, theirs.self_attn)
        with torch.no_grad():
            for mine, other in [(ours.feed_forward.linear1, theirs.linear1), (ours.feed_forward.linear2,
                                                                               theirs.linear2),
                                (ours.norm1, theirs.norm1), (ours.norm3, theirs.norm2)]:
                mine.weight.copy_(other.weight)
                mine.bias.copy_(other.bias)
        x = torch.randn(2, 6, D, dtype=torch.float64)
        want = theirs(x, src_mask=nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.float64),
                      is_causal=True)
        torch.testing.assert_close(ours(x, self_allowed=causal_allowed(6)), want, rtol=1e-10, atol=1e-10)


def test_a_layer_with_cross_attention_still_needs_memory():
    with pytest.raises(ValueError, match="memory"):
        DecoderLayer(D, H, F_)(torch.randn(1, 2, D))


def test_gpt_ties_and_initialises_small_and_refuses_more_than_max_len():
    model = GPT(300, 64, 4, 128, 2, 16)
    assert model.out_proj.weight is model.tok_embed.weight and model.out_proj.bias is None
    assert float(model.tok_embed.weight.detach().std()) < 0.03
    assert "cross_attn" not in str(list(model.state_dict()))
    with pytest.raises(ValueError):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_cached_forward_gives_the_full_forward_logits():
    model = _gpt_from(_torch_stack(5))
    ids = torch.randint(0, V, (2, 12))
    cache = KVCache(L)
    with torch.no_grad():
        parts = [model(ids[:, :5], cache)] + [model(ids[:, t:t + 1], cache) for t in range(5, 12)]
        torch.testing.assert_close(torch.cat(parts, dim=1), model(ids), rtol=1e-10, atol=1e-10)
    assert cache.length == 12


# -- the tokenizer, by properties ---------------------------------------------------------------------------------
ALPHABET = list("ab ab  \n\té😀漢λ{}()")


def _random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


@pytest.mark.parametrize("seed", range(6))
def test_each_merge_is_the_most_frequent_pair_ties_to_the_first_occurrence(seed):
    rng = random.Random(seed)
    text = _random_text(rng, rng.randint(50, 400))
    merges = train_bpe(text, 256 + 30)
    ids = list(text.encode("utf-8"))
    for k, pair in enumerate(merges):
        pairs = list(zip(ids, ids[1:]))
        counts = Counter(pairs)
        best = max(counts.values())
        assert counts[pair] == best, f"merge {k} is not a most frequent pair"
        first_best = next(p for p in pairs if counts[p] == best)
        assert pair == first_best, f"merge {k}: a tie must go to the pair that occurs first"
        ids = merge_pair(ids, pair, 256 + k)
    assert len(merges) == 30 or len(ids) < 2


@pytest.mark.parametrize("seed", range(6))
def test_round_trip_on_any_text_and_encode_reproduces_training(seed):
    rng = random.Random(100 + seed)
    train = _random_text(rng, 300)
    merges = train_bpe(train, 256 + 40)
    tok = BPETokenizer(merges)
    assert tok.vocab_size == 256 + len(merges)
    ids = list(train.encode("utf-8"))
    for k, pair in enumerate(merges):
        ids = merge_pair(ids, pair, 256 + k)
    assert tok.encode(train) == ids  # exactly training's final sequence
    for text in (train, _random_text(rng, 200), "", "\x00", "unseen ☃ 🙂", "".join(map(chr, range(1, 300)))):
        encoded = tok.encode(text)
        assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in encoded)
        assert tok.decode(encoded) == text
    # any id list decodes (cut characters become U+FFFD), from a list or a tensor
    some = [rng.randrange(tok.vocab_size) for _ in range(50)]
    assert tok.decode(some) == b"".join(tok.vocab[i] for i in some).decode("utf-8", errors="replace")
    assert tok.decode(torch.tensor(some)) == tok.decode(some)
    with pytest.raises(ValueError):
        tok.decode([tok.vocab_size])


def test_tokenizer_on_the_standard_library_compresses_and_round_trips():
    text = python_source_text(max_chars=20_000)
    assert 10_000 < len(text) <= 20_000 and text.endswith("\n")
    tok = BPETokenizer(train_bpe(text, 256 + 64))
    ids = tok.encode(text)
    assert tok.decode(ids) == text and len(ids) < 0.7 * len(text.encode())


# -- batches and generation ------------------------------------------------------------------------------------------
def test_lm_batches_contract():
    ids = torch.randperm(200)[:50]
    x, y = lm_batches(ids, 8, 400, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (400, 8) and x.dtype == y.dtype == torch.int64
    where = {int(v): i for i, v in enumerate(ids.tolist())}
    starts = {where[int(row[0])] for row in x}
    assert starts == set(range(50 - 8))
    for row, target in zip(x, y, strict=True):
        o = where[int(row[0])]
        assert torch.equal(row, ids[o:o + 8]) and torch.equal(target, ids[o + 1:o + 9])
    a = lm_batches(ids, 8, 4, torch.Generator().manual_seed(3))
    b = lm_batches(ids, 8, 4, torch.Generator().manual_seed(3))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    with pytest.raises(ValueError):
        lm_batches(ids[:8], 8, 2)


def test_generate_with_the_cache_is_greedy_decoding_without_it():
    model = _gpt_from(_torch_stack(7)).float()
    prompt = torch.randint(0, V, (3, 4))
    out = generate(model, prompt, M - 4, temperature=0)
    ids = prompt
    with torch.no_grad():
        for _ in range(M - 4):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)


def test_generate_runs_each_position_once_and_respects_top_k():
    model = HashedLM(12, seed=0, n_layers=2, max_len=12)
    out = generate(model, torch.zeros(2, 3, dtype=torch.long), 6, temperature=0)
    assert out.shape == (2, 9) and model.positions_run == 3 + 5
    model = HashedLM(12, seed=1, max_len=4)
    out = generate(model, torch.full((500, 1), 3), 1, top_k=3, generator=torch.Generator().manual_seed(0))
    assert set(out[:, 1].tolist()) == set(model.next_logits([3]).topk(3).indices.tolist())


@pytest.mark.parametrize("T, keep", [(3, 6), (9, 5)])
def test_generate_long_is_greedy_decoding_that_forgets_all_but_the_latest_tokens(T, keep):
    """Against the full forward of a GPT (PyTorch's encoder layers inside): each round sees only its window, the
    last keep tokens when it started, and never more than max_len positions."""
    model = _gpt_from(_torch_stack(8)).float()
    prompt = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(T))
    before = prompt.clone()
    new = 3 * M  # several rounds: max_len M = 20
    out = generate_long(model, prompt, new, keep, temperature=0)
    assert torch.equal(prompt, before) and out.shape == (2, T + new) and torch.equal(out[:, :T], prompt)
    ids, rounds = prompt, 0
    with torch.no_grad():
        while ids.shape[1] < T + new:
            window = ids[:, -keep:]  # what the round sees
            for _ in range(min(M - window.shape[1], T + new - ids.shape[1])):
                step = model(window)[:, -1].argmax(-1, keepdim=True)  # no cache: every position run again
                window, ids = torch.cat([window, step], dim=1), torch.cat([ids, step], dim=1)
            rounds += 1
    assert rounds >= 3
    assert torch.equal(out, ids)


def test_generate_long_in_one_round_is_generate():
    model = HashedLM(12, seed=2, n_layers=2, max_len=12)
    prompt = torch.randint(0, 12, (3, 4), generator=torch.Generator().manual_seed(0))
    assert torch.equal(generate_long(model, prompt, 8, keep=6, temperature=0), generate(model, prompt, 8,
                                                                                         temperature=0))
