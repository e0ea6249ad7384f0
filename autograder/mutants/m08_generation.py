"""Wrong answers to lesson 08-generation.

Most are the reference's own code with a line or two changed (``patched``); the rest, whose structure differs,
are written as a student would type them in the notebook, where ``torch``, ``nn``, ``top_k_filter``,
``top_p_filter`` and ``apply_repetition_penalty`` exist.
"""

import torch

from autograder.mutants import mutant, patched, shown_bug
from autograder.reference.generation import apply_repetition_penalty, top_k_filter, top_p_filter  # noqa: F401

MUTANTS: list = []
LESSON = "08-generation"


# -- greedy_decode -----------------------------------------------------------------------------------------------------
NO_SOURCE_PADDING = (("model.encode(src_ids, src_is_real)", "model.encode(src_ids)"),
                     ("model.decode(tgt, memory, src_is_real=src_is_real)", "model.decode(tgt, memory)"))
patched(MUTANTS, LESSON, "greedy_decode", "no finished mask: rows keep generating after their EOS",
        ("        next_id = next_id.masked_fill(finished, pad_id)\n", ""))
patched(MUTANTS, LESSON, "greedy_decode", "src_is_real never reaches the model: source padding counts",
        *NO_SOURCE_PADDING)
patched(MUTANTS, LESSON, "greedy_decode", "reads the first position's logits instead of the last",
        ("next_id = logits[:, -1].argmax(-1)", "next_id = logits[:, 0].argmax(-1)"))
patched(MUTANTS, LESSON, "greedy_decode", "pads with 0 whatever pad_id says",
        ("next_id.masked_fill(finished, pad_id)", "next_id.masked_fill(finished, 0)"))


# -- top_k_filter ------------------------------------------------------------------------------------------------------
KTH = "kth_best = logits.topk(k, dim=-1).values[..., -1:]  # (..., 1): the smallest logit still kept"
patched(MUTANTS, LESSON, "top_k_filter", "keeps exactly the k top indices: ties with the k-th are dropped",
        (KTH, "keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, logits.topk(k, dim=-1).indices, True)"),
        ("logits.masked_fill(logits < kth_best,", "logits.masked_fill(~keep,"))
patched(MUTANTS, LESSON, "top_k_filter", "k not clamped: topk fails when k > V",
        ("    k = min(max(int(k), 1), logits.shape[-1])  # always keep at least the top token\n", ""))
patched(MUTANTS, LESSON, "top_k_filter", "filters in place: the caller's logits change",
        ("logits.masked_fill(logits < kth_best", "logits.masked_fill_(logits < kth_best"))


# -- top_p_filter ------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "top_p_filter", "drops the token that makes the mass reach p")
def top_p_filter(logits, p):  # noqa: F811 - the wrong answer replaces the correct import
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cum = sorted_logits.float().softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cum > p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


patched(MUTANTS, LESSON, "top_p_filter", "the sorted-order decision applied to the unsorted logits",
        ("drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)", "drop = drop_sorted"))
patched(MUTANTS, LESSON, "top_p_filter", "the top token is not guaranteed: p = 0 removes everything",
        ("    drop_sorted[..., -1] = False  # the top token is always kept\n", ""))


# -- apply_repetition_penalty ------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "apply_repetition_penalty", "divides every seen logit: negative ones go up",
        ("torch.where(seen > 0, seen / penalty, seen * penalty)", "seen / penalty"))


@mutant(MUTANTS, "apply_repetition_penalty", "penalises a token once per occurrence")
def apply_repetition_penalty(logits, prev_ids, penalty):  # noqa: F811
    out = logits.clone()
    for b in range(prev_ids.shape[0]):
        for token in prev_ids[b].tolist():
            value = out[b, token]
            out[b, token] = value / penalty if value > 0 else value * penalty
    return out


patched(MUTANTS, LESSON, "apply_repetition_penalty", "every row penalised with every row's tokens",
        ("    seen = logits.gather(-1, prev_ids)",
         "    prev_ids = prev_ids.reshape(1, -1).expand(logits.shape[0], -1)  # (B, B * L): every row's tokens\n"
         "    seen = logits.gather(-1, prev_ids)"))


