"""Lessons 08–09 references (generation, KV cache) and the scripted test models of decoder_course.testing.

Oracles are independent of the code under test: paths walked by hand from the scripted models' own logits,
exhaustive enumeration for beam search, PyTorch's softmax/topk/multinomial semantics for the filters, the full
(uncached) decoder for the cache, and ``F.scaled_dot_product_attention`` for the cached causal mask.
"""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from autograder.course.reference import generation as gen
from autograder.course.reference import kv_cache as kv
from autograder.course.reference.model import Seq2SeqTransformer
from decoder_course.testing import HashedLogitsModel, ScriptedModel, sequence_log_prob

BOS, EOS = 1, 2

# A tree where greedy and beam search disagree: greedy takes 3 (0.5) then 5 (0.4): total 0.20;
# the best sequence starts with the less likely 4 (0.4) then 5 (0.9): total 0.36. Both then end with EOS.
TREE = {
    3: (0.5, {5: (0.4, None), 6: (0.3, None), 7: (0.3, None)}),
    4: (0.4, {5: (0.9, None), 6: (0.1, None)}),
    EOS: (0.1, None),
}


def padded_source(lengths, S=6, V=12, seed=0, pad_id=0):
    """Source ids (B, S) with real tokens in 3..V-1 and ``pad_id`` after each row's length, plus is_real."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (len(lengths), S), generator=g)
    is_real = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]  # (B, S)
    return src.masked_fill(~is_real, pad_id), is_real


def walk_greedy(next_logits, max_len, eos_id):
    """The argmax path of one row, walked with a model's own next-token logits: an independent greedy."""
    prefix = []
    while len(prefix) < max_len:
        token = int(torch.argmax(next_logits(prefix)))
        prefix.append(token)
        if token == eos_id:
            break
    return prefix


def check_eos_padding(ids, eos_id, pad_id, max_len, what):
    """Each row: no padding before its first EOS, only padding after it; L is the longest row."""
    assert ids.dtype == torch.long and ids.dim() == 2, f"{what}: expected (B, L) int64 ids, got {ids.dtype}"
    assert ids.shape[1] <= max_len, f"{what}: {ids.shape[1]} tokens exceed max_len={max_len}"
    lengths = []
    for row in ids.tolist():
        if eos_id in row:
            end = row.index(eos_id) + 1
            assert all(t == pad_id for t in row[end:]), f"{what}: tokens after EOS must be pad_id: {row}"
        else:
            end = len(row)
            assert len(row) == max_len, f"{what}: a row without EOS stopped before max_len: {row}"
        assert pad_id not in row[:end], f"{what}: padding before the end of a sequence: {row}"
        lengths.append(end)
    assert max(lengths) == ids.shape[1], f"{what}: L={ids.shape[1]} but the longest row has {max(lengths)}"
    return lengths


# ------------------------------------------------------------------------------------------------------------
# decoder_course.testing: the scripted models themselves
# ------------------------------------------------------------------------------------------------------------


def test_scripted_model_tree_gives_the_written_probabilities():
    model = ScriptedModel.from_tree(TREE, vocab_size=10)
    src = torch.zeros(2, 3, dtype=torch.long)
    tgt = torch.tensor([[BOS, 4, 5], [BOS, 3, 9]])
    logp = model.decode(tgt, model.encode(src)).log_softmax(-1)  # (2, 3, V)
    assert logp.shape == (2, 3, 10)
    assert math.isclose(logp[0, 0, 4].exp().item(), 0.4, rel_tol=1e-4)
    assert math.isclose(logp[0, 1, 5].exp().item(), 0.9, rel_tol=1e-4)
    assert logp[0, 2, EOS].exp().item() > 0.999  # an unscripted prefix ends
    assert math.isclose(logp[1, 1, 6].exp().item(), 0.3, rel_tol=1e-4)
    assert logp[1, 2, EOS].exp().item() > 0.999  # 9 was never scripted after 3


def test_scripted_model_accepts_json_data_and_rejects_a_missing_bos():
    # what a grading case written as JSON can pass: string keys, lists for tuples
    tree_json = json.loads(json.dumps({str(k): [p, c] for k, (p, c) in TREE.items()}))
    from_json = ScriptedModel(10, tree=tree_json)
    from_dict = ScriptedModel.from_tree(TREE, 10)
    table = [[list(prefix), logits.tolist()] for prefix, logits in from_dict.table.items()]
    from_table = ScriptedModel(10, table=json.loads(json.dumps(table)))
    tgt = torch.tensor([[BOS, 4, 5, 2]])
    memory = torch.zeros(1, 2, 1)
    for other in (from_json, from_table):
        assert torch.equal(other.decode(tgt, memory), from_dict.decode(tgt, memory))
    with pytest.raises(ValueError, match="BOS"):
        from_dict.decode(torch.tensor([[4, 5]]), memory)
    with pytest.raises(ValueError, match="batch"):
        from_dict.decode(tgt, torch.zeros(3, 2, 1))


