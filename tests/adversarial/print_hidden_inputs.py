"""Correct answers that print their arguments: the hidden inputs must not reach the feedback.

target: padding_mask
full: causal_mask, padding_mask, combine_masks, mask_to_bias
log: padding_mask: passed
"""


def padding_mask(token_ids, pad_id):
    print("token_ids:", np.asarray(token_ids).tolist(), "pad_id:", pad_id)
    print(repr(token_ids))
    return np.asarray(token_ids) != pad_id
