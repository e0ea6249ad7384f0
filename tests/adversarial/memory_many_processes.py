"""Memory in many processes, each in a session of its own and far under its address-space limit: 2.5 GB together.

target: combine_masks
zero: combine_masks, mask_to_bias
full: causal_mask, padding_mask
log: reached the sandbox's memory limit
log: combine_masks: failed: stopped: your notebook's processes together used more than
"""
import os
import time

for _ in range(16):
    if os.fork() == 0:
        os.setsid()
        hoard = bytearray(160 << 20)
        time.sleep(600)
        os._exit(0)
time.sleep(60)
