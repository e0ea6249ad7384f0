"""Visible checks of lesson 08-generation: greedy decoding, the sampling filters, sampling and beam search.

The models are the scripted stand-ins of :mod:`decoder_course.testing`, whose answers are known without a
network: a hand-written probability tree where greedy decoding and beam search disagree, and pseudo-random logits
fixed by (source, prefix). The properties checked need no reference answer: a batch gives each row what the row
gives alone, rows stop at their own EOS and pad after it, a seeded generator reproduces its draws, filtered
tokens are never drawn, and the worked examples of the lesson. The three filters are specs
(:mod:`decoder_course.spec`): their rows and properties below drive the hidden checks too, on secret draws.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from decoder_course.checks import (
    CheckFailed,
    check,
    expect_close,
    expect_dtype,
    expect_inputs_unchanged,
    expect_shape,
    expect_type,
    to_numpy,
)
from decoder_course.conventions import BOS, EOS
from decoder_course.spec import Keyword, Spec, run
from decoder_course.testing import HashedLogitsModel, ScriptedModel, sequence_log_prob

# Greedy takes 3 (0.5) then 5 (0.4): 0.20. The most likely sequence is 4 (0.4) then 5 (0.9): 0.36.
TREE = {
    3: (0.5, {5: (0.4, None), 6: (0.3, None), 7: (0.3, None)}),
    4: (0.4, {5: (0.9, None), 6: (0.1, None)}),
    EOS: (0.1, None),
}
FIRST_STEP = {3: 0.4, 4: 0.3, 5: 0.2, 6: 0.1}  # first-token probabilities, then EOS


def _padded_source(lengths, S=6, V=12, seed=0, pad_id=0):
    """Source ids (B, S) with real tokens in 3..V-1 and pad_id after each row's length, and its is_real."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (len(lengths), S), generator=g)
    is_real = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]  # (B, S)
    return src.masked_fill(~is_real, pad_id), is_real


def _expect_seeded(run, what: str, hint: str, other: str | None = None, judge=None):
    """``run(generator)`` gives the same result twice with generator seed 5 under two different global random states
    (the generator alone decides), and, where ``other`` says why it must, another result with seed 6. ``judge``
    checks the first result before that."""
    torch.manual_seed(1)
    first = run(torch.Generator().manual_seed(5))
    if judge is not None:
        judge(first)
    torch.manual_seed(2)  # a different global state: the generator alone must decide
    if not torch.equal(run(torch.Generator().manual_seed(5)), first):
        raise CheckFailed(f"two calls of {what} with generator seed 5 gave different samples: {hint}")
    if other is not None and torch.equal(run(torch.Generator().manual_seed(6)), first):
        raise CheckFailed(f"{what} gave identical samples with generator seeds 5 and 6: {other}")
    return first


# -- stand-in models that a grader's kernel can build again from plain data ------------------------------------------
def hashed_model(V: int, seed: int, **kwargs) -> HashedLogitsModel:
    """A HashedLogitsModel whose ``spec`` is the plain data that builds the same model elsewhere."""
    model = HashedLogitsModel(V, seed, **kwargs)
    model.spec = {"new": "decoder_course.testing:HashedLogitsModel", "args": [V, seed], "kwargs": kwargs}
    return model


def _tree_data(tree: dict) -> list:
    """A probability tree {token: (p, child)} as JSON-friendly nested lists [[token, p, child], ...]."""
    return [[int(token), float(p), None if child is None else _tree_data(child)] for token, (p, child) in
            tree.items()]


def scripted_model(V: int, tree: dict | None = None, **kwargs) -> ScriptedModel:
    """A ScriptedModel (from a tree, or a ``table=``) whose ``spec`` builds the same model elsewhere."""
    model = ScriptedModel(V, tree=tree, **kwargs)
    model.spec = {"new": "decoder_course.testing:ScriptedModel", "args": [V],
                  "kwargs": {"tree": _tree_data(tree), **kwargs} if tree else kwargs}
    return model