def test_hashed_model_is_deterministic_per_row_and_sees_only_real_source_tokens():
    model = HashedLogitsModel(12, seed=5)
    src, is_real = padded_source([3, 6])
    tgt = torch.tensor([[BOS, 4, 7], [BOS, 4, 7]])
    logits = model(src, tgt, is_real)
    assert logits.shape == (2, 3, 12) and logits.dtype == torch.float32
    # same row alone, without its padding: the same logits
    alone = model(src[:1, :3], tgt[:1], None)
    assert torch.equal(alone, logits[:1])
    # padding ids do not matter when is_real is given ...
    assert torch.equal(model(src.masked_fill(~is_real, 9), tgt, is_real), logits)
    # ... but they do when it is forgotten: a decoder that drops src_is_real is caught
    assert not torch.equal(model(src, tgt, None)[0], logits[0])
    # a fresh model with the same seed agrees; another seed does not
    assert torch.equal(HashedLogitsModel(12, seed=5)(src, tgt, is_real), logits)
    assert not torch.equal(HashedLogitsModel(12, seed=6)(src, tgt, is_real), logits)
    # the prefix matters, position by position
    other = model(src, torch.tensor([[BOS, 5, 7], [BOS, 4, 7]]), is_real)
    assert torch.equal(other[:, 0], logits[:, 0]) and not torch.equal(other[0, 1], logits[0, 1])


# ------------------------------------------------------------------------------------------------------------
# greedy
# ------------------------------------------------------------------------------------------------------------


def test_greedy_follows_the_argmax_path_of_a_scripted_model():
    model = ScriptedModel.from_tree(TREE, vocab_size=10)
    src = torch.zeros(3, 4, dtype=torch.long)
    out = gen.greedy_decode(model, src, max_len=10, bos_id=BOS, eos_id=EOS)
    expected = walk_greedy(model.next_logits, 10, EOS)
    assert expected == [3, 5, EOS]
    assert out.tolist() == [expected] * 3


@pytest.mark.parametrize("pad_id", [0, 7])
def test_greedy_batch_matches_each_row_alone_and_pads_after_eos(pad_id):
    V, max_len = 12, 9
    model = HashedLogitsModel(V, seed=3, eos_bias=0.6, pad_id=pad_id)
    src, is_real = padded_source([2, 6, 4, 5, 3], V=V, seed=1, pad_id=pad_id)
    src_before = src.clone()
    out = gen.greedy_decode(model, src, max_len, BOS, EOS, src_is_real=is_real, pad_id=pad_id)
    assert torch.equal(src, src_before), "greedy_decode changed its input"
    lengths = check_eos_padding(out, EOS, pad_id, max_len, "greedy_decode")
    assert len(set(lengths)) >= 3, f"test data too easy: lengths {lengths}"
    for b in range(len(src)):
        real = src[b][is_real[b]].tolist()
        expected = walk_greedy(lambda p, real=real: model.next_logits(real, [BOS] + p), max_len, EOS)
        assert out[b, : len(expected)].tolist() == expected, f"row {b} left the argmax path"


def test_greedy_stops_at_max_len_and_handles_zero():
    model = HashedLogitsModel(12, seed=0, eos_bias=-50.0)  # EOS never wins
    src, is_real = padded_source([3, 5])
    assert gen.greedy_decode(model, src, 4, BOS, EOS, src_is_real=is_real).shape == (2, 4)
    assert gen.greedy_decode(model, src, 0, BOS, EOS, src_is_real=is_real).shape == (2, 0)


# ------------------------------------------------------------------------------------------------------------
# filters
# ------------------------------------------------------------------------------------------------------------


def test_top_k_filter_keeps_exactly_the_k_largest():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 20, generator=g)
    before = logits.clone()
    for k in (1, 3, 20, 50):
        out = gen.top_k_filter(logits, k)
        assert torch.equal(logits, before), "top_k_filter changed its input"
        assert out.shape == logits.shape and out.dtype == logits.dtype
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter(
            -1, logits.topk(min(k, 20), -1).indices, True
        )
        assert torch.equal(out[keep], logits[keep]), f"k={k}: a kept logit changed"
        assert bool(torch.isneginf(out[~keep]).all()), f"k={k}: a token outside the top k is not -inf"


