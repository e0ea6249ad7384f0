"""Write one file far past the file-size limit: the write fails (EFBIG), the kernel lives on.

target: mask_to_bias
zero: mask_to_bias
full: causal_mask, padding_mask, combine_masks
log: raised OSError: .Errno 27. File too large
"""
with open("huge.bin", "wb") as handle:
    for _ in range(1024):
        handle.write(b"\0" * (1 << 20))