def padded_source(rng: np.random.Generator, lengths, S: int, V: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Source ids (B, S) with real tokens in 3..V-1 (never pad_id) and pad_id after each row's length; is_real."""
    is_real = np.arange(S)[None, :] < np.asarray(lengths)[:, None]  # (B, S)
    src = rng.integers(3, V, size=(len(lengths), S))
    src[src == pad_id] = 3 if pad_id != 3 else 4  # a real token never reads as padding
    return np.where(is_real, src, pad_id), is_real


def trap_tree(rng: np.random.Generator, V: int) -> dict:
    """A probability tree where the greedy path (the most likely first token) is less likely than another."""
    a, b, *kids = (int(t) for t in rng.choice(np.arange(3, V), size=6, replace=False))
    p_a = float(rng.uniform(0.48, 0.55))  # EOS takes 0.1; a is the most likely first token
    split = rng.permutation([0.42, 0.33, 0.25])  # a's children: at most 0.55 * 0.42 = 0.23 in all
    p_c = float(rng.uniform(0.85, 0.95))  # b's best child: at least 0.35 * 0.85 = 0.30 in all
    return {a: (p_a, {kids[i]: (float(split[i]), None) for i in range(3)}),
            b: (0.9 - p_a, {kids[3]: (p_c, None), kids[0]: (1.0 - p_c, None)}), EOS: (0.1, None)}


# -- what any generated batch satisfies ------------------------------------------------------------------------------
def expect_generated(ids, B: int, max_len: int, pad_id: int = 0, what: str = "the output", desc: str = "",
                     eos_id: int = EOS, special: bool = True) -> list[int]:
    """Generated ids: (B, L) integers, L <= max_len, without BOS; each row stops at its first EOS (or runs to
    max_len) and holds only pad_id after it; L is the longest row. Where the model never generates pad_id nor BOS
    (``special``), neither may come before a row's end. Returns the rows' lengths."""
    at = f" ({desc})" if desc else ""
    if not isinstance(ids, np.ndarray):
        expect_type(ids, torch.Tensor, what)
        expect_dtype(ids, "integer", what)
    ids = to_numpy(ids)
    if ids.ndim != 2 or ids.shape[0] != B:
        raise CheckFailed(f"{what} should have shape (B, L) with B = {B}, got {tuple(ids.shape)}{at}")
    if ids.shape[1] > max_len:
        raise CheckFailed(f"{what} has {ids.shape[1]} tokens per row, more than max_len = {max_len}{at}: max_len "
                          "counts the generated tokens, EOS included; BOS is not part of the output")
    lengths = []
    for b, row in enumerate(ids.tolist()):
        if special and row and row[0] == BOS and BOS not in (eos_id, pad_id):
            raise CheckFailed(f"row {b} of {what} starts with BOS{at}: return the generated tokens only, without the "
                              "BOS every row started from")
        end = row.index(eos_id) + 1 if eos_id in row else len(row)
        if pad_id != 0 and row[end:] and all(t == 0 for t in row[end:]):
            raise CheckFailed(f"row {b} of {what} is padded with 0 after its EOS, but pad_id is {pad_id} here{at}: "
                              "pad with the pad_id argument")
        if any(t != pad_id for t in row[end:]):
            raise CheckFailed(f"row {b} of {what} goes on after its EOS{at}: a row that has emitted EOS is finished, "
                              "and every later position must be pad_id. Keep a `finished` flag per row")
        if eos_id not in row and len(row) < max_len:
            raise CheckFailed(f"row {b} of {what} stopped before max_len = {max_len} without an EOS{at}")
        if special and pad_id in row[:end] and pad_id != eos_id:
            raise CheckFailed(f"row {b} of {what} holds pad_id before its end{at}: only finished rows are padded "
                              f"(pad_id = {pad_id} here, not necessarily 0)")
        lengths.append(end)
    if lengths and max(lengths) < ids.shape[1]:
        raise CheckFailed(f"{what} has L = {ids.shape[1]} columns but its longest row ends after {max(lengths)} "
                          f"tokens{at}: stop as soon as every row has finished; L is the length of the longest row")
    return lengths


# -- greedy_decode and beam_search, as specs on the stand-in models --------------------------------------------------
def _decoding(model, src: np.ndarray, max_len: int, is_real: np.ndarray | None = None, pad_id: int = 0,
              **options) -> dict:
    """A decoder's arguments by name: (model, src_ids, max_len, BOS, EOS, [beam_size=, length_penalty=,]
    src_is_real=, pad_id=), the last two only where given."""
    args = {"model": model, "src_ids": src, "max_len": max_len, "bos_id": BOS, "eos_id": EOS}
    args |= {name: Keyword(value) for name, value in options.items()}
    if is_real is not None:
        args["src_is_real"] = Keyword(is_real)
    return args | ({"pad_id": Keyword(pad_id)} if pad_id else {})


def _sources(args: dict) -> list[np.ndarray]:
    """Each row's real source tokens: what the row reads when decoded alone."""
    real = args.get("src_is_real")
    return [row if real is None else row[real[b]] for b, row in enumerate(args["src_ids"])]


def _log_probs(model, source: np.ndarray, prefix: list[int]) -> np.ndarray:
    """log softmax (float64) of the model's logits for the token after BOS + ``prefix``, reading ``source`` alone."""
    with torch.no_grad():
        logits = model(torch.from_numpy(np.asarray(source)[None]), torch.tensor([[BOS, *prefix]]))[0, -1]
    return logits.double().log_softmax(-1).numpy()


def _expect_argmax(args: dict, got: np.ndarray, lengths: list[int], what: str, desc: str) -> None:
    """Every generated token is the most likely one after its row's prefix, the row reading its own source."""
    model = args["model"]
    for b, source in enumerate(_sources(args)):
        for t, token in enumerate(got[b, : lengths[b]].tolist()):
            log_p = _log_probs(model, source, got[b, :t].tolist())
            if log_p[token] < log_p.max():
                padded = args.get("src_is_real") is not None and token == _log_probs(
                    model, args["src_ids"][b], got[b, :t].tolist()).argmax()
                raise CheckFailed(f"token {t} of row {b} of {what} is not the most likely one after its prefix "
                                  f"({desc}): " + ("it is the most likely when the source padding counts: pass "
                                                   "src_is_real to encode and decode" if padded else
                                                   "at each step take the argmax of the last position's logits "
                                                   "(logits[:, -1]), every row reading its own source"))


def _greedy_properties(args: dict, got: np.ndarray, desc: str) -> None:
    lengths = expect_generated(got, len(args["src_ids"]), args["max_len"], args.get("pad_id", 0),
                               "greedy_decode's output", desc)
    _expect_argmax(args, got, lengths, "greedy_decode's output", desc)


def _greedy_rows(rng: np.random.Generator) -> list:
    V, pad_id, max_len = int(rng.integers(10, 14)), int(rng.integers(5, 9)), int(rng.integers(3, 7))
    src, is_real = padded_source(rng, [7, *rng.integers(1, 8, size=5)], 7, 14, pad_id)
    short, short_real = padded_source(rng, [4, 2], 4, 12)
    seeds = [int(s) for s in rng.integers(2**31, size=3)]
    never = hashed_model(12, seeds[1], eos_bias=-50.0)  # EOS never wins
    return [(f"a scripted tree, B=3, V={V}", _decoding(scripted_model(V, trap_tree(rng, V)),
                                                       np.zeros((3, 4), np.int64), 8)),
            (f"B=6, S=7, V=14, pad_id={pad_id}, padded sources with src_is_real",
             _decoding(hashed_model(14, seeds[0], eos_bias=0.8, pad_id=pad_id), src, 9, is_real, pad_id)),
            (f"B=2, a model that never emits EOS, max_len={max_len}", _decoding(never, short, max_len, short_real)),
            ("B=2, max_len=0", _decoding(never, short, 0, short_real)),
            ("B=1, S=5, src_is_real=None", _decoding(hashed_model(12, seeds[2], eos_bias=0.2),
                                                     rng.integers(3, 12, size=(1, 5)), 12))]


def _complete(model, source: np.ndarray, max_len: int, most: int) -> list[tuple[list[int], float]] | None:
    """Every complete sequence after ``source`` (ended by EOS, or max_len long) with its float64 log-probability;
    None when there are more than ``most`` (each open prefix ends in at least one)."""
    done, open_ = [], [([], 0.0)]
    while open_:
        prefix, score = open_.pop()
        if prefix and (prefix[-1] == EOS or len(prefix) == max_len):
            done.append((prefix, score))
            continue
        log_p = _log_probs(model, source, prefix)
        open_ += [(prefix + [int(t)], score + log_p[t]) for t in np.flatnonzero(np.isfinite(log_p))]
        if len(done) + len(open_) > most:
            return None
    return done


def _gnmt(item: tuple[list[int], float], alpha: float) -> float:
    """A complete sequence's length-normalised score, GNMT's log_prob / ((5 + len) / 6) ** alpha."""
    return item[1] / ((5 + len(item[0])) / 6) ** alpha


def _beam_properties(args: dict, got: np.ndarray, desc: str) -> None:
    """Per row: EOS and padding; with beam_size 1, greedy; with a beam wide enough to keep every candidate, the
    best complete sequence by the length-normalised score (an exhaustive search)."""
    what, K, alpha = "beam_search's output", args.get("beam_size", 4), args.get("length_penalty", 1.0)
    lengths = expect_generated(got, len(args["src_ids"]), args["max_len"], args.get("pad_id", 0), what, desc)
    if K == 1:
        _expect_argmax(args, got, lengths, what + " (beam_size=1 is greedy decoding)", desc)
    for b, source in enumerate(_sources(args)):
        every = _complete(args["model"], source, args["max_len"], K)
        best = every and max(every, key=lambda item: _gnmt(item, alpha))[0]
        if every and got[b, : lengths[b]].tolist() != best:
            row = got[b, : lengths[b]].tolist()
            raw = row == max(every, key=lambda item: item[1])[0]
            if not raw and alpha and row == max(every, key=lambda item: item[1] / len(item[0]) ** alpha)[0]:
                raise CheckFailed(
                    f"row {b} of {what} is not the best sequence ({desc}): it is the best by log_prob / len ** "
                    "length_penalty. The length penalty is GNMT's: divide by ((5 + len) / 6) ** length_penalty, "
                    "len counting tokens up to and including EOS")
            raise CheckFailed(
                f"row {b} of {what} is not the best sequence ({desc}), though the beam is wide enough to keep every "
                "candidate. " + ("Yours is the best by raw log-probability: pick each row's winner by log_prob / "
                                 "((5 + len) / 6) ** length_penalty, len counting tokens up to and including EOS" if raw
                                 else "Each row's beams read that row's source (row b * K + j is beam j of sequence b: "
                                 "repeat_interleave); keep finished beams with their score, extended only by pad_id at "
                                 "log-probability 0; rank by total log-probability, normalise once at the end"))


def _beam_rows(rng: np.random.Generator) -> list:
    V, pad_id, alpha = int(rng.integers(10, 14)), int(rng.integers(5, 9)), float(rng.choice([1.0, 2.5]))
    tree = scripted_model(V, trap_tree(rng, V))
    rows = [(f"a scripted tree where the most likely sequence does not start with the most likely token, B=2, V={V}, "
             "beam_size=2, length_penalty=0", _decoding(tree, np.zeros((2, 3), np.int64), 6, beam_size=2,
                                                        length_penalty=0.0))]
    for _ in range(200):  # 128 beams keep every candidate of V=6 (PAD and BOS impossible) up to max_len 4
        model = hashed_model(6, int(rng.integers(2**31)), eos_bias=0.5, scale=1.5, special_logit=-math.inf)
        src, is_real = padded_source(rng, [3, 5], 5, 6)
        ranked = [sorted(_complete(model, s, 4, 128), key=lambda item: -_gnmt(item, alpha))
                  for s in _sources({"src_ids": src, "src_is_real": is_real})]
        if all(_gnmt(r[0], alpha) - _gnmt(r[1], alpha) > 1e-3 and r[0][0][-1] == EOS for r in ranked) and any(
                r[0][0] != max(r, key=lambda item: item[1])[0] for r in ranked) and any(
                r[0][0] != max(r, key=lambda item: item[1] / len(item[0]) ** alpha)[0] for r in ranked):
            break  # clear winners; the length penalty changes one, and GNMT's differs from dividing by len ** alpha
    rows.append((f"B=2, V=6, beam_size=128 (wide enough to keep every candidate), max_len=4, length_penalty={alpha}",
                 _decoding(model, src, 4, is_real, beam_size=128, length_penalty=alpha)))
    src, is_real = padded_source(rng, rng.integers(1, 7, size=6), 6, 12, pad_id)
    rows.append((f"B=6 padded sources, V=12, pad_id={pad_id}, beam_size=3, length_penalty=0.6",
                 _decoding(hashed_model(12, int(rng.integers(2**31)), eos_bias=0.7, pad_id=pad_id), src, 10, is_real,
                           pad_id, beam_size=3, length_penalty=0.6)))
    src, is_real = padded_source(rng, [5, 2, 4], 5, 12)
    rows.append(("B=3 padded sources, beam_size=1", _decoding(hashed_model(12, int(rng.integers(2**31)), eos_bias=0.5),
                                                              src, 9, is_real, beam_size=1)))
    alone = hashed_model(12, int(rng.integers(2**31)), eos_bias=0.3)
    return rows + [("B=1, beam_size=4, length_penalty=1.0, src_is_real=None",
                    _decoding(alone, rng.integers(3, 12, size=(1, 4)), 8, beam_size=4, length_penalty=1.0))]


def _ids_contract(**kwargs) -> dict:
    """The decoders' shared contract: integer ids (B, L), L found by the properties."""
    return dict(dtype=lambda a: "integer", shape=lambda a: (len(a["src_ids"]), None), axes="B, L", tensors=True,
                rtol=0.0, atol=0.0, **kwargs)


DECODERS = {
    "greedy_decode": Spec("greedy_decode", _greedy_rows, properties=_greedy_properties, **_ids_contract(
        hint="At each step take the argmax of the last position's logits (logits[:, -1]) for every row.")),
    "beam_search": Spec("beam_search", _beam_rows, properties=_beam_properties, **_ids_contract(
        hint="Lay out beams as B·K rows (row b·K + j is beam j of sequence b), repeat the memory and src_is_real with "
             "repeat_interleave, start with only beam 0 alive, reorder the histories after each topk, keep finished "
             "beams, and pick the winner by the length-normalised score.")),
}


def check_greedy_decode(greedy_decode) -> None:
    """The lesson's tree, then the rows: EOS and padding per row, each token the argmax after its own prefix."""
    with check("greedy_decode on the lesson's tree gives 3, 5, EOS for every row"):
        out = greedy_decode(ScriptedModel.from_tree(TREE, vocab_size=10), torch.zeros(3, 4, dtype=torch.long), 10,
                            BOS, EOS)
        expect_generated(out, 3, 10, what="greedy_decode(tree_model, ...)")
        expect_close(out, torch.tensor([[3, 5, EOS]] * 3), "greedy_decode(tree_model, ...)",
                     hint="at each step take the argmax of the LAST position's logits, append it, and stop once "
                          "every row has emitted EOS")
    run(SPECS["greedy_decode"], greedy_decode)


# -- the filters, as specs ---------------------------------------------------------------------------------------------
def _logits(values: np.ndarray, dtype: str) -> torch.Tensor:
    return torch.from_numpy(values).to(getattr(torch, dtype))


def _top_k_rows(rng: np.random.Generator) -> list:
    rows = []
    for shape, k, dtype, what in [((3, 11), int(rng.integers(2, 6)), "float32", ""),
                                  ((2, 3, 9), 1, "float32", "(B, T, V) logits"), ((4, 7), 50, "float32", "k > V"),
                                  ((2, 6), 3, "float16", "float16 logits"),
                                  ((3, 6), 2, "float32", "a tie with the k-th largest logit")]:
        logits = rng.standard_normal(shape) * 2.0
        if what.startswith("a tie"):  # k = 2: 5 and both 4s stay
            logits = np.stack([rng.permutation([5.0, 4.0, 4.0, 2.0, 1.0, 0.0]) for _ in range(shape[0])])
        rows.append((f"logits {shape} in {dtype}, k={k}" + (f", {what}" if what else ""),
                     {"logits": _logits(logits, dtype), "k": k}))
    return rows


def _probs(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _top_p_rows(rng: np.random.Generator) -> list:
    rows = []
    for shape, p, dtype, what in [((6, 15), float(rng.choice([0.5, 0.8, 0.9])), "float32", "rows from flat to peaked"),
                                  ((2, 3, 10), 0.9, "float32", "(B, T, V) logits"), ((3, 8), 1.0, "float32", "p=1"),
                                  ((3, 8), 0.0, "float32", "p=0"), ((4, 9), 0.75, "float16", "float16 logits")]:
        for _ in range(100):  # no cumulative sum within rounding distance of p: the nucleus is not a coin toss
            scales = np.geomspace(0.3, 8.0, shape[-2])[rng.permutation(shape[-2])][:, None]  # (rows, 1)
            logits = _logits(rng.standard_normal(shape) * scales, dtype)
            sums = np.cumsum(-np.sort(-_probs(logits.float().numpy()), axis=-1), axis=-1)
            if not 0 < p < 1 or np.abs(sums - p).min() > 5e-3:
                break
        rows.append((f"logits {shape} in {dtype}, p={p}, {what}", {"logits": logits, "p": p}))
    return rows


def _repetition_rows(rng: np.random.Generator) -> list:
    rows = []
    for B, V, L, penalty, dtype in [(3, 9, 6, float(rng.choice([1.3, 1.5, 2.0])), "float32"), (2, 7, 4, 1.0, "float32"),
                                    (1, 6, 5, 1.2, "float32"), (2, 8, 3, 2.0, "float16")]:
        prev = rng.integers(0, V, size=(B, L))
        prev[:, -1] = prev[:, 0]  # a repeated token in every row
        rows.append((f"B={B}, V={V}, {L} previous tokens with repeats, penalty={penalty}, {dtype}",
                     {"logits": _logits(rng.standard_normal((B, V)) * 2.0, dtype), "prev_ids": torch.from_numpy(prev),
                      "penalty": penalty}))
    return rows


def _filtered(what: str, args: dict, got: np.ndarray, desc: str) -> np.ndarray:
    """Every logit passes through unchanged or becomes -inf, the most likely token stays, and no removed token is
    more likely than a kept one (the kept ones are the top of their row). Returns which tokens were kept."""
    logits, got = args["logits"].astype(np.float64), got.astype(np.float64)
    kept = np.isfinite(got)
    if (~kept & ~np.isneginf(got)).any():
        raise CheckFailed(f"{what}: a removed token holds {got[~kept & ~np.isneginf(got)][0]} ({desc}): removed "
                          "logits are float('-inf') and nothing else")
    changed = kept & (got != logits)
    if changed.any():
        if (got[changed] < -1e4).any():
            raise CheckFailed(f"{what}: a removed token holds {got[changed][got[changed] < -1e4][0]:.4g} instead of "
                              f"-inf ({desc}): set filtered logits to float('-inf'), so that softmax gives them "
                              "probability exactly 0")
        raise CheckFailed(f"{what} changed the value of a kept logit ({desc}): kept logits pass through unchanged")
    if not np.take_along_axis(kept, logits.argmax(axis=-1)[..., None], axis=-1).all():
        raise CheckFailed(f"{what} removed the most likely token of a row ({desc}): it always stays, whatever k or p")
    lowest_kept = np.where(kept, logits, np.inf).min(axis=-1)  # (...)
    if (np.where(kept, -np.inf, logits).max(axis=-1) > lowest_kept).any():
        raise CheckFailed(f"{what} removed a token more likely than one it kept ({desc}): decide per row (the last "
                          "axis) by rank, in sorted order, and scatter the decision back to the vocabulary order")
    return kept


def _top_k_properties(args: dict, got: np.ndarray, desc: str) -> None:
    kept = _filtered("top_k_filter(logits, k)", args, got, desc)
    logits, k = args["logits"], args["k"]
    kth = -np.sort(-logits, axis=-1)[..., min(k, logits.shape[-1]) - 1:][..., :1]  # (..., 1): the k-th largest
    if not np.array_equal(kept, logits >= kth):
        few = (kept.sum(-1) < (logits >= kth).sum(-1)).any()
        raise CheckFailed(f"top_k_filter(logits, k) kept {'too few' if few else 'too many'} tokens in a row ({desc}): "
                          "keep every logit >= the k-th largest of its row, ties included; k larger than V keeps "
                          "everything")


def _top_p_properties(args: dict, got: np.ndarray, desc: str) -> None:
    kept = _filtered("top_p_filter(logits, p)", args, got, desc)
    probs, p = _probs(args["logits"]), args["p"]
    if p >= 1:
        if not kept.all():
            raise CheckFailed(f"top_p_filter(logits, 1.0) removed a token ({desc}): p = 1 keeps every token (a "
                              "float32 cumulative sum can reach 1.0 early: sum from the unlikely end, or compare with "
                              "a margin)")
        return
    mass = np.where(kept, probs, 0).sum(-1)  # (...): the nucleus's probability
    smallest = np.where(kept, probs, np.inf).min(-1)  # (...): its least likely token
    if (mass < p - 1e-3).any():
        raise CheckFailed(f"top_p_filter(logits, p) kept tokens whose probabilities add up to less than p ({desc}): "
                          "keep the most likely tokens until their sum reaches p, the one that crosses p included")
    if ((mass - smallest >= p + 1e-3) & (kept.sum(-1) > 1)).any():
        raise CheckFailed(f"top_p_filter(logits, p) kept more tokens than needed ({desc}): without its least likely "
                          "kept token the rest still reach p. Keep the fewest most likely tokens whose sum reaches p")


def _repetition_properties(args: dict, got: np.ndarray, desc: str) -> None:
    """Tokens not in a row's prev_ids keep their logits; a seen token's logit moves away from being likely (the
    values themselves are the hidden comparison's)."""
    logits, prev, penalty = args["logits"].astype(np.float64), args["prev_ids"], args["penalty"]
    got = got.astype(np.float64)
    seen = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(seen, prev, True, axis=-1)  # (B, V): tokens in each row's own prev_ids
    if not np.array_equal(got[~seen], logits[~seen]):
        raise CheckFailed(f"apply_repetition_penalty changed a token that is not in its row's prev_ids ({desc}): each "
                          "row uses its own prev_ids, and other tokens are unchanged")
    if penalty > 1 and (got[seen & (logits < 0)] > logits[seen & (logits < 0)]).any():
        raise CheckFailed(f"apply_repetition_penalty raised a negative logit of a seen token ({desc}): dividing a "
                          "negative logit by the penalty makes the token more likely. Multiply negative logits by "
                          "the penalty, divide positive ones")


def _k_beyond_v(args: dict, error: str) -> str:
    return "k is larger than V here: clamp it (k larger than V keeps every token)." if (
        args["k"] > args["logits"].shape[-1]) else ""


SPECS = {
    **DECODERS,
    "top_k_filter": Spec(
        "top_k_filter", _top_k_rows, dtype=lambda a: a["logits"].dtype, shape=lambda a: a["logits"].shape,
        properties=_top_k_properties, on_error=_k_beyond_v,
        hint="Keep every logit >= the k-th largest of its row (ties included, along the last axis; k larger than V "
             "keeps everything)."),
    "top_p_filter": Spec(
        "top_p_filter", _top_p_rows, dtype=lambda a: a["logits"].dtype, shape=lambda a: a["logits"].shape,
        properties=_top_p_properties,
        hint="Per row (last axis), keep the fewest most likely tokens whose probabilities add up to at least p; the "
             "most likely token always stays; p = 1 keeps everything. Sort, decide in sorted order, then scatter the "
             "decision back to vocabulary order."),
    "apply_repetition_penalty": Spec(
        "apply_repetition_penalty", _repetition_rows, dtype=lambda a: a["logits"].dtype,
        shape=lambda a: a["logits"].shape, properties=_repetition_properties, rtol=2e-3, atol=2e-3,
        hint="For each row, the tokens in that row's prev_ids: a positive logit is divided by the penalty, a negative "
             "one multiplied by it; a token seen several times is penalised once; other tokens are unchanged."),
}


def check_top_k_filter(top_k_filter) -> None:
    """Worked examples (ties kept), k beyond V, any leading shape, dtype, the caller's logits untouched."""
    inf = -math.inf
    with check("top_k_filter([1, 5, 3, 2], k=2) keeps 5 and 3"):
        got = expect_inputs_unchanged(top_k_filter, torch.tensor([[1.0, 5.0, 3.0, 2.0]]), 2)
        expect_type(got, torch.Tensor, "top_k_filter(logits, 2)")
        expect_close(got, torch.tensor([[inf, 5.0, 3.0, inf]]), "top_k_filter(logits, 2)",
                     hint="the k largest logits keep their values, every other logit becomes -inf")
    with check("ties with the k-th largest are kept: [4, 3, 3, 1] with k=2 keeps 4, 3, 3"):
        got = top_k_filter(torch.tensor([[4.0, 3.0, 3.0, 1.0]]), 2)
        expect_close(got, torch.tensor([[4.0, 3.0, 3.0, inf]]), "top_k_filter([4, 3, 3, 1], 2)",
                     hint="compare every logit with the k-th largest value of its row: keep logits >= it")
    with check("k larger than V keeps everything; (B, T, V) logits; float16 stays float16"):
        logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
        expect_close(top_k_filter(logits, 50), logits, "top_k_filter(logits, 50) with V = 5",
                     hint="k >= V keeps every token: clamp k to V")
        got = top_k_filter(logits, 2)
        expect_shape(got, (2, 3, 5), "top_k_filter on (B, T, V) logits", names="B, T, V")
        kept = torch.isfinite(got).sum(-1)
        if not bool((kept == 2).all()):
            raise CheckFailed(f"each row should keep 2 tokens, kept {kept.tolist()}: filter along the last axis")
        expect_dtype(top_k_filter(logits.half(), 2), torch.float16, "top_k_filter of float16 logits")
    run(SPECS["top_k_filter"], top_k_filter)


def check_top_p_filter(top_p_filter) -> None:
    """The worked example, tokens out of order, p = 0 and p = 1, any leading shape, dtype, input untouched."""
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    with check("probabilities [0.4, 0.3, 0.2, 0.1]: p = 0.6 keeps two tokens, p = 0.75 three"):
        got = expect_inputs_unchanged(top_p_filter, probs.log(), 0.6)
        expect_type(got, torch.Tensor, "top_p_filter(logits, 0.6)")
        expect_close(torch.isfinite(got), torch.tensor([[True, True, False, False]]), "tokens kept with p = 0.6",
                     hint="keep the fewest most likely tokens whose probabilities add up to at least p")
        expect_close(got[:, :2], probs.log()[:, :2], "the kept logits", hint="kept logits keep their values")
        expect_close(torch.isfinite(top_p_filter(probs.log(), 0.75)), torch.tensor([[True, True, True, False]]),
                     "tokens kept with p = 0.75", hint="0.4 + 0.3 = 0.7 < 0.75, so the third token is needed")
    with check("tokens in any order: [0.1, 0.4, 0.2, 0.3] with p = 0.6 keeps 0.4 and 0.3"):
        got = top_p_filter(torch.tensor([[0.1, 0.4, 0.2, 0.3]]).log(), 0.6)
        expect_close(torch.isfinite(got), torch.tensor([[False, True, False, True]]), "tokens kept",
                     hint="sort by probability, decide in sorted order, then scatter the decision back to the "
                          "vocabulary order")
    with check("p = 1 keeps every token, p = 0 keeps only the most likely one"):
        logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(1)) * 3
        expect_close(top_p_filter(logits, 1.0), logits, "top_p_filter(logits, 1.0)",
                     hint="with p = 1 nothing may be dropped (a float32 cumulative sum can reach 1.0 early: "
                          "sum from the unlikely end, or compare with a margin)")
        only = torch.isfinite(top_p_filter(logits, 0.0))
        expect_close(only, logits == logits.max(-1, keepdim=True).values, "tokens kept with p = 0",
                     hint="the most likely token is always kept")
    with check("(B, T, V) logits keep their shape; float16 stays float16"):
        logits = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(2))
        expect_shape(top_p_filter(logits, 0.9), (2, 3, 6), "top_p_filter on (B, T, V)", names="B, T, V")
        expect_dtype(top_p_filter(logits.half(), 0.9), torch.float16, "top_p_filter of float16 logits")
    run(SPECS["top_p_filter"], top_p_filter)