def nucleus_oracle(logits, p):
    """Per row: the most likely tokens, in order, until their probability reaches p (at least one)."""
    keep = np.zeros(logits.shape, dtype=bool)
    probs = torch.softmax(logits.double(), -1).numpy()
    for row in range(logits.shape[0]):
        total = 0.0
        for token in np.argsort(-probs[row], kind="stable"):
            keep[row, token] = True
            total += probs[row, token]
            if total >= p:
                break
    return torch.from_numpy(keep)


def test_top_p_filter_keeps_the_smallest_nucleus_and_always_the_top_token():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 15, generator=g) * torch.tensor([0.3, 1, 2, 3, 5, 8])[:, None]  # flat to peaked
    before = logits.clone()
    assert torch.equal(gen.top_p_filter(logits, 1.0), logits), "p = 1 must keep every token"
    for p in (0.0, 0.1, 0.5, 0.8, 0.95):
        out = gen.top_p_filter(logits, p)
        assert torch.equal(logits, before), "top_p_filter changed its input"
        keep = nucleus_oracle(logits, p)
        assert torch.equal(out[keep], logits[keep]), f"p={p}: a token of the nucleus was removed"
        assert bool(torch.isneginf(out[~keep]).all()), f"p={p}: a token outside the nucleus was kept"
    # a worked example: probabilities 0.4, 0.3, 0.2, 0.1 and p = 0.6 keep the first two
    worked = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    assert torch.isfinite(gen.top_p_filter(worked, 0.6)).tolist() == [[True, True, False, False]]
    assert gen.top_p_filter(worked.half(), 0.6).dtype == torch.float16


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_once():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -4.0], [1.0, 1.0, -2.0, 0.0, 6.0]])
    prev = torch.tensor([[0, 1, 1, 4], [4, 2, 2, 2]])  # repeats are penalised once
    before = logits.clone()
    out = gen.apply_repetition_penalty(logits, prev, 2.0)
    assert torch.equal(logits, before), "apply_repetition_penalty changed its input"
    expected = torch.tensor([[1.0, -2.0, 0.5, 3.0, -8.0], [1.0, 1.0, -4.0, 0.0, 3.0]])
    assert torch.equal(out, expected)
    assert torch.equal(gen.apply_repetition_penalty(logits, prev, 1.0), logits)


# ------------------------------------------------------------------------------------------------------------
# sampling
# ------------------------------------------------------------------------------------------------------------

FIRST_STEP = {3: 0.4, 4: 0.3, 5: 0.2, 6: 0.1}  # probabilities of the first token; then EOS


def first_step_model():
    return ScriptedModel.from_tree({t: (p, None) for t, p in FIRST_STEP.items()}, vocab_size=8, floor=1e-9)


