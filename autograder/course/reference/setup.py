"""Reference for lesson 00-setup: einops ``rearrange`` warm-ups on (B, T, D) arrays.

Each warm-up works on NumPy arrays and PyTorch tensors alike: ``rearrange`` names every axis, and einops
checks the names against the input's shape, so a wrong pattern fails loudly instead of silently mixing axes.
"""

import numpy as np
from einops import rearrange


def flatten_batch(x: np.ndarray) -> np.ndarray:
    """Merge the batch and time axes into one axis of B * T rows, batch-major.

    Returns a new arrangement; the caller's array is unchanged.

    Shape:
        x: (B, T, D) -> (B * T, D); row ``b * T + t`` is ``x[b, t]``
    """
    ### BEGIN SOLUTION
    # "(b t)" puts b outside t: all of sequence 0, then all of sequence 1, ...
    return rearrange(x, "b t d -> (b t) d")  # (B * T, D)
    ### END SOLUTION


def time_major(x: np.ndarray) -> np.ndarray:
    """Swap the batch and time axes.

    Returns a new arrangement; the caller's array is unchanged.

    Shape:
        x: (B, T, D) -> (T, B, D)
    """
    ### BEGIN SOLUTION
    return rearrange(x, "b t d -> t b d")  # (T, B, D)
    ### END SOLUTION


def split_last(x: np.ndarray, H: int) -> np.ndarray:
    """Split the last axis into H groups of Dh = D // H features.

    Returns a new arrangement; the caller's array is unchanged.

    Shape:
        x: (B, T, D) -> (B, T, H, Dh); ``out[b, t, h]`` is ``x[b, t, h * Dh:(h + 1) * Dh]``
    """
    ### BEGIN SOLUTION
    # "(h dh)" with h outside: group h holds D's features h*Dh ... (h+1)*Dh - 1
    return rearrange(x, "b t (h dh) -> b t h dh", h=H)  # (B, T, H, Dh)
    ### END SOLUTION


# -- known mistakes ------------------------------------------------------------------------------------------------
# Realistic wrong answers, each this module's code with a few lines changed: (item, what is wrong, (old, new), ...),
# applied by autograder.course.mutants.patched (each old must occur exactly once in the item's code, so an edit above
# that
# moves a line breaks its mistake loudly). (item, what is wrong) alone is the bug a find-the-bug exercise's release
# shows. Every one must cost its own item and no other, in both layers of checks (tests/test_hidden_checks.py,
# tests/test_visible_catch_rate.py); whole wrong answers of another structure live in autograder/course/mutants/.

FLAT, MAJOR, SPLIT = '"b t d -> (b t) d"', '"b t d -> t b d"', '"b t (h dh) -> b t h dh", h=H'
MISTAKES = [
    ("flatten_batch", "time-major order: (t b) instead of (b t)",
     (FLAT, '"b t d -> (t b) d"')),
    ("flatten_batch", "merges T and D instead of B and T",
     (f"rearrange(x, {FLAT})", "x.reshape(x.shape[0], -1)")),
    ("flatten_batch", "flattens everything into one axis", (FLAT, '"b t d -> (b t d)"')),
    ("time_major", "reshape instead of transpose: same shape, scrambled values",
     (f"rearrange(x, {MAJOR})", "x.reshape(x.shape[1], x.shape[0], x.shape[2])")),
    ("time_major", "NumPy's .T reverses every axis: (D, T, B)", (f"rearrange(x, {MAJOR})", "x.T")),
    ("time_major", "swaps T and D instead of B and T", (MAJOR, '"b t d -> b d t"')),
    ("split_last", "(dh h): the heads' features interleaved",
     (SPLIT, '"b t (dh h) -> b t h dh", h=H')),
    ("split_last", "H hard-coded from the worked example", (SPLIT, SPLIT.replace("h=H", "h=3"))),
    ("split_last", "heads moved before time: (B, H, T, Dh)",
     (SPLIT, '"b t (h dh) -> b h t dh", h=H')),
]