def check_apply_repetition_penalty(apply_repetition_penalty) -> None:
    """The worked example (CTRL: divide positive, multiply negative, once per token), penalty 1, input untouched."""
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -4.0], [1.0, 1.0, -2.0, 0.0, 6.0]])
    prev = torch.tensor([[0, 1, 1, 4], [4, 2, 2, 2]])
    with check("the worked example with penalty 2 (a repeated token is penalised once)"):
        got = expect_inputs_unchanged(apply_repetition_penalty, logits, prev, 2.0)
        expect_type(got, torch.Tensor, "apply_repetition_penalty(...)")
        expect_shape(got, (2, 5), "apply_repetition_penalty(...)", names="B, V")
        want = torch.tensor([[1.0, -2.0, 0.5, 3.0, -8.0], [1.0, 1.0, -4.0, 0.0, 3.0]])
        expect_close(got, want, "apply_repetition_penalty(logits, prev_ids, 2.0)",
                     hint="positive logits of seen tokens are divided by the penalty, negative ones multiplied "
                          "(dividing would raise them); each row uses its own prev_ids; twice seen = once "
                          "penalised")
    with check("penalty 1.0 changes nothing"):
        expect_close(apply_repetition_penalty(logits, prev, 1.0), logits, "apply_repetition_penalty(..., 1.0)")
    run(SPECS["apply_repetition_penalty"], apply_repetition_penalty)