def draw_first_tokens(n=3000, seed=0, **settings):
    src = torch.zeros(n, 2, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    out = gen.sample(first_step_model(), src, 1, BOS, EOS, generator=g, **settings)
    assert out.shape == (n, 1)
    return out[:, 0]


def test_sample_is_reproducible_with_a_fixed_generator_and_varies_without():
    model = HashedLogitsModel(12, seed=2, eos_bias=0.3, scale=0.5)
    src, is_real = padded_source([3, 6, 2, 5] * 4, V=12, seed=4)

    def run(seed):
        return gen.sample(
            model, src, 10, BOS, EOS, generator=torch.Generator().manual_seed(seed), src_is_real=is_real
        )

    first = run(7)
    check_eos_padding(first, EOS, 0, 10, "sample")
    assert torch.equal(run(7), first), "the same generator seed must give the same samples"
    assert not torch.equal(run(8), first), "different seeds gave identical samples: is the generator used?"


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_sample_frequencies_follow_the_tempered_distribution(temperature):
    tokens = draw_first_tokens(n=4000, seed=3, temperature=temperature)
    logits = torch.log(torch.tensor(list(FIRST_STEP.values())))
    expected = torch.softmax(logits / temperature, -1)  # PyTorch's softmax of the tempered logits
    for (token, _), want in zip(FIRST_STEP.items(), expected.tolist(), strict=True):
        got = (tokens == token).float().mean().item()
        assert abs(got - want) < 0.035, f"T={temperature}: token {token} drawn {got:.3f}, expected {want:.3f}"


def test_top_k_and_top_p_sampling_never_draw_excluded_tokens():
    top2 = draw_first_tokens(top_k=2)
    assert set(top2.tolist()) == {3, 4}, f"top_k=2 drew {sorted(set(top2.tolist()))}"
    nucleus = draw_first_tokens(top_p=0.6)  # 0.4 + 0.3 >= 0.6: tokens 3 and 4
    assert set(nucleus.tolist()) == {3, 4}, f"top_p=0.6 drew {sorted(set(nucleus.tolist()))}"
    nucleus = draw_first_tokens(top_p=0.75)  # 0.4 + 0.3 < 0.75: token 5 joins
    assert set(nucleus.tolist()) == {3, 4, 5}
    both = draw_first_tokens(top_k=3, top_p=0.5, temperature=2.0)  # flatter, yet only 3 and 4 reach 0.5
    assert set(both.tolist()) <= {3, 4, 5} and 6 not in set(both.tolist())
    only_top = draw_first_tokens(n=200, top_k=1, temperature=5.0)
    assert set(only_top.tolist()) == {3}


def test_repetition_penalty_in_sample_discourages_repeats():
    # the scripted model always slightly prefers token 3 over token 4
    V = 6
    logits = [-9.0, -9.0, -9.0, 1.0, 0.9, -9.0]
    model = ScriptedModel(V, table={(): logits}, default_logits=logits)
    src = torch.zeros(2, 2, dtype=torch.long)
    plain = gen.sample(model, src, 4, BOS, EOS, temperature=0)
    assert plain.tolist() == [[3, 3, 3, 3]] * 2
    # step 2: 3 was seen (1.0 / 2 = 0.5 < 0.9): 4; step 3: both seen (0.5 > 0.45): 3; step 4: a token seen
    # twice is penalised once, as in CTRL, so 3 again
    penalised = gen.sample(model, src, 4, BOS, EOS, temperature=0, repetition_penalty=2.0)
    assert penalised.tolist() == [[3, 4, 3, 3]] * 2


def test_temperature_to_zero_approaches_greedy():
    model = HashedLogitsModel(12, seed=9, eos_bias=0.5)
    src, is_real = padded_source([4, 2, 6, 5, 3, 6], V=12, seed=2)
    greedy = gen.greedy_decode(model, src, 10, BOS, EOS, src_is_real=is_real)
    g = torch.Generator().manual_seed(0)
    cold = gen.sample(model, src, 10, BOS, EOS, temperature=1e-4, generator=g, src_is_real=is_real)
    assert torch.equal(cold, greedy), "sampling at temperature 1e-4 should give the greedy tokens"
    assert torch.equal(gen.sample(model, src, 10, BOS, EOS, temperature=0, src_is_real=is_real), greedy)
    hot = gen.sample(model, src, 10, BOS, EOS, temperature=1.0, generator=g, src_is_real=is_real)
    assert not torch.equal(hot, greedy), "sampling at temperature 1 gave the greedy tokens: is it sampling?"


@pytest.mark.parametrize("pad_id", [0, 5])
def test_sample_stops_each_row_at_eos_and_pads(pad_id):
    model = HashedLogitsModel(12, seed=4, eos_bias=0.8, pad_id=pad_id)
    src, is_real = padded_source([3, 5, 2, 6] * 3, V=12, seed=5, pad_id=pad_id)
    out = gen.sample(
        model,
        src,
        12,
        BOS,
        EOS,
        generator=torch.Generator().manual_seed(1),
        src_is_real=is_real,
        pad_id=pad_id,
        top_k=5,
        top_p=0.9,
        repetition_penalty=1.3,
    )
    lengths = check_eos_padding(out, EOS, pad_id, 12, "sample")
    assert len(set(lengths)) >= 3, f"test data too easy: lengths {lengths}"


# ------------------------------------------------------------------------------------------------------------
# beam search
# ------------------------------------------------------------------------------------------------------------


def all_sequences(next_logits, vocab, max_len, eos_id):
    """Every complete sequence (ended by EOS, or max_len tokens long) with its total log-probability."""
    out = []

    def grow(prefix, score):
        if prefix and (prefix[-1] == eos_id or len(prefix) == max_len):
            out.append((prefix, score))
            return
        logp = torch.log_softmax(next_logits(prefix).double(), -1)
        for token in vocab:
            if torch.isfinite(logp[token]):
                grow(prefix + [token], score + logp[token].item())

    grow([], 0.0)
    return out


def gnmt(score, length, alpha):
    return score / ((5 + length) / 6) ** alpha


def test_beam_finds_the_best_sequence_where_greedy_does_not():
    model = ScriptedModel.from_tree(TREE, vocab_size=10)
    src = torch.zeros(2, 3, dtype=torch.long)
    greedy = gen.greedy_decode(model, src, 6, BOS, EOS)
    beam = gen.beam_search(model, src, 6, BOS, EOS, beam_size=2, length_penalty=0.0)
    # the exhaustive answer, from the tree's own probabilities
    best, _ = max(all_sequences(model.next_logits, range(2, 10), 6, EOS), key=lambda item: item[1])
    assert best == [4, 5, EOS]
    assert greedy[0].tolist() == [3, 5, EOS], "the tree is built so that greedy misses the best sequence"
    assert beam.tolist() == [best, best]
    scores = sequence_log_prob(model, src, beam)
    assert torch.allclose(scores, torch.tensor(math.log(0.36)), atol=1e-4)


@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.5])
def test_beam_wide_enough_to_keep_everything_is_exhaustive_search(alpha):
    # PAD and BOS are impossible (-inf), so each step has 4 choices: 3 tokens or EOS. With max_len 4 there are
    # 1 + 3 + 9 + 108 = 121 complete sequences: 128 beams never prune, and the answer is the exhaustive best
    # under GNMT's length normalisation. On this data the best sequence changes with alpha (checked below), so
    # a missing or different length penalty is caught.
    V, max_len = 6, 4
    model = HashedLogitsModel(V, seed=27, eos_bias=0.5, scale=1.5, special_logit=float("-inf"))
    src, is_real = padded_source([3, 5], V=V, seed=3)
    out = gen.beam_search(
        model, src, max_len, BOS, EOS, beam_size=128, length_penalty=alpha, src_is_real=is_real
    )
    for b in range(2):
        real = src[b][is_real[b]].tolist()
        candidates = all_sequences(
            lambda p, real=real: model.next_logits(real, [BOS] + p), range(V), max_len, EOS
        )
        assert len(candidates) == 121

        def best_for(a, candidates=candidates):
            return max(candidates, key=lambda item: gnmt(item[1], len(item[0]), a))[0]

        assert best_for(0.0) != best_for(2.5), "test data must make the length penalty matter"
        got = out[b].tolist()
        got = got[: got.index(EOS) + 1] if EOS in got else got
        assert got == best_for(alpha), (
            f"alpha={alpha}, row {b}: beam returned {got}, best is {best_for(alpha)}"
        )


