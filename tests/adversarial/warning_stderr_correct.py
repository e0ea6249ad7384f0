"""A correct answer that warns and writes to stderr (nbgrader issue 1904 zeroed such answers).

target: causal_mask
full: causal_mask, padding_mask, combine_masks, mask_to_bias
log: causal_mask: passed
"""
import sys
import warnings

warnings.warn("a harmless warning from a correct answer")
print("and a line on stderr", file=sys.stderr)


def causal_mask(T):
    warnings.warn("called on the hidden cases too")
    return np.tril(np.ones((T, T), dtype=bool))
