"""Fill the disk from the working folder, /tmp and /dev/shm until writing fails.

target: mask_to_bias
zero: mask_to_bias
full: causal_mask, padding_mask, combine_masks
log: raised OSError
"""
import os

chunk = b"\0" * (1 << 20)
for folder in ("/dev/shm", "/tmp", os.getcwd()):
    with open(os.path.join(folder, "fill.bin"), "wb") as handle:
        try:
            while True:
                handle.write(chunk)
                handle.flush()
        except OSError as exc:
            print(folder, "full after", handle.tell() >> 20, "MB:", exc.strerror)
raise OSError("the disk is full")