def test_beam_size_one_is_greedy():
    model = HashedLogitsModel(12, seed=6, eos_bias=0.5)
    src, is_real = padded_source([2, 6, 4, 5, 3], V=12, seed=6)
    greedy = gen.greedy_decode(model, src, 10, BOS, EOS, src_is_real=is_real)
    beam = gen.beam_search(model, src, 10, BOS, EOS, beam_size=1, src_is_real=is_real)
    assert torch.equal(beam, greedy)


@pytest.mark.parametrize("pad_id", [0, 7])
def test_beam_batch_matches_each_row_alone_and_pads_after_eos(pad_id):
    model = HashedLogitsModel(12, seed=8, eos_bias=0.7, pad_id=pad_id)
    src, is_real = padded_source([2, 6, 4, 5, 3, 6], V=12, seed=7, pad_id=pad_id)
    src_before = src.clone()
    out = gen.beam_search(
        model, src, 10, BOS, EOS, beam_size=3, length_penalty=0.6, src_is_real=is_real, pad_id=pad_id
    )
    assert torch.equal(src, src_before), "beam_search changed its input"
    lengths = check_eos_padding(out, EOS, pad_id, 10, "beam_search")
    assert len(set(lengths)) >= 2, f"test data too easy: lengths {lengths}"
    for b in range(len(src)):
        alone = gen.beam_search(
            model,
            src[b : b + 1, : int(is_real[b].sum())],
            10,
            BOS,
            EOS,
            beam_size=3,
            length_penalty=0.6,
            pad_id=pad_id,
        )
        assert out[b, : alone.shape[1]].tolist() == alone[0].tolist(), f"row {b} differs from its solo run"


