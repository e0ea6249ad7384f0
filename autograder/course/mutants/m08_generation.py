"""Whole wrong answers to lesson 08-generation (the patches of the reference are its ``MISTAKES``), whose structure
differs from the reference's, written as a student would type them in the notebook, where ``torch``, ``nn``,
``top_k_filter``, ``top_p_filter`` and ``apply_repetition_penalty`` exist.
"""

import torch

from autograder.course.mutants import mutant
from autograder.course.reference.generation import apply_repetition_penalty, top_k_filter, top_p_filter  # noqa: F401

MUTANTS: list = []


# -- top_p_filter ------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "top_p_filter", "drops the token that makes the mass reach p")
def top_p_filter(logits, p):  # noqa: F811 - the wrong answer replaces the correct import
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cum = sorted_logits.float().softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cum > p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


# -- apply_repetition_penalty ------------------------------------------------------------------------------------------


@mutant(MUTANTS, "apply_repetition_penalty", "penalises a token once per occurrence")
def apply_repetition_penalty(logits, prev_ids, penalty):  # noqa: F811
    out = logits.clone()
    for b in range(prev_ids.shape[0]):
        for token in prev_ids[b].tolist():
            value = out[b, token]
            out[b, token] = value / penalty if value > 0 else value * penalty
    return out


# -- sample ------------------------------------------------------------------------------------------------------------


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


# The definitions above rebound these names to wrong answers; bind the correct ones again, as in a notebook where
# only one exercise is wrong.
from autograder.course.reference.generation import (  # noqa: E402, F401, F811
    apply_repetition_penalty,
    top_p_filter,
)

