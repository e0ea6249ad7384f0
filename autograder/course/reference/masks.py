"""Reference for lesson 01-masks (NumPy): causal and padding masks, how they combine, and additive biases.

Convention: a mask is boolean and True means "this query may attend to this key" (``allowed``), as in
``torch.nn.functional.scaled_dot_product_attention``; it broadcasts to (B, H, T, S). Padding is ``is_real``,
True for real tokens.
"""

import numpy as np


def causal_mask(T: int) -> np.ndarray:
    """Causal mask: query t may attend to keys 0..t (on and below the diagonal), never to the future.

    Shape:
        returns: (T, T) bool, ``allowed[t, s] = s <= t``
    """
    ### BEGIN SOLUTION
    q_pos = np.arange(T)[:, None]  # (T, 1): one row per query position
    k_pos = np.arange(T)[None, :]  # (1, T): one column per key position
    # a key is visible when it is not later than the query (the diagonal is allowed: a token sees itself)
    return k_pos <= q_pos  # (T, T)
    ### END SOLUTION


def padding_mask(token_ids: np.ndarray, pad_id: int) -> np.ndarray:
    """Which tokens are real (not padding).

    Returns a new array; the caller's ``token_ids`` are unchanged.

    Shape:
        token_ids: (B, S) int -> is_real: (B, S) bool, True for real tokens
    """
    ### BEGIN SOLUTION
    # compare with the vocabulary's own pad id: it need not be 0
    return np.asarray(token_ids) != pad_id  # (B, S)
    ### END SOLUTION


def combine_masks(causal: np.ndarray, key_is_real: np.ndarray) -> np.ndarray:
    """Allow a (query, key) pair only when the causal mask allows it and the key is a real token.

    Returns a new array; the caller's masks are unchanged.

    Shape:
        causal: (T, S) bool, key_is_real: (B, S) bool -> allowed: (B, 1, T, S) bool (1 broadcasts over heads)
    """
    ### BEGIN SOLUTION
    causal = causal[None, None, :, :]  # (1, 1, T, S): the same for every sequence and head
    key_is_real = key_is_real[:, None, None, :]  # (B, 1, 1, S): the same for every head and query
    return causal & key_is_real  # (B, 1, T, S)
    ### END SOLUTION


def mask_to_bias(allowed: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Additive bias for attention scores: 0 where allowed, the most negative finite value where blocked.

    The bias has the requested ``dtype``: exactly 0 where allowed and ``np.finfo(dtype).min`` where blocked (never
    -inf, which turns a fully blocked row into NaN, and never -1e9, which float16 cannot hold).

    Shape:
        allowed: (...) bool -> bias: (...) of ``dtype``
    """
    ### BEGIN SOLUTION
    # Why not -inf: a query whose keys are all blocked gets a row of -inf, and softmax computes
    #   exp(-inf - (-inf)) = exp(nan): the whole row turns NaN and spreads through every later layer.
    # Why not -1e9: float16 cannot hold it (its largest magnitude is 65504), so it becomes -inf in half
    #   precision and the NaN is back; in float32 it silently makes a fully blocked row a uniform average.
    # finfo(dtype).min is finite in every dtype and exp(min - max) underflows to exactly 0. Adding it to a
    # negative score can still round to -inf in float16: harmless while the row keeps one allowed key; a
    # fully blocked row still needs its weights set to zero explicitly (lesson 02).
    very_negative = np.finfo(dtype).min
    return np.where(allowed, 0, very_negative).astype(dtype)  # same shape as allowed
    ### END SOLUTION


# -- known mistakes ------------------------------------------------------------------------------------------------
# Realistic wrong answers, each this module's code with a few lines changed: (item, what is wrong, (old, new), ...),
# applied by autograder.course.mutants.patched (each old must occur exactly once in the item's code, so an edit above
# that
# moves a line breaks its mistake loudly). (item, what is wrong) alone is the bug a find-the-bug exercise's release
# shows. Every one must cost its own item and no other, in both layers of checks (tests/test_hidden_checks.py,
# tests/test_visible_catch_rate.py); whole wrong answers of another structure live in autograder/course/mutants/.
MISTAKES = [
    ("causal_mask", "strictly lower triangle: a token cannot see itself",
     ("return k_pos <= q_pos", "return k_pos < q_pos")),
    ("causal_mask", "upper triangle: polarity of the future inverted",
     ("return k_pos <= q_pos", "return k_pos >= q_pos")),
    ("causal_mask", "0/1 integers instead of booleans",
     ("return k_pos <= q_pos", "return (k_pos <= q_pos).astype(int)")),
    ("padding_mask", "assumes the pad id is 0",
     ("!= pad_id", "!= 0")),
    ("padding_mask", "inverted polarity: True marks the padding",
     ("!= pad_id", "== pad_id")),
    ("padding_mask", "0/1 integers instead of booleans",
     ("return np.asarray(token_ids) != pad_id", "return (np.asarray(token_ids) != pad_id).astype(np.int64)")),
    ("combine_masks", "key padding put on the query axis",
     ("key_is_real[:, None, None, :]", "key_is_real[:, None, :, None]")),
    ("combine_masks", "OR instead of AND",
     ("return causal & key_is_real", "return causal | key_is_real")),
    ("combine_masks", "no head axis: (B, T, S), which broadcasts the batch against the heads of (B, H, T, S)",
     ("causal[None, None, :, :]", "causal[None, :, :]"),
     ("key_is_real[:, None, None, :]", "key_is_real[:, None, :]")),
    ("mask_to_bias", "-inf for blocked entries",
     ("very_negative = np.finfo(dtype).min", "very_negative = -np.inf")),
    ("mask_to_bias", "-1e9, which overflows float16",
     ("very_negative = np.finfo(dtype).min", "very_negative = -1e9")),
    ("mask_to_bias", "ignores the requested dtype",
     ("return np.where(allowed, 0, very_negative).astype(dtype)",
      "return np.where(allowed, 0.0, np.finfo(np.float64).min)")),
]
