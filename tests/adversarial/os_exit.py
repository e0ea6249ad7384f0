"""Exit the kernel process at once with os._exit(0): no exception, no reply.

target: padding_mask
zero: padding_mask, combine_masks, mask_to_bias
full: causal_mask
log: the kernel exited with status 0
"""
import os

os._exit(0)