# -- sample ------------------------------------------------------------------------------------------------------------
TEMPERED = "logits = logits / temperature  # < 1 sharpens the distribution, > 1 flattens it"
TOP_K = "if top_k is not None:\n                logits = top_k_filter(logits, top_k)\n"
TOP_P = "if top_p is not None:\n                logits = top_p_filter(logits, top_p)\n"
PENALTY = ("if repetition_penalty != 1.0:\n"
           "            logits = apply_repetition_penalty(logits, tgt[:, 1:], repetition_penalty)")
patched(MUTANTS, LESSON, "sample", "draws from the global random state: the generator is ignored",
        ("torch.multinomial(probs, 1, generator=generator)", "torch.multinomial(probs, 1)"))
patched(MUTANTS, LESSON, "sample", "multiplies the logits by the temperature",
        (TEMPERED, "logits = logits * temperature"))
patched(MUTANTS, LESSON, "sample", "filters before the temperature: the nucleus of the wrong distribution",
        (TEMPERED + "\n            ", ""),
        ("probs = logits.softmax(-1)", "logits = logits / temperature\n            probs = logits.softmax(-1)"))


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


patched(MUTANTS, LESSON, "sample", "top-p before top-k: the nucleus taken before top-k renormalises",
        (TOP_K + "            " + TOP_P, TOP_P + "            " + TOP_K))
patched(MUTANTS, LESSON, "sample", "the repetition penalty only on the greedy path (temperature 0)",
        (PENALTY + "  # BOS is not a repeat\n        if temperature == 0:\n",
         "if temperature == 0:\n            " + PENALTY.replace("\n", "\n    ") + "\n"))


# -- beam_search -------------------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "beam_search", "every beam alive at the start: the beam fills with copies of one sequence",
        ('scores = torch.full((B, K), float("-inf"), device=device)  # (B, K): total log-prob of each beam\n'
         "    scores[:, 0] = 0.0", "scores = torch.zeros(B, K, device=device)  # (B, K)"))
patched(MUTANTS, LESSON, "beam_search", "no length normalisation: the winner by raw log-probability",
        ("best = normalised.argmax(-1)", "best = scores.argmax(-1)"))
patched(MUTANTS, LESSON, "beam_search", "memory repeated with .repeat: beams read other sequences' sources",
        ("memory = memory.repeat_interleave(K, dim=0)", "memory = memory.repeat(K, 1, 1)"),
        ("src_is_real.repeat_interleave(K, dim=0)", "src_is_real.repeat(K, 1)"))
patched(MUTANTS, LESSON, "beam_search", "finished beams keep growing: no pad-only continuation after EOS",
        ("        # a finished beam has one continuation, padding, at no cost: its score stays as it was\n"
         '        pad_only = torch.full((V,), float("-inf"), device=device)\n'
         "        pad_only[pad_id] = 0.0\n"
         "        log_probs = torch.where(finished[..., None], pad_only, log_probs)  # (B, K, V)\n", ""),
        ("lengths.gather(1, beam_idx) + (~was_finished).long()", "lengths.gather(1, beam_idx) + 1"))

patched(MUTANTS, LESSON, "greedy_decode", "src_is_real ignored: every step attends to the source padding",
        *NO_SOURCE_PADDING)

# The definitions above rebound these names to wrong answers; bind the correct ones again, as in a notebook where
# only one exercise is wrong.
from autograder.reference.generation import (  # noqa: E402, F401, F811
    apply_repetition_penalty,
    top_p_filter,
)

# -- sample_n (find the bug) -------------------------------------------------------------------------------------
shown_bug(MUTANTS, LESSON, "sample_n",
          "the batch tiled with repeat, read back with view(B, n): samples of one source come from others")
patched(MUTANTS, LESSON, "sample_n",
        "a wrong fix: the sources copied side by side, their padding still tiled",
        ("src_is_real.repeat_interleave(n, dim=0)", "src_is_real.repeat(n, 1)"))
patched(MUTANTS, LESSON, "sample_n",
        "a wrong fix: the rows put right, and the output read back as (n, B) then transposed",
        ("return out.view(B, n, -1)", "return out.view(n, B, -1).transpose(0, 1)"))
