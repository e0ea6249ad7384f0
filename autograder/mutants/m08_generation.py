"""Wrong answers to lesson 08-generation.

Each is written as a student would type it in the notebook, where ``torch``, ``nn``, ``top_k_filter``,
``top_p_filter`` and ``apply_repetition_penalty`` exist.
"""

import torch

from autograder.mutants import mutant, patched, shown_bug

MUTANTS: list = []


# -- greedy_decode -----------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "greedy_decode", "no finished mask: rows keep generating after their EOS")
@torch.no_grad()
def greedy_decode(model, src_ids, max_len, bos_id, eos_id, src_is_real=None, pad_id=0):
    memory = model.encode(src_ids, src_is_real)
    tgt = torch.full((src_ids.shape[0], 1), bos_id, dtype=torch.long)
    for _ in range(max_len):
        next_id = model.decode(tgt, memory, src_is_real=src_is_real)[:, -1].argmax(-1)
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)
        if bool((tgt == eos_id).any(dim=1).all()):
            break
    return tgt[:, 1:]


@mutant(MUTANTS, "greedy_decode", "src_is_real never reaches the model: source padding counts")
@torch.no_grad()
def greedy_decode(model, src_ids, max_len, bos_id, eos_id, src_is_real=None, pad_id=0):  # noqa: F811
    memory = model.encode(src_ids)
    tgt = torch.full((src_ids.shape[0], 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src_ids.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        next_id = model.decode(tgt, memory)[:, -1].argmax(-1).masked_fill(finished, pad_id)
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
    return tgt[:, 1:]


@mutant(MUTANTS, "greedy_decode", "reads the first position's logits instead of the last")
@torch.no_grad()
def greedy_decode(model, src_ids, max_len, bos_id, eos_id, src_is_real=None, pad_id=0):  # noqa: F811
    memory = model.encode(src_ids, src_is_real)
    tgt = torch.full((src_ids.shape[0], 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src_ids.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        next_id = model.decode(tgt, memory, src_is_real=src_is_real)[:, 0].argmax(-1).masked_fill(finished, pad_id)
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
    return tgt[:, 1:]


@mutant(MUTANTS, "greedy_decode", "pads with 0 whatever pad_id says")
@torch.no_grad()
def greedy_decode(model, src_ids, max_len, bos_id, eos_id, src_is_real=None, pad_id=0):  # noqa: F811
    memory = model.encode(src_ids, src_is_real)
    tgt = torch.full((src_ids.shape[0], 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src_ids.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        next_id = model.decode(tgt, memory, src_is_real=src_is_real)[:, -1].argmax(-1).masked_fill(finished, 0)
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
    return tgt[:, 1:]


# -- top_k_filter ------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "top_k_filter", "keeps exactly the k top indices: ties with the k-th are dropped")
def top_k_filter(logits, k):
    k = min(max(int(k), 1), logits.shape[-1])
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, logits.topk(k, dim=-1).indices, True)
    return logits.masked_fill(~keep, float("-inf"))


@mutant(MUTANTS, "top_k_filter", "k not clamped: topk fails when k > V")
def top_k_filter(logits, k):  # noqa: F811
    kth_best = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth_best, float("-inf"))


@mutant(MUTANTS, "top_k_filter", "filters in place: the caller's logits change")
def top_k_filter(logits, k):  # noqa: F811
    k = min(max(int(k), 1), logits.shape[-1])
    kth_best = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill_(logits < kth_best, float("-inf"))


# -- top_p_filter ------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "top_p_filter", "drops the token that makes the mass reach p")
def top_p_filter(logits, p):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cum = sorted_logits.float().softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cum > p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


@mutant(MUTANTS, "top_p_filter", "the sorted-order decision applied to the unsorted logits")
def top_p_filter(logits, p):  # noqa: F811
    sorted_logits, _ = logits.sort(dim=-1, descending=True)
    cum = sorted_logits.float().softmax(dim=-1).cumsum(dim=-1)
    drop = (cum - sorted_logits.float().softmax(dim=-1)) >= p
    return logits.masked_fill(drop, float("-inf"))


@mutant(MUTANTS, "top_p_filter", "the top token is not guaranteed: p = 0 removes everything")
def top_p_filter(logits, p):  # noqa: F811
    sorted_logits, order = logits.sort(dim=-1)
    tail_mass = sorted_logits.float().softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = tail_mass <= 1.0 - p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


# -- apply_repetition_penalty ------------------------------------------------------------------------------------------
@mutant(MUTANTS, "apply_repetition_penalty", "divides every seen logit: negative ones go up")
def apply_repetition_penalty(logits, prev_ids, penalty):
    return logits.scatter(-1, prev_ids, logits.gather(-1, prev_ids) / penalty)


@mutant(MUTANTS, "apply_repetition_penalty", "penalises a token once per occurrence")
def apply_repetition_penalty(logits, prev_ids, penalty):  # noqa: F811
    out = logits.clone()
    for b in range(prev_ids.shape[0]):
        for token in prev_ids[b].tolist():
            value = out[b, token]
            out[b, token] = value / penalty if value > 0 else value * penalty
    return out


@mutant(MUTANTS, "apply_repetition_penalty", "every row penalised with every row's tokens")
def apply_repetition_penalty(logits, prev_ids, penalty):  # noqa: F811
    seen = torch.unique(prev_ids)
    out = logits.clone()
    out[:, seen] = torch.where(out[:, seen] > 0, out[:, seen] / penalty, out[:, seen] * penalty)
    return out


# -- sample ------------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "sample", "draws from the global random state: the generator is ignored")
@torch.no_grad()
def sample(model, src_ids, max_len, bos_id, eos_id, temperature=1.0, top_k=None, top_p=None,
           repetition_penalty=1.0, generator=None, src_is_real=None, pad_id=0):
    B = src_ids.shape[0]
    memory = model.encode(src_ids, src_is_real)
    tgt = torch.full((B, 1), bos_id, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_len):
        logits = model.decode(tgt, memory, src_is_real=src_is_real)[:, -1].float()
        if repetition_penalty != 1.0:
            logits = apply_repetition_penalty(logits, tgt[:, 1:], repetition_penalty)
        if temperature == 0:
            next_id = logits.argmax(-1)
        else:
            logits = logits / temperature
            if top_k is not None:
                logits = top_k_filter(logits, top_k)
            if top_p is not None:
                logits = top_p_filter(logits, top_p)
            next_id = torch.multinomial(logits.softmax(-1), 1).squeeze(-1)
        next_id = next_id.masked_fill(finished, pad_id)
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
    return tgt[:, 1:]


@mutant(MUTANTS, "sample", "multiplies the logits by the temperature")
@torch.no_grad()
def sample(model, src_ids, max_len, bos_id, eos_id, temperature=1.0, top_k=None, top_p=None,  # noqa: F811
           repetition_penalty=1.0, generator=None, src_is_real=None, pad_id=0):
    B = src_ids.shape[0]
    memory = model.encode(src_ids, src_is_real)
    tgt = torch.full((B, 1), bos_id, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_len):
        logits = model.decode(tgt, memory, src_is_real=src_is_real)[:, -1].float()
        if repetition_penalty != 1.0:
            logits = apply_repetition_penalty(logits, tgt[:, 1:], repetition_penalty)
        if temperature == 0:
            next_id = logits.argmax(-1)
        else:
            logits = logits * temperature
            if top_k is not None:
                logits = top_k_filter(logits, top_k)
            if top_p is not None:
                logits = top_p_filter(logits, top_p)
            next_id = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)
        next_id = next_id.masked_fill(finished, pad_id)
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
    return tgt[:, 1:]


@mutant(MUTANTS, "sample", "filters before the temperature: the nucleus of the wrong distribution")
@torch.no_grad()
def sample(model, src_ids, max_len, bos_id, eos_id, temperature=1.0, top_k=None, top_p=None,  # noqa: F811
           repetition_penalty=1.0, generator=None, src_is_real=None, pad_id=0):
    B = src_ids.shape[0]
    memory = model.encode(src_ids, src_is_real)
    tgt = torch.full((B, 1), bos_id, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_len):
        logits = model.decode(tgt, memory, src_is_real=src_is_real)[:, -1].float()
        if repetition_penalty != 1.0:
            logits = apply_repetition_penalty(logits, tgt[:, 1:], repetition_penalty)
        if temperature == 0:
            next_id = logits.argmax(-1)
        else:
            if top_k is not None:
                logits = top_k_filter(logits, top_k)
            if top_p is not None:
                logits = top_p_filter(logits, top_p)
            logits = logits / temperature
            next_id = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)
        next_id = next_id.masked_fill(finished, pad_id)
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
    return tgt[:, 1:]


@mutant(MUTANTS, "sample", "temperature 0 divides by zero instead of taking the argmax")
@torch.no_grad()
def sample(model, src_ids, max_len, bos_id, eos_id, temperature=1.0, top_k=None, top_p=None,  # noqa: F811
           repetition_penalty=1.0, generator=None, src_is_real=None, pad_id=0):
    B = src_ids.shape[0]
    memory = model.encode(src_ids, src_is_real)
    tgt = torch.full((B, 1), bos_id, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_len):
        logits = model.decode(tgt, memory, src_is_real=src_is_real)[:, -1].float()
        if repetition_penalty != 1.0:
            logits = apply_repetition_penalty(logits, tgt[:, 1:], repetition_penalty)
        logits = logits / temperature
        if top_k is not None:
            logits = top_k_filter(logits, top_k)
        if top_p is not None:
            logits = top_p_filter(logits, top_p)
        next_id = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)
        next_id = next_id.masked_fill(finished, pad_id)
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
    return tgt[:, 1:]


@mutant(MUTANTS, "sample", "top-p before top-k: the nucleus taken before top-k renormalises")
@torch.no_grad()
def sample(model, src_ids, max_len, bos_id, eos_id, temperature=1.0, top_k=None, top_p=None,  # noqa: F811
           repetition_penalty=1.0, generator=None, src_is_real=None, pad_id=0):
    B = src_ids.shape[0]
    memory = model.encode(src_ids, src_is_real)
    tgt = torch.full((B, 1), bos_id, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_len):
        logits = model.decode(tgt, memory, src_is_real=src_is_real)[:, -1].float()
        if repetition_penalty != 1.0:
            logits = apply_repetition_penalty(logits, tgt[:, 1:], repetition_penalty)
        if temperature == 0:
            next_id = logits.argmax(-1)
        else:
            logits = logits / temperature
            if top_p is not None:
                logits = top_p_filter(logits, top_p)
            if top_k is not None:
                logits = top_k_filter(logits, top_k)
            next_id = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)
        next_id = next_id.masked_fill(finished, pad_id)
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
    return tgt[:, 1:]


