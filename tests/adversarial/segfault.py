"""Crash the kernel with a segmentation fault (read address 0 through ctypes).

target: combine_masks
zero: combine_masks, mask_to_bias
full: causal_mask, padding_mask
log: segmentation fault
"""
import ctypes

ctypes.string_at(0)
