"""A memory bomb: allocate and touch 64 MB blocks until the address-space limit says no.

target: mask_to_bias
zero: mask_to_bias
full: causal_mask, padding_mask, combine_masks
log: raised MemoryError
"""
hoard = []
while True:
    hoard.append(bytearray(64 << 20))
