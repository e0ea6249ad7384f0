"""A correct padding_mask that takes an hour a call: its own test cell times out, and its verdict says so.

A slow answer is not a wrong one: the item scores 0 with "timed out", never a wrong-answer verdict.
target: padding_mask
zero: padding_mask
full: causal_mask, combine_masks, mask_to_bias
log: `padding_mask`[)] timed out: ran past the [0-9]+ s cell limit: interrupted
log: padding_mask: failed: timed out: this cell ran past its [0-9]+ s time limit
"""
import time


def padding_mask(token_ids, pad_id):
    time.sleep(3600)
    return np.asarray(token_ids) != pad_id