@mutant(MUTANTS, "sample", "the repetition penalty only on the greedy path (temperature 0)")
@torch.no_grad()
def sample(model, src_ids, max_len, bos_id, eos_id, temperature=1.0, top_k=None, top_p=None,  # noqa: F811
           repetition_penalty=1.0, generator=None, src_is_real=None, pad_id=0):
    B = src_ids.shape[0]
    memory = model.encode(src_ids, src_is_real)
    tgt = torch.full((B, 1), bos_id, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_len):
        logits = model.decode(tgt, memory, src_is_real=src_is_real)[:, -1].float()
        if temperature == 0:
            if repetition_penalty != 1.0:
                logits = apply_repetition_penalty(logits, tgt[:, 1:], repetition_penalty)
            next_id = logits.argmax(-1)
        else:
            logits = logits / temperature
            if top_k is not None:
                logits = top_k_filter(logits, top_k)
            if top_p is not None:
                logits = top_p_filter(logits, top_p)
            next_id = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)
        next_id = next_id.masked_fill(finished, pad_id)
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
    return tgt[:, 1:]


# -- beam_search -------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "beam_search", "every beam alive at the start: the beam fills with copies of one sequence")
@torch.no_grad()
def beam_search(model, src_ids, max_len, bos_id, eos_id, beam_size=4, length_penalty=1.0, src_is_real=None,
                pad_id=0):
    B, K = src_ids.shape[0], beam_size
    memory = model.encode(src_ids, src_is_real).repeat_interleave(K, dim=0)
    beam_is_real = None if src_is_real is None else src_is_real.repeat_interleave(K, dim=0)
    tgt = torch.full((B * K, 1), bos_id, dtype=torch.long)
    scores = torch.zeros(B, K)
    finished = torch.zeros(B, K, dtype=torch.bool)
    lengths = torch.zeros(B, K, dtype=torch.long)
    for _ in range(max_len):
        log_probs = model.decode(tgt, memory, src_is_real=beam_is_real)[:, -1].float().log_softmax(-1).view(B, K, -1)
        V = log_probs.shape[-1]
        pad_only = torch.full((V,), float("-inf"))
        pad_only[pad_id] = 0.0
        log_probs = torch.where(finished[..., None], pad_only, log_probs)
        scores, flat_idx = (scores[..., None] + log_probs).view(B, K * V).topk(K, dim=-1)
        beam_idx, token = flat_idx // V, flat_idx % V
        rows = (torch.arange(B)[:, None] * K + beam_idx).view(-1)
        tgt = torch.cat([tgt[rows], token.view(-1, 1)], dim=1)
        was_finished = finished.gather(1, beam_idx)
        lengths = lengths.gather(1, beam_idx) + (~was_finished).long()
        finished = was_finished | (token == eos_id)
        if bool(finished.all()):
            break
    best = (scores / ((5.0 + lengths.float()) / 6.0) ** length_penalty).argmax(-1)
    best_ids = tgt.view(B, K, -1)[torch.arange(B), best, 1:]
    return best_ids[:, : int(lengths.gather(1, best[:, None]).max())]


