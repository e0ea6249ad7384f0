"""Fill the harvest outputs (a file system of their own, capped by the kernel) with many 8 MB files.

target: mask_to_bias
zero: mask_to_bias
full: causal_mask, padding_mask, combine_masks
log: filled the harvest outputs
"""
import os
import time

folder = os.path.join(os.environ.get("DECODER_COURSE_HARVEST", "."), "outputs")
chunk = b"\0" * (8 << 20)
for i in range(1000):
    with open(os.path.join(folder, f"junk{i}.bin"), "wb") as handle:
        handle.write(chunk)
time.sleep(60)