def _first_model() -> ScriptedModel:
    return ScriptedModel.from_tree({t: (p, None) for t, p in FIRST_STEP.items()}, vocab_size=8, floor=1e-9)


FILTERED_DRAWS = (  # (title, settings, the tokens drawn from FIRST_STEP, why)
    ("top_k=2 and top_p=0.6 only ever draw tokens 3 and 4 (probabilities 0.4, 0.3, 0.2, 0.1)",
     ({"top_k": 2}, {"top_p": 0.6}, {"top_k": 3, "top_p": 0.5, "temperature": 2.0}), [3, 4],
     "a filtered token (logit -inf) must never be drawn, and each kept one comes up (is it sampling?). Filter after "
     "dividing by the temperature, top-k then top-p"),
    ("top-k first, then top-p on what top-k left: top_k=2, top_p=0.5 only ever draws token 3",
     ({"top_k": 2, "top_p": 0.5},), [3],
     "top-k keeps 3 and 4, whose softmax is 0.4 / 0.7 = 0.57 and 0.43: token 3 alone reaches p = 0.5. Apply top-k "
     "first, then top-p to the logits top-k left (top-p before top-k keeps 3 and 4)"),
    ("filters see the tempered distribution: temperature 3 with top_p=0.6 also draws token 5",
     ({"temperature": 3.0, "top_p": 0.6},), [3, 4, 5],
     "softmax(logits / 3) gives 3, 4, 5, 6 about 0.30, 0.27, 0.24, 0.19, so the nucleus of p = 0.6 holds 3, 4 and "
     "5. Divide by the temperature first, then filter: the filters must see the distribution you draw from "
     "(filtering first keeps only 3 and 4)"),
)


