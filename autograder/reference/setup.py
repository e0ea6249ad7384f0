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