def test_sample_n_gives_every_source_its_own_samples():
    # each source's first-token frequencies follow PyTorch's softmax of that source's own logits; at temperature 0
    # every sample is the source's walked greedy path; the buggy release is right for one source only
    from autograder.course import notebooks

    model = HashedLogitsModel(8, seed=4, scale=1.5)
    src, is_real = padded_source([6, 3, 2], V=8, seed=2)
    n = 3000
    out = gen.sample_n(model, src, n, 1, BOS, EOS, generator=torch.Generator().manual_seed(0), src_is_real=is_real)
    assert out.shape == (3, n, 1)
    reals = [src[b][is_real[b]].tolist() for b in range(3)]
    for b in range(3):
        want = torch.softmax(model.next_logits(reals[b], [BOS]).double(), -1)  # (V,)
        freq = torch.bincount(out[b, :, 0], minlength=8).double() / n
        assert torch.all((freq - want).abs() <= 5 * (want * (1 - want) / n).sqrt() + 1e-3), f"source {b}"
    greedy = gen.sample_n(model, src, 2, 6, BOS, EOS, temperature=0, src_is_real=is_real)
    for b in range(3):
        path = walk_greedy(lambda prefix, b=b: model.next_logits(reals[b], [BOS] + prefix), 6, EOS)
        for j in range(2):
            row = greedy[b, j].tolist()
            assert row[: len(path)] == path and all(t == 0 for t in row[len(path):]), (b, j)
    namespace = dict(vars(gen))
    exec(notebooks.buggy_source("08-generation", "sample_n"), namespace)  # noqa: S102 - our own code
    buggy = namespace["sample_n"]
    one = (model, src[1:2], 2, 6, BOS, EOS)
    assert torch.equal(buggy(*one, temperature=0, src_is_real=is_real[1:2]),
                       gen.sample_n(*one, temperature=0, src_is_real=is_real[1:2])), "one source: the bug is silent"
    assert not torch.equal(buggy(model, src, 2, 6, BOS, EOS, temperature=0, src_is_real=is_real), greedy)


# ------------------------------------------------------------------------------------------------------------
# KV cache (lesson 09)
# ------------------------------------------------------------------------------------------------------------


def test_kv_cache_appends_per_layer_along_the_sequence_axis():
    g = torch.Generator().manual_seed(0)
    cache = kv.KVCache(n_layers=2)
    assert cache.length == 0 and cache.positions.tolist() == []
    ks = [torch.randn(2, 3, t, 4, generator=g) for t in (2, 1, 1)]
    vs = [torch.randn(2, 3, t, 4, generator=g) for t in (2, 1, 1)]
    for step, (k, v) in enumerate(zip(ks, vs, strict=True)):
        k_all, v_all = cache.update(k, v, 0)
        cache.update(k * 10, v * 10, layer_idx=1)
        assert k_all.shape == (2, 3, 2 + step, 4)
        assert torch.equal(k_all, torch.cat(ks[: step + 1], dim=2))
        assert torch.equal(v_all, torch.cat(vs[: step + 1], dim=2))
    assert cache.length == 4 and cache.positions.tolist() == [0, 1, 2, 3]
    assert torch.equal(cache.update(ks[0][:, :, :1], vs[0][:, :, :1], 1)[0][:, :, :4], torch.cat(ks, 2) * 10)
    single = kv.KVCache()  # SPEC's per-layer form: update(k, v)
    assert single.update(ks[0], vs[0])[0].shape == (2, 3, 2, 4)


def test_cached_causal_mask_is_aligned_to_absolute_positions():
    mask = kv.cached_causal_mask(torch.tensor([2, 3]), 4)
    assert mask.dtype == torch.bool and mask.shape == (2, 4)
    assert mask.tolist() == [[True, True, True, False], [True, True, True, True]]
    assert kv.cached_causal_mask(torch.tensor([5]), 6).tolist() == [[True] * 6]
    # bottom-right alignment: the last T rows of the full (S, S) causal mask
    full = torch.ones(7, 7, dtype=torch.bool).tril()
    assert torch.equal(kv.cached_causal_mask(torch.arange(4, 7), 7), full[4:])

    # with T != S, is_causal=True aligns the triangle top-left: wrong for queries that come after a cache
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for n in (7, 7, 7))
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=True)[:, :, 4:]  # every position at once
    ours = F.scaled_dot_product_attention(
        q[:, :, 4:], k, v, attn_mask=kv.cached_causal_mask(torch.arange(4, 7), 7)
    )
    torch_top_left = F.scaled_dot_product_attention(q[:, :, 4:], k, v, is_causal=True)
    assert torch.allclose(ours, reference, atol=1e-6)
    assert not torch.allclose(torch_top_left, reference, atol=1e-3)


def small_model(norm_first, seed=0, V=20):
    """An untrained model whose greedy outputs still vary: untied, sharpened output layer, no PAD/BOS."""
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(
        V, V, 32, 4, 64, 2, dropout=0.1, tie_weights=False, norm_first=norm_first
    ).eval()
    with torch.no_grad():
        model.out_proj.weight.mul_(3.0)
        model.out_proj.bias[:2] -= 100.0  # never PAD or BOS: padding in the output stays unambiguous
    return model