def check_sample(sample) -> None:
    """Reproducible with a generator, never outside top-k/top-p, temperature 0 is greedy, the penalty, EOS."""
    first = _first_model()
    many = torch.zeros(600, 1, dtype=torch.long)
    with check("the same generator seed gives the same samples; another seed gives others"):
        model = HashedLogitsModel(12, seed=2, eos_bias=0.3, scale=0.5)
        src, is_real = _padded_source([3, 6, 2, 5] * 4, seed=4)

        def valid(out):
            expect_generated(out, 16, 10, what="sample(...)")

        _expect_seeded(lambda g: sample(model, src, 10, BOS, EOS, generator=g, src_is_real=is_real), "sample",
                       "pass the generator to torch.multinomial (generator=generator) instead of using the global "
                       "random state", "is the token drawn at random?", judge=valid)
    for title, settings, want, why in FILTERED_DRAWS:
        with check(title):
            for setting in settings:
                drawn = sample(first, many, 1, BOS, EOS, generator=torch.Generator().manual_seed(0), **setting)
                seen = sorted(set(drawn[:, 0].tolist()))
                if seen != want:
                    raise CheckFailed(f"with {setting} the tokens drawn in 600 draws were {seen}, expected {want}: "
                                      f"{why}")
    with check("temperature 0 is greedy: the lesson's tree gives 3, 5, EOS"):
        tree = ScriptedModel.from_tree(TREE, vocab_size=10)
        out = sample(tree, torch.zeros(2, 3, dtype=torch.long), 6, BOS, EOS, temperature=0)
        expect_close(out, torch.tensor([[3, 5, EOS]] * 2), "sample(..., temperature=0)",
                     hint="temperature == 0 means: take the argmax (do not divide by zero)")
    with check("temperature 0.5 sharpens: token 3 is drawn about 53% of the time"):
        drawn = sample(first, torch.zeros(3000, 1, dtype=torch.long), 1, BOS, EOS, temperature=0.5,
                       generator=torch.Generator().manual_seed(3))
        freq = (drawn[:, 0] == 3).float().mean().item()
        if abs(freq - 0.16 / 0.30) > 0.04:
            raise CheckFailed(f"token 3 was drawn {freq:.1%} of the time; softmax(logits / 0.5) gives it "
                              f"{0.16 / 0.30:.1%}. Divide the logits by the temperature (not multiply)")
    with check("repetition penalty 2 with temperature 0 on a looping model: 3, 4, 3, 3"):
        loop = [-9.0, -9.0, -9.0, 1.0, 0.9, -9.0]
        model = ScriptedModel(6, table={(): loop}, default_logits=loop)
        out = sample(model, torch.zeros(2, 2, dtype=torch.long), 4, BOS, EOS, temperature=0,
                     repetition_penalty=2.0)
        expect_close(out, torch.tensor([[3, 4, 3, 3]] * 2), "sample(..., temperature=0, repetition_penalty=2)",
                     hint="apply the penalty first, with the tokens generated so far (without BOS), then choose")
    with check("BOS is not a generated token: with bos_id=3, a token the model also generates, the output starts 3, 4"):
        loop = [-9.0, -9.0, -9.0, 1.0, 0.9, -9.0]
        model = ScriptedModel(6, table={(): loop}, default_logits=loop, bos_id=3)
        out = sample(model, torch.zeros(2, 2, dtype=torch.long), 4, 3, EOS, temperature=0, repetition_penalty=2.0)
        if out.tolist() == [[4, 3, 3, 3]] * 2:
            raise CheckFailed("with bos_id=3 the first token was 4: token 3 was penalised before anything was "
                              "generated. The repetition penalty reads the tokens generated so far, BOS excluded "
                              "(tgt[:, 1:]): BOS is the decoder's first input, not a repeat")
        expect_close(out, torch.tensor([[3, 4, 3, 3]] * 2), "sample(..., bos_id=3, temperature=0, "
                     "repetition_penalty=2)", hint="penalise only the tokens generated so far, without BOS")
    with check("the repetition penalty also applies when sampling (temperature 1): a token rarely follows itself"):
        loop = [-9.0, -9.0, -9.0, 8.0, 7.0, -9.0]  # 3 is likely (73 %), 4 the runner-up, EOS never
        model = ScriptedModel(6, table={(): loop}, default_logits=loop)
        drawn = sample(model, torch.zeros(600, 1, dtype=torch.long), 2, BOS, EOS, temperature=1.0,
                       repetition_penalty=10.0, generator=torch.Generator().manual_seed(4))
        repeats = (drawn[:, 0] == drawn[:, 1]).float().mean().item()
        if repeats > 0.05:
            raise CheckFailed(f"with repetition_penalty=10 at temperature 1, {repeats:.0%} of the rows drew the "
                              "same token twice; penalised, the first token's logit drops to 0.8 or 0.7 and the "
                              "other token wins almost always (< 1 % repeats). Apply the penalty at every step "
                              "whatever the temperature, before dividing by it: not only on the greedy path")


