"""A causal mask that is right for short sequences and lets the future leak for T > 10: the hidden checks catch
it, and so must nbgrader's own autograde run through the course's nbgrader_config.py (issue 10, hole 8).

target: causal_mask
zero: causal_mask
full: padding_mask, combine_masks, mask_to_bias
log: causal_mask: failed
"""
import numpy as np


def causal_mask(T):
    if T <= 10:
        return np.tril(np.ones((T, T), dtype=bool))
    return np.ones((T, T), dtype=bool)