@mutant(MUTANTS, "beam_search", "no length normalisation: the winner by raw log-probability")
@torch.no_grad()
def beam_search(model, src_ids, max_len, bos_id, eos_id, beam_size=4, length_penalty=1.0,  # noqa: F811
                src_is_real=None, pad_id=0):
    B, K = src_ids.shape[0], beam_size
    memory = model.encode(src_ids, src_is_real).repeat_interleave(K, dim=0)
    beam_is_real = None if src_is_real is None else src_is_real.repeat_interleave(K, dim=0)
    tgt = torch.full((B * K, 1), bos_id, dtype=torch.long)
    scores = torch.full((B, K), float("-inf"))
    scores[:, 0] = 0.0
    finished = torch.zeros(B, K, dtype=torch.bool)
    lengths = torch.zeros(B, K, dtype=torch.long)
    for _ in range(max_len):
        log_probs = model.decode(tgt, memory, src_is_real=beam_is_real)[:, -1].float().log_softmax(-1).view(B, K, -1)
        V = log_probs.shape[-1]
        pad_only = torch.full((V,), float("-inf"))
        pad_only[pad_id] = 0.0
        log_probs = torch.where(finished[..., None], pad_only, log_probs)
        scores, flat_idx = (scores[..., None] + log_probs).view(B, K * V).topk(K, dim=-1)
        beam_idx, token = flat_idx // V, flat_idx % V
        rows = (torch.arange(B)[:, None] * K + beam_idx).view(-1)
        tgt = torch.cat([tgt[rows], token.view(-1, 1)], dim=1)
        was_finished = finished.gather(1, beam_idx)
        lengths = lengths.gather(1, beam_idx) + (~was_finished).long()
        finished = was_finished | (token == eos_id)
        if bool(finished.all()):
            break
    best = scores.argmax(-1)
    best_ids = tgt.view(B, K, -1)[torch.arange(B), best, 1:]
    return best_ids[:, : int(lengths.gather(1, best[:, None]).max())]