def check_beam_search(beam_search) -> None:
    """The lesson's tree (beam finds 0.36 where greedy finds 0.20), then the rows: EOS and padding per row, greedy
    with one beam, the exhaustive search's best with a beam that keeps every candidate."""
    tree = ScriptedModel.from_tree(TREE, vocab_size=10)
    with check("beam_size=2 on the lesson's tree finds 4, 5, EOS (0.36), which greedy misses"):
        src = torch.zeros(2, 3, dtype=torch.long)
        out = beam_search(tree, src, 6, BOS, EOS, beam_size=2, length_penalty=0.0)
        expect_generated(out, 2, 6, what="beam_search(tree_model, ...)")
        if out.tolist() == [[3, 5, EOS]] * 2:
            raise CheckFailed("beam search returned the greedy answer 3, 5, EOS (0.20). Keep the 2 best "
                              "*sequences* by total log-probability, and start with only beam 0 alive (the "
                              "others at -inf), or both beams hold the same sequence")
        expect_close(out, torch.tensor([[4, 5, EOS]] * 2), "beam_search(tree_model, ..., beam_size=2)")
        expect_close(sequence_log_prob(tree, src, out).exp(), torch.full((2,), 0.36),
                     "the probability of the beam's answer", atol=1e-3)
    run(SPECS["beam_search"], beam_search)


