"""Wrong answers to lesson 01-masks."""

import numpy as np

from autograder.mutants import mutant

MUTANTS: list = []


@mutant(MUTANTS, "causal_mask", "strictly lower triangle: a token cannot see itself")
def causal_mask(T):
    return np.tril(np.ones((T, T), dtype=bool), k=-1)


@mutant(MUTANTS, "causal_mask", "upper triangle: polarity of the future inverted")
def causal_mask(T):  # noqa: F811 - each mutant is a separate wrong answer
    return np.triu(np.ones((T, T), dtype=bool))


@mutant(MUTANTS, "causal_mask", "0/1 integers instead of booleans")
def causal_mask(T):  # noqa: F811
    return np.tril(np.ones((T, T), dtype=int))


@mutant(MUTANTS, "padding_mask", "assumes the pad id is 0")
def padding_mask(token_ids, pad_id):
    return token_ids != 0


@mutant(MUTANTS, "padding_mask", "inverted polarity: True marks the padding")
def padding_mask(token_ids, pad_id):  # noqa: F811
    return token_ids == pad_id


@mutant(MUTANTS, "combine_masks", "key padding put on the query axis")
def combine_masks(causal, key_is_real):
    return causal[None, None, :, :] & key_is_real[:, None, :, None]


@mutant(MUTANTS, "combine_masks", "OR instead of AND")
def combine_masks(causal, key_is_real):  # noqa: F811
    return causal[None, None] | key_is_real[:, None, None, :]


@mutant(MUTANTS, "mask_to_bias", "-inf for blocked entries")
def mask_to_bias(allowed, dtype=np.float32):
    return np.where(allowed, 0, -np.inf).astype(dtype)


@mutant(MUTANTS, "mask_to_bias", "-1e9, which overflows float16")
def mask_to_bias(allowed, dtype=np.float32):  # noqa: F811
    with np.errstate(over="ignore"):
        return np.where(allowed, 0, -1e9).astype(dtype)


@mutant(MUTANTS, "mask_to_bias", "ignores the requested dtype")
def mask_to_bias(allowed, dtype=np.float32):  # noqa: F811
    return np.where(allowed, 0.0, np.finfo(np.float64).min)
