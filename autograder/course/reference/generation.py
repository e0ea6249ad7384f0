"""Reference for lesson 08-generation (PyTorch): greedy decoding, sampling with its filters, and beam search.

Every decoder here works on a batch and on any model with the course's interface::

    memory = model.encode(src_ids, src_is_real)                        # (B, S, D)
    logits = model.decode(tgt_ids, memory, src_is_real=src_is_real)    # (B, T, V)

Outputs are the generated ids *without* BOS, shape (B, L): a sequence stops at its own EOS (EOS is kept),
later positions are ``pad_id``, and L is the length of the longest returned sequence (at most ``max_len``):
decoding stops early once every sequence has finished.
``max_len`` counts generated tokens, EOS included. These decoders do not switch the model's mode: call
``model.eval()`` first, or dropout will shake the logits. They recompute the whole prefix at every step;
lesson 09's KV cache removes that cost.
"""

import torch
from torch import nn


@torch.no_grad()
def greedy_decode(
    model: nn.Module,
    src_ids: torch.Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int,
    src_is_real: torch.Tensor | None = None,
    pad_id: int = 0,
) -> torch.Tensor:
    """Generate by always taking the most likely next token, for a batch, each row stopping at its EOS.

    Each row is decoded as if alone: ``src_is_real`` reaches ``encode`` and ``decode``. The caller's ``src_ids`` and
    ``src_is_real`` are unchanged.

    Shape:
        src_ids (B, S), src_is_real (B, S) bool or None -> ids (B, L), L <= max_len, without BOS,
        ``pad_id`` after each row's EOS
    """
    ### BEGIN SOLUTION
    B = src_ids.shape[0]
    memory = model.encode(src_ids, src_is_real)  # (B, S, D): the source is encoded once
    # every row starts at BOS
    tgt = torch.full((B, 1), bos_id, dtype=torch.long, device=src_ids.device)  # (B, 1)
    finished = torch.zeros(B, dtype=torch.bool, device=src_ids.device)  # (B,)
    for _ in range(max_len):
        logits = model.decode(tgt, memory, src_is_real=src_is_real)  # (B, T, V)
        next_id = logits[:, -1].argmax(-1)  # (B,): only the last position predicts a new token
        # a finished row keeps growing (the batch stays rectangular) but only with padding
        next_id = next_id.masked_fill(finished, pad_id)
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)  # (B, T + 1)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break  # no row has anything left to say
    return tgt[:, 1:]  # (B, L): drop BOS, which was given, not generated
    ### END SOLUTION


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row; set the others to -inf (ties with the k-th are kept).

    Kept logits keep their values; k larger than V keeps every token; the caller's logits are unchanged.

    Shape:
        logits (..., V) -> (..., V), same dtype
    """
    ### BEGIN SOLUTION
    k = min(max(int(k), 1), logits.shape[-1])  # always keep at least the top token
    kth_best = logits.topk(k, dim=-1).values[..., -1:]  # (..., 1): the smallest logit still kept
    return logits.masked_fill(logits < kth_best, float("-inf"))  # a new tensor: the input is unchanged
    ### END SOLUTION


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the fewest most likely tokens whose probability reaches p; -inf elsewhere.

    Decided per row (last axis), in sorted order and scattered back to vocabulary order; kept logits keep their
    values; p = 1 keeps every token; the caller's logits are unchanged.

    The most likely token is always kept, even when p <= 0.

    Shape:
        logits (..., V) -> (..., V), same dtype
    """
    ### BEGIN SOLUTION
    sorted_logits, order = logits.sort(dim=-1)  # (..., V): least likely first
    probs = sorted_logits.float().softmax(dim=-1)  # (..., V)
    # mass of this token and every less likely one; if it is <= 1 - p, the more likely tokens already reach p.
    # (Summing from the unlikely end keeps p = 1 exact: a float32 sum from the top can hit 1.0 too early.)
    tail_mass = probs.cumsum(dim=-1)  # (..., V)
    drop_sorted = tail_mass <= 1.0 - p
    drop_sorted[..., -1] = False  # the top token is always kept
    # scatter the decision back from sorted order to vocabulary order
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # (..., V)
    return logits.masked_fill(drop, float("-inf"))
    ### END SOLUTION