# -- sample_n (find the bug) -----------------------------------------------------------------------------------------
def _trimmed(row) -> list[int]:
    """A generated row up to and including its first EOS."""
    row = row.tolist()
    return row[: row.index(EOS) + 1] if EOS in row else row


class _SeenSources(HashedLogitsModel):
    """A HashedLogitsModel that keeps the source batches ``encode`` was given (what ``sample`` hands it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def encode(self, src_ids, src_is_real=None):
        self.batches.append((src_ids.clone(), None if src_is_real is None else src_is_real.clone()))
        return super().encode(src_ids, src_is_real)


def expect_sample_layout(rows, rows_real, src, is_real, n: int, desc: str = "") -> None:
    """The batch ``sample_n`` hands ``sample``: row b * n + j holds source b and its own padding (the docstring's
    layout, the one beam search gives its beams)."""
    at = f" ({desc})" if desc else ""
    rows, src = to_numpy(rows), to_numpy(src)
    B = len(src)
    if rows.shape != (B * n, *src.shape[1:]):
        raise CheckFailed(f"sample_n handed sample a batch of shape {tuple(rows.shape)}, not (B * n, S) = "
                          f"({B * n}, {src.shape[1]}){at}")
    holds = [next((b for b in range(B) if np.array_equal(row, src[b])), None) for row in rows]
    want = [r // n for r in range(B * n)]
    if holds != want:
        tiled = holds == [r % B for r in range(B * n)]
        raise CheckFailed(f"row b * n + j of the batch sample_n hands sample must hold source b (n copies of each "
                          f"source side by side, as the docstring says){at}; rows 0..{B * n - 1} hold sources "
                          f"{holds}" + (": the batch is tiled (repeat). Copy each source n times side by side "
                                        "(repeat_interleave), and read the output back with view(B, n)" if tiled
                                        else ""))
    if is_real is not None and rows_real is not None:
        if not np.array_equal(to_numpy(rows_real), np.repeat(to_numpy(is_real), n, axis=0)):
            raise CheckFailed(f"row b * n + j of the src_is_real sample_n hands sample must be source b's own "
                              f"padding{at}: copy src_is_real the way the sources are copied")


def check_sample_n(sample_n) -> None:
    """Find the bug: the probe first (at temperature 0 every sample of a source is what that source gives alone),
    then sampling (every token one that its own source's top-k allows), reproducibility and variety."""
    model = HashedLogitsModel(12, seed=6, eos_bias=0.4)
    src, is_real = _padded_source([6, 3, 2], seed=9)  # (B, S): three sources of different lengths

    with check("the probe: at temperature 0, each of the n = 2 samples of a source is what it gives alone"):
        out = expect_inputs_unchanged(sample_n, model, src, 2, 8, BOS, EOS, temperature=0, src_is_real=is_real)
        expect_type(out, torch.Tensor, "sample_n(...)")
        expect_dtype(out, "integer", "sample_n(...)")
        if out.dim() != 3 or tuple(out.shape[:2]) != (3, 2):
            raise CheckFailed(f"sample_n(..., n=2) on 3 sources should have shape (B, n, L) = (3, 2, L), got "
                              f"{tuple(out.shape)}")
        expect_generated(out.reshape(6, -1), 6, 8, what="sample_n(...) (its samples as rows)")
        alone = [_trimmed(sample_n(model, src[b:b + 1], 1, 8, BOS, EOS, temperature=0,
                                   src_is_real=is_real[b:b + 1])[0, 0]) for b in range(3)]
        got = [[_trimmed(out[b, j]) for j in range(2)] for b in range(3)]
        if any(got[b][j] != alone[b] for b in range(3) for j in range(2)):
            source_of = [[next((str(c) for c in range(3) if got[b][j] == alone[c]), "none") for j in range(2)]
                         for b in range(3)]
            raise CheckFailed(
                "at temperature 0 (greedy) a sample of source b must be what source b gives alone, with B = 1. "
                "Which source, alone, gives each sample (rows: sources 0-2, columns: samples 0-1):\n"
                + "\n".join(f"        source {b}: {'  '.join(source_of[b])}" for b in range(3))
                + "\n    Print the batch the code hands to sample, row by row: which source and which padding "
                  "does row b * n + j hold?")

    def own_top_2(out):
        for b in range(3):
            real = src[b][is_real[b]].tolist()
            for j in range(4):
                prefix = [BOS]
                for token in _trimmed(out[b, j]):
                    best = model.next_logits(real, prefix).topk(2).indices.tolist()
                    if token not in best:
                        raise CheckFailed(f"sample {j} of source {b} holds {token} after {prefix[1:]}, which "
                                          f"source {b}'s top-2 ({best}) excludes: it was drawn for another source")
                    prefix.append(token)

    with check("sampling with top_k=2: every token of a sample is one of its own source's two best"):
        out = _expect_seeded(lambda g: sample_n(model, src, 4, 8, BOS, EOS, top_k=2, generator=g, src_is_real=is_real),
                             "sample_n", "pass the generator on to sample", judge=own_top_2)
        if all(len({tuple(_trimmed(out[b, j])) for j in range(4)}) == 1 for b in range(3)):
            raise CheckFailed("the 4 samples of every source are identical: n samples are n draws, not one draw "
                              "copied n times")
    with check("the batch handed to sample: row b * n + j holds source b and its padding, n copies side by side"):
        seen = _SeenSources(12, seed=6, eos_bias=0.4)
        sample_n(seen, src, 2, 8, BOS, EOS, top_k=2, generator=torch.Generator().manual_seed(5), src_is_real=is_real)
        if not seen.batches:
            raise CheckFailed("sample_n never encoded a source: hand sample the batch of n copies of every source")
        expect_sample_layout(*seen.batches[0], src, is_real, 2)