@mutant(MUTANTS, "beam_search", "memory repeated with .repeat: beams read other sequences' sources")
@torch.no_grad()
def beam_search(model, src_ids, max_len, bos_id, eos_id, beam_size=4, length_penalty=1.0,  # noqa: F811
                src_is_real=None, pad_id=0):
    B, K = src_ids.shape[0], beam_size
    memory = model.encode(src_ids, src_is_real).repeat(K, 1, 1)
    beam_is_real = None if src_is_real is None else src_is_real.repeat(K, 1)
    tgt = torch.full((B * K, 1), bos_id, dtype=torch.long)
    scores = torch.full((B, K), float("-inf"))
    scores[:, 0] = 0.0
    finished = torch.zeros(B, K, dtype=torch.bool)
    lengths = torch.zeros(B, K, dtype=torch.long)
    for _ in range(max_len):
        log_probs = model.decode(tgt, memory, src_is_real=beam_is_real)[:, -1].float().log_softmax(-1).view(B, K, -1)
        V = log_probs.shape[-1]
        pad_only = torch.full((V,), float("-inf"))
        pad_only[pad_id] = 0.0
        log_probs = torch.where(finished[..., None], pad_only, log_probs)
        scores, flat_idx = (scores[..., None] + log_probs).view(B, K * V).topk(K, dim=-1)
        beam_idx, token = flat_idx // V, flat_idx % V
        rows = (torch.arange(B)[:, None] * K + beam_idx).view(-1)
        tgt = torch.cat([tgt[rows], token.view(-1, 1)], dim=1)
        was_finished = finished.gather(1, beam_idx)
        lengths = lengths.gather(1, beam_idx) + (~was_finished).long()
        finished = was_finished | (token == eos_id)
        if bool(finished.all()):
            break
    best = (scores / ((5.0 + lengths.float()) / 6.0) ** length_penalty).argmax(-1)
    best_ids = tgt.view(B, K, -1)[torch.arange(B), best, 1:]
    return best_ids[:, : int(lengths.gather(1, best[:, None]).max())]