@pytest.mark.parametrize("norm_first", [True, False])
def test_decode_step_logits_equal_the_full_decoder(norm_first):
    model = small_model(norm_first)
    src, is_real = padded_source([3, 6, 5], V=20, seed=1)
    tgt = torch.cat([torch.full((3, 1), BOS), torch.randint(3, 20, (3, 7))], dim=1)  # (B, 8)
    with torch.no_grad():
        memory = model.encode(src, is_real)
        full = model.decode(tgt, memory, src_is_real=is_real)  # (B, 8, V)
    memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]
    cache = kv.KVCache(len(model.decoder.layers))
    # prefill three positions at once, then one at a time
    logits, cache = kv.decode_step(model, tgt[:, :3], memory_kv, cache, 0, src_is_real=is_real)
    assert logits.shape == (3, 20)
    assert torch.allclose(logits, full[:, 2], atol=1e-5), "prefill logits differ from the full decoder"
    for t in range(3, 8):
        logits, cache = kv.decode_step(model, tgt[:, t : t + 1], memory_kv, cache, t, src_is_real=is_real)
        assert cache.length == t + 1
        assert torch.allclose(logits, full[:, t], atol=1e-5), f"step {t}: cached logits differ"


@pytest.mark.parametrize("norm_first", [True, False])
def test_greedy_decode_cached_gives_exactly_the_greedy_tokens(norm_first):
    model = small_model(norm_first, seed=1)
    src, is_real = padded_source([2, 6, 4, 5], V=20, seed=2)
    endless = gen.greedy_decode(model, src, 12, BOS, eos_id=-1, src_is_real=is_real)
    assert len(set(endless.flatten().tolist())) >= 5, "test model too dull: outputs barely vary"
    # several EOS ids taken from the generated tokens: rows stop at different steps
    eos_ids = sorted(set(endless[:, 1:6].flatten().tolist()))[:3]
    for eos_id in eos_ids:
        for max_len in (1, 5, 12):
            plain = gen.greedy_decode(model, src, max_len, BOS, eos_id, src_is_real=is_real)
            cached = kv.greedy_decode_cached(model, src, max_len, BOS, eos_id, src_is_real=is_real)
            assert torch.equal(cached, plain), f"eos={eos_id}, max_len={max_len}: cached {cached} vs {plain}"
    lengths = check_eos_padding(
        kv.greedy_decode_cached(model, src, 12, BOS, eos_ids[0], src_is_real=is_real),
        eos_ids[0],
        0,
        12,
        "greedy_decode_cached",
    )
    assert lengths == check_eos_padding(
        gen.greedy_decode(model, src, 12, BOS, eos_ids[0], src_is_real=is_real),
        eos_ids[0],
        0,
        12,
        "greedy_decode",
    )


def test_greedy_decode_cached_projects_memory_once_per_layer():
    model = small_model(True, seed=2)
    src, is_real = padded_source([3, 6], V=20, seed=3)
    calls = []
    hooks = [
        layer.cross_attn.k_proj.register_forward_hook(lambda *_: calls.append("k"))
        for layer in model.decoder.layers
    ]
    out = kv.greedy_decode_cached(model, src, 9, BOS, eos_id=-1, src_is_real=is_real)
    for hook in hooks:
        hook.remove()
    assert out.shape == (2, 9)
    assert len(calls) == len(model.decoder.layers), f"cross-attention keys projected {len(calls)} times"


def test_kv_cache_reorder_follows_the_beams_in_every_layer():
    g = torch.Generator().manual_seed(4)
    cache = kv.KVCache(n_layers=2)
    ks = [torch.randn(3, 2, 4, 5, generator=g) for _ in range(2)]
    vs = [torch.randn(3, 2, 4, 5, generator=g) for _ in range(2)]
    for layer in range(2):
        cache.update(ks[layer], vs[layer], layer)
    index = torch.tensor([2, 2, 0, 1])  # a row repeated, a new batch size
    cache.reorder(index)
    assert cache.length == 4 and cache.positions.tolist() == [0, 1, 2, 3]
    for layer in range(2):
        assert torch.equal(cache.keys[layer], ks[layer][index]) and torch.equal(cache.values[layer], vs[layer][index])
    # the repeated rows are separate tensors' rows: appending to one beam leaves the other alone
    k_all, _ = cache.update(torch.ones(4, 2, 1, 5), torch.ones(4, 2, 1, 5), 0)
    assert torch.equal(k_all[0, :, :4], ks[0][2]) and k_all.shape == (4, 2, 5, 5)
    kv.KVCache(1).reorder(index)  # an empty cache: nothing to reorder, no error


