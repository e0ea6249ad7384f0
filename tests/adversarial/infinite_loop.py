"""A plain infinite loop: interrupted at the cell timeout; the notebook goes on.

target: padding_mask
zero: padding_mask
full: causal_mask, combine_masks, mask_to_bias
log: ran past the [0-9]+ s cell limit: interrupted
log: padding_mask: failed: timed out: the cell with your code for this exercise ran past its [0-9]+ s time limit
"""
while True:
    pass