def apply_repetition_penalty(logits: torch.Tensor, prev_ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty: make tokens already generated less likely (divide positive logits, multiply
    negative ones by ``penalty``); penalty 1.0 changes nothing.

    A token seen several times is penalised once; each row uses its own ``prev_ids``; the caller's ``logits`` and
    ``prev_ids`` are unchanged.

    Shape:
        logits (B, V), prev_ids (B, L) int -> (B, V), same dtype
    """
    ### BEGIN SOLUTION
    seen = logits.gather(-1, prev_ids)  # (B, L): the logits of tokens already in each sequence
    # dividing a negative logit would *raise* it: negative logits are multiplied instead (Keskar et al. 2019)
    penalised = torch.where(seen > 0, seen / penalty, seen * penalty)  # (B, L)
    # a token seen twice is penalised once: scatter writes the same value for every copy
    return logits.scatter(-1, prev_ids, penalised)  # a new tensor: the input is unchanged
    ### END SOLUTION


@torch.no_grad()
def sample(
    model: nn.Module,
    src_ids: torch.Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    generator: torch.Generator | None = None,
    src_is_real: torch.Tensor | None = None,
    pad_id: int = 0,
) -> torch.Tensor:
    """Generate by drawing each next token from the model's distribution, reshaped by the decoding settings.

    The repetition penalty applies at every step whatever the temperature (with the tokens generated so far, BOS
    excluded); top-p takes its nucleus from what top-k left (renormalised over the kept tokens); every draw comes
    from ``generator`` (``torch.multinomial(..., generator=generator)``), never from the global random state;
    filtered tokens are never drawn.

    Order per step: repetition penalty, temperature, top-k, top-p, then one draw with ``generator``
    (a fixed generator makes the draw reproducible). ``temperature == 0`` means greedy.

    Shape:
        src_ids (B, S), src_is_real (B, S) bool or None -> ids (B, L), L <= max_len, without BOS,
        ``pad_id`` after each row's EOS
    """
    ### BEGIN SOLUTION
    B = src_ids.shape[0]
    memory = model.encode(src_ids, src_is_real)  # (B, S, D)
    tgt = torch.full((B, 1), bos_id, dtype=torch.long, device=src_ids.device)  # (B, 1)
    finished = torch.zeros(B, dtype=torch.bool, device=src_ids.device)  # (B,)
    for _ in range(max_len):
        logits = model.decode(tgt, memory, src_is_real=src_is_real)[:, -1].float()  # (B, V)
        if repetition_penalty != 1.0:
            logits = apply_repetition_penalty(logits, tgt[:, 1:], repetition_penalty)  # BOS is not a repeat
        if temperature == 0:
            next_id = logits.argmax(-1)  # the limit of temperature -> 0 is greedy
        else:
            logits = logits / temperature  # < 1 sharpens the distribution, > 1 flattens it
            if top_k is not None:
                logits = top_k_filter(logits, top_k)
            if top_p is not None:
                logits = top_p_filter(logits, top_p)
            probs = logits.softmax(-1)  # (B, V): filtered tokens have probability exactly 0
            next_id = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
        next_id = next_id.masked_fill(finished, pad_id)  # finished rows only pad
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)  # (B, T + 1)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
    return tgt[:, 1:]  # (B, L)
    ### END SOLUTION


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src_ids: torch.Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    src_is_real: torch.Tensor | None = None,
    pad_id: int = 0,
) -> torch.Tensor:
    """Keep the ``beam_size`` best partial sequences per batch row; return each row's best finished one.

    Each batch row is searched as if alone: its beams read its own source (row ``b * K + j`` is beam j of sequence
    b, so the memory and ``src_is_real`` are copied with ``repeat_interleave``). Only beam 0 is alive at the start.

    A beam cut off at ``max_len`` without EOS counts as finished.

    Beams are ranked by their total log-probability while searching; at the end each row returns the beam with
    the best *length-normalised* score, GNMT's ``log_prob / ((5 + len) / 6) ** length_penalty`` (Wu et al.
    2016), where ``len`` counts generated tokens up to and including EOS. ``length_penalty = 0`` compares raw
    log-probabilities (which favour short outputs); larger values favour longer ones. A finished beam keeps
    its score and is extended only with padding. With ``beam_size = 1`` this is greedy decoding. The caller's
    ``src_ids`` and ``src_is_real`` are unchanged.

    Shape:
        src_ids (B, S), src_is_real (B, S) bool or None -> ids (B, L), L <= max_len, without BOS,
        ``pad_id`` after each row's EOS
    """
    ### BEGIN SOLUTION
    B, K, device = src_ids.shape[0], beam_size, src_ids.device
    memory = model.encode(src_ids, src_is_real)  # (B, S, D)
    # every beam needs its own copy of its source: row b * K + j is beam j of sequence b
    memory = memory.repeat_interleave(K, dim=0)  # (B*K, S, D)
    beam_is_real = None if src_is_real is None else src_is_real.repeat_interleave(K, dim=0)  # (B*K, S)
    tgt = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)  # (B*K, 1)
    # only beam 0 is alive at the start: K identical beams would fill the beam with K copies of one sequence
    scores = torch.full((B, K), float("-inf"), device=device)  # (B, K): total log-prob of each beam
    scores[:, 0] = 0.0
    finished = torch.zeros(B, K, dtype=torch.bool, device=device)  # (B, K)
    lengths = torch.zeros(B, K, dtype=torch.long, device=device)  # (B, K): tokens generated up to EOS
    for _ in range(max_len):
        logits = model.decode(tgt, memory, src_is_real=beam_is_real)[:, -1]  # (B*K, V)
        log_probs = logits.float().log_softmax(-1).view(B, K, -1)  # (B, K, V)
        V = log_probs.shape[-1]
        # a finished beam has one continuation, padding, at no cost: its score stays as it was
        pad_only = torch.full((V,), float("-inf"), device=device)
        pad_only[pad_id] = 0.0
        log_probs = torch.where(finished[..., None], pad_only, log_probs)  # (B, K, V)
        candidates = (scores[..., None] + log_probs).view(B, K * V)  # (B, K*V): every beam x every token
        scores, flat_idx = candidates.topk(K, dim=-1)  # (B, K): the K best continuations per row
        beam_idx, token = flat_idx // V, flat_idx % V  # (B, K): which beam each came from, and its new token
        # reorder the histories so that beam j now holds the prefix it was extended from
        rows = (torch.arange(B, device=device)[:, None] * K + beam_idx).view(-1)  # (B*K,)
        tgt = torch.cat([tgt[rows], token.view(-1, 1)], dim=1)  # (B*K, T + 1)
        was_finished = finished.gather(1, beam_idx)  # (B, K)
        lengths = lengths.gather(1, beam_idx) + (~was_finished).long()
        finished = was_finished | (token == eos_id)
        if bool(finished.all()):
            break
    # GNMT length normalisation, applied once to pick each row's winner
    normalised = scores / ((5.0 + lengths.float()) / 6.0) ** length_penalty  # (B, K)
    best = normalised.argmax(-1)  # (B,)
    best_ids = tgt.view(B, K, -1)[torch.arange(B, device=device), best, 1:]  # (B, steps): drop BOS
    # longer losing beams may have run on: trim to the longest winner
    L = int(lengths.gather(1, best[:, None]).max())
    return best_ids[:, :L]  # (B, L)
    ### END SOLUTION


@torch.no_grad()
def sample_n(
    model: nn.Module,
    src_ids: torch.Tensor,
    n: int,
    max_len: int,
    bos_id: int,
    eos_id: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    generator: torch.Generator | None = None,
    src_is_real: torch.Tensor | None = None,
    pad_id: int = 0,
) -> torch.Tensor:
    """Draw ``n`` samples for every source, in one batched call of ``sample`` (find the bug).

    ``sample`` gets ``n`` copies of each source side by side: row ``b * n + j`` of its batch is sample ``j`` of
    source ``b`` (the layout beam search gives its beams), reading source ``b`` and its own ``src_is_real`` row;
    ``out[b, j]`` is that row. The settings, ``generator`` and ``pad_id`` go to ``sample`` as they are. The
    caller's tensors are unchanged.

    Shape:
        src_ids (B, S), src_is_real (B, S) bool or None -> ids (B, n, L), L <= max_len, without BOS,
        ``pad_id`` after each sample's EOS
    """
    B = src_ids.shape[0]
    ### BEGIN SOLUTION
    rows = src_ids.repeat_interleave(n, dim=0)  # (B*n, S): n copies of source 0, then n of source 1, ...
    rows_real = None if src_is_real is None else src_is_real.repeat_interleave(n, dim=0)  # (B*n, S)
    ### END SOLUTION
    ### BEGIN BUG
    # rows = src_ids.repeat(n, 1)  # (B*n, S)
    # rows_real = None if src_is_real is None else src_is_real.repeat(n, 1)  # (B*n, S)
    ### END BUG
    out = sample(model, rows, max_len, bos_id, eos_id, temperature=temperature, top_k=top_k, top_p=top_p,
                 repetition_penalty=repetition_penalty, generator=generator, src_is_real=rows_real,
                 pad_id=pad_id)  # (B*n, L)
    return out.view(B, n, -1)  # (B, n, L)


# -- known mistakes ------------------------------------------------------------------------------------------------
# Realistic wrong answers, each this module's code with a few lines changed: (item, what is wrong, (old, new), ...),
# applied by autograder.course.mutants.patched (each old must occur exactly once in the item's code, so an edit above
# that
# moves a line breaks its mistake loudly). (item, what is wrong) alone is the bug a find-the-bug exercise's release
# shows. Every one must cost its own item and no other, in both layers of checks (tests/test_hidden_checks.py,
# tests/test_visible_catch_rate.py); whole wrong answers of another structure live in autograder/course/mutants/.

NO_SOURCE_PADDING = (("model.encode(src_ids, src_is_real)", "model.encode(src_ids)"),
                     ("model.decode(tgt, memory, src_is_real=src_is_real)", "model.decode(tgt, memory)"))
KTH = "kth_best = logits.topk(k, dim=-1).values[..., -1:]  # (..., 1): the smallest logit still kept"
TEMPERED = "logits = logits / temperature  # < 1 sharpens the distribution, > 1 flattens it"
TOP_K = "if top_k is not None:\n                logits = top_k_filter(logits, top_k)\n"
TOP_P = "if top_p is not None:\n                logits = top_p_filter(logits, top_p)\n"
PENALTY = ("if repetition_penalty != 1.0:\n"
           "            logits = apply_repetition_penalty(logits, tgt[:, 1:], repetition_penalty)")
MISTAKES = [
    ("greedy_decode", "no finished mask: rows keep generating after their EOS",
     ("        next_id = next_id.masked_fill(finished, pad_id)\n", "")),
    ("greedy_decode", "src_is_real never reaches the model: source padding counts",
     *NO_SOURCE_PADDING),
    ("greedy_decode", "reads the first position's logits instead of the last",
     ("next_id = logits[:, -1].argmax(-1)", "next_id = logits[:, 0].argmax(-1)")),
    ("greedy_decode", "pads with 0 whatever pad_id says",
     ("next_id.masked_fill(finished, pad_id)", "next_id.masked_fill(finished, 0)")),
    ("top_k_filter", "keeps exactly the k top indices: ties with the k-th are dropped",
     (KTH, "keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, logits.topk(k, dim=-1).indices, True)"),
     ("logits.masked_fill(logits < kth_best,", "logits.masked_fill(~keep,")),
    ("top_k_filter", "k not clamped: topk fails when k > V",
     ("    k = min(max(int(k), 1), logits.shape[-1])  # always keep at least the top token\n", "")),
    ("top_k_filter", "filters in place: the caller's logits change",
     ("logits.masked_fill(logits < kth_best", "logits.masked_fill_(logits < kth_best")),
    ("top_p_filter", "the sorted-order decision applied to the unsorted logits",
     ("drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)", "drop = drop_sorted")),
    ("top_p_filter", "the top token is not guaranteed: p = 0 removes everything",
     ("    drop_sorted[..., -1] = False  # the top token is always kept\n", "")),
    ("apply_repetition_penalty", "divides every seen logit: negative ones go up",
     ("torch.where(seen > 0, seen / penalty, seen * penalty)", "seen / penalty")),
    ("apply_repetition_penalty", "every row penalised with every row's tokens",
     ("    seen = logits.gather(-1, prev_ids)",
      "    prev_ids = prev_ids.reshape(1, -1).expand(logits.shape[0], -1)  # (B, B * L): every row's tokens\n"
      "    seen = logits.gather(-1, prev_ids)")),
    ("sample", "draws from the global random state: the generator is ignored",
     ("torch.multinomial(probs, 1, generator=generator)", "torch.multinomial(probs, 1)")),
    ("sample", "multiplies the logits by the temperature",
     (TEMPERED, "logits = logits * temperature")),
    ("sample", "filters before the temperature: the nucleus of the wrong distribution",
     (TEMPERED + "\n            ", ""),
     ("probs = logits.softmax(-1)", "logits = logits / temperature\n            probs = logits.softmax(-1)")),
    ("sample", "top-p before top-k: the nucleus taken before top-k renormalises",
     (TOP_K + "            " + TOP_P, TOP_P + "            " + TOP_K)),
    ("sample", "the repetition penalty only on the greedy path (temperature 0)",
     (PENALTY + "  # BOS is not a repeat\n        if temperature == 0:\n",
      "if temperature == 0:\n            " + PENALTY.replace("\n", "\n    ") + "\n")),
    ("sample", "the repetition penalty counts BOS among the tokens generated so far",
     ("apply_repetition_penalty(logits, tgt[:, 1:], repetition_penalty)",
      "apply_repetition_penalty(logits, tgt, repetition_penalty)")),
    ("beam_search", "every beam alive at the start: the beam fills with copies of one sequence",
     ('scores = torch.full((B, K), float("-inf"), device=device)  # (B, K): total log-prob of each beam\n'
      "    scores[:, 0] = 0.0", "scores = torch.zeros(B, K, device=device)  # (B, K)")),
    ("beam_search", "no length normalisation: the winner by raw log-probability",
     ("best = normalised.argmax(-1)", "best = scores.argmax(-1)")),
    ("beam_search", "normalises by len ** length_penalty, not by GNMT's ((5 + len) / 6) ** length_penalty",
     ("scores / ((5.0 + lengths.float()) / 6.0) ** length_penalty", "scores / lengths.float() ** length_penalty")),
    ("beam_search", "memory repeated with .repeat: beams read other sequences' sources",
     ("memory = memory.repeat_interleave(K, dim=0)", "memory = memory.repeat(K, 1, 1)"),
     ("src_is_real.repeat_interleave(K, dim=0)", "src_is_real.repeat(K, 1)")),
    ("beam_search", "finished beams keep growing: no pad-only continuation after EOS",
     ("        # a finished beam has one continuation, padding, at no cost: its score stays as it was\n"
      '        pad_only = torch.full((V,), float("-inf"), device=device)\n'
      "        pad_only[pad_id] = 0.0\n"
      "        log_probs = torch.where(finished[..., None], pad_only, log_probs)  # (B, K, V)\n", ""),
     ("lengths.gather(1, beam_idx) + (~was_finished).long()", "lengths.gather(1, beam_idx) + 1")),
    ("greedy_decode", "src_is_real ignored: every step attends to the source padding",
     *NO_SOURCE_PADDING),
    ("sample_n",
     "the batch tiled with repeat, read back with view(B, n): samples of one source come from others"),
    ("sample_n",
     "a wrong fix: the sources copied side by side, their padding still tiled",
     ("src_is_real.repeat_interleave(n, dim=0)", "src_is_real.repeat(n, 1)")),
    ("sample_n",
     "a wrong fix: the rows put right, and the output read back as (n, B) then transposed",
     ("return out.view(B, n, -1)", "return out.view(n, B, -1).transpose(0, 1)")),
    ("sample_n",
     "a wrong fix: the batch tiled and read back as (n, B): right samples, but not in the rows the docstring gives",
     ("src_ids.repeat_interleave(n, dim=0)", "src_ids.repeat(n, 1)"),
     ("src_is_real.repeat_interleave(n, dim=0)", "src_is_real.repeat(n, 1)"),
     ("return out.view(B, n, -1)", "return out.view(n, B, -1).transpose(0, 1)")),
]