@pytest.mark.parametrize("norm_first", [True, False])
def test_beam_search_cached_gives_beam_searchs_beams_and_scores(norm_first):
    model = small_model(norm_first, seed=3)
    src, is_real = padded_source([2, 6, 4, 5], V=20, seed=4)
    src_before = src.clone()
    endless = gen.greedy_decode(model, src, 10, BOS, eos_id=-1, src_is_real=is_real)
    eos_ids = sorted(set(endless[:, 1:5].flatten().tolist()))[:2] + [-1]  # rows end at different steps, or never
    for eos_id in eos_ids:
        for beam_size, alpha, max_len, pad_id in ((3, 0.6, 10, 0), (1, 1.0, 6, 7), (5, 0.0, 1, 0)):
            kwargs = dict(beam_size=beam_size, length_penalty=alpha, src_is_real=is_real, pad_id=pad_id)
            plain = gen.beam_search(model, src, max_len, BOS, eos_id, **kwargs)
            cached = kv.beam_search_cached(model, src, max_len, BOS, eos_id, **kwargs)
            assert torch.equal(cached, plain), f"eos={eos_id}, K={beam_size}: cached {cached} vs {plain}"
            with torch.no_grad():
                torch.testing.assert_close(sequence_log_prob(model, src, cached, eos_id=eos_id, src_is_real=is_real),
                                           sequence_log_prob(model, src, plain, eos_id=eos_id, src_is_real=is_real))
    assert torch.equal(src, src_before), "beam_search_cached changed its input"
    # no src_is_real at all, B = 1
    one = src[:1, :2]
    assert torch.equal(kv.beam_search_cached(model, one, 8, BOS, eos_ids[0], beam_size=4),
                       gen.beam_search(model, one, 8, BOS, eos_ids[0], beam_size=4))


def test_beam_search_cached_projects_memory_once_and_decodes_one_position_per_step():
    model = small_model(True, seed=2)
    src, is_real = padded_source([3, 6], V=20, seed=3)
    calls, widths = [], []
    hooks = [layer.cross_attn.k_proj.register_forward_hook(lambda *_: calls.append("k"))
             for layer in model.decoder.layers]
    hooks.append(model.tgt_embed.register_forward_hook(lambda mod, inputs, out: widths.append(inputs[0].shape[1])))
    out = kv.beam_search_cached(model, src, 9, BOS, eos_id=-1, beam_size=3, src_is_real=is_real)
    for hook in hooks:
        hook.remove()
    assert out.shape == (2, 9)
    assert len(calls) == len(model.decoder.layers), f"cross-attention keys projected {len(calls)} times"
    assert widths == [1] * 9, f"decoder inputs per step: {widths}"


@pytest.mark.parametrize("norm_first", [True, False])
def test_prefill_gives_the_full_decoders_logits_whatever_the_chunk_size(norm_first):
    # the oracle is the uncached decoder on the whole prefix; one more cached token must see the prefill's cache;
    # the buggy release (chunk index as position) is right for one token per chunk and for one chunk only
    from autograder.course import notebooks

    model = small_model(norm_first, seed=3)
    src, is_real = padded_source([6, 2, 4], V=20, seed=4)
    g = torch.Generator().manual_seed(6)
    tokens = torch.cat([torch.full((3, 1), BOS), torch.randint(3, 20, (3, 8), generator=g)], dim=1)  # (B, 9)
    P = 8
    with torch.no_grad():
        memory = model.encode(src, is_real)
        full = model.decode(tokens, memory, src_is_real=is_real)  # (B, 9, V)
        memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]
    prefix = tokens[:, :P].clone()
    namespace = dict(vars(kv))
    exec(notebooks.buggy_source("09-kv-cache", "prefill"), namespace)  # noqa: S102 - our own code
    buggy = namespace["prefill"]
    for chunk_size in (1, 2, 3, 5, 8, 20):
        logits, cache = kv.prefill(model, prefix, memory_kv, kv.KVCache(2), chunk_size, src_is_real=is_real)
        torch.testing.assert_close(logits, full[:, P - 1], atol=1e-4, rtol=1e-4)
        assert cache.length == P and torch.equal(prefix, tokens[:, :P])
        nxt, _ = kv.decode_step(model, tokens[:, P:], memory_kv, cache, P, src_is_real=is_real)
        torch.testing.assert_close(nxt, full[:, P], atol=1e-4, rtol=1e-4)
        wrong, _ = buggy(model, prefix, memory_kv, kv.KVCache(2), chunk_size, src_is_real=is_real)
        silent = chunk_size == 1 or chunk_size >= P
        assert torch.allclose(wrong, full[:, P - 1], atol=1e-4) == silent, f"chunk_size {chunk_size}"
