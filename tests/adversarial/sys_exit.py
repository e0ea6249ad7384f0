"""Raise SystemExit(0) in a cell before defining the function (IPython reports it; the notebook goes on).

target: causal_mask
zero: causal_mask
full: padding_mask, combine_masks, mask_to_bias
log: causal_mask: failed
"""
import sys

sys.exit(0)


def causal_mask(T):
    return np.tril(np.ones((T, T), dtype=bool))
