"""Run a long computation in C (no bytecode, so no signal check): the interrupt is not seen for minutes.

target: combine_masks
zero: combine_masks, mask_to_bias
full: causal_mask, padding_mask
log: did not stop within [0-9]+ s of being interrupted
log: mask_to_bias: failed: not run: cell [0-9]+ [(]`combine_masks_solution`[)] timed out
"""
sum(range(10**13))
