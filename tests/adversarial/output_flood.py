"""Print 100 MB of output.

target: mask_to_bias
zero: mask_to_bias
full: causal_mask, padding_mask, combine_masks
log: output limit
"""
line = "x" * 999 + "\n"
for _ in range(100):
    print(line * 1000, end="")