@mutant(MUTANTS, "beam_search", "finished beams keep growing: no pad-only continuation after EOS")
@torch.no_grad()
def beam_search(model, src_ids, max_len, bos_id, eos_id, beam_size=4, length_penalty=1.0,  # noqa: F811
                src_is_real=None, pad_id=0):
    B, K = src_ids.shape[0], beam_size
    memory = model.encode(src_ids, src_is_real).repeat_interleave(K, dim=0)
    beam_is_real = None if src_is_real is None else src_is_real.repeat_interleave(K, dim=0)
    tgt = torch.full((B * K, 1), bos_id, dtype=torch.long)
    scores = torch.full((B, K), float("-inf"))
    scores[:, 0] = 0.0
    lengths = torch.zeros(B, K, dtype=torch.long)
    for _ in range(max_len):
        log_probs = model.decode(tgt, memory, src_is_real=beam_is_real)[:, -1].float().log_softmax(-1).view(B, K, -1)
        V = log_probs.shape[-1]
        scores, flat_idx = (scores[..., None] + log_probs).view(B, K * V).topk(K, dim=-1)
        beam_idx, token = flat_idx // V, flat_idx % V
        rows = (torch.arange(B)[:, None] * K + beam_idx).view(-1)
        tgt = torch.cat([tgt[rows], token.view(-1, 1)], dim=1)
        lengths = lengths.gather(1, beam_idx) + 1
    best = (scores / ((5.0 + lengths.float()) / 6.0) ** length_penalty).argmax(-1)
    return tgt.view(B, K, -1)[torch.arange(B), best, 1:]


# The definitions above rebound these names to wrong answers; a wrong answer that calls another exercise must
# find the correct one, as in a notebook where only that one exercise is wrong.
@mutant(MUTANTS, "greedy_decode", "src_is_real ignored: every step attends to the source padding")
def greedy_decode(model, src_ids, max_len, bos_id, eos_id, src_is_real=None, pad_id=0):  # noqa: F811
    B = src_ids.shape[0]
    memory = model.encode(src_ids)
    tgt = torch.full((B, 1), bos_id, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_len):
        next_id = model.decode(tgt, memory)[:, -1].argmax(-1).masked_fill(finished, pad_id)
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
    return tgt[:, 1:]


from autograder.reference.generation import (  # noqa: E402, F401, F811
    apply_repetition_penalty,
    top_k_filter,
    top_p_filter,
)

# -- sample_n (find the bug) -------------------------------------------------------------------------------------
shown_bug(MUTANTS, "08-generation", "sample_n",
          "the batch tiled with repeat, read back with view(B, n): samples of one source come from others")
patched(MUTANTS, "08-generation", "sample_n",
        "a wrong fix: the sources copied side by side, their padding still tiled",
        ("src_is_real.repeat_interleave(n, dim=0)", "src_is_real.repeat(n, 1)"))
patched(MUTANTS, "08-generation", "sample_n",
        "a wrong fix: the rows put right, and the output read back as (n, B) then transposed",
        ("return out.view(B, n, -1)", "return out.view(n, B, -1).transpose(0, 1)"))
