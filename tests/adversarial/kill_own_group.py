"""Kill the kernel's process group (`kill 0`, as a shell script would), then the kernel itself, with SIGKILL.

target: padding_mask
zero: padding_mask, combine_masks, mask_to_bias
full: causal_mask
log: the kernel was killed by SIGKILL
"""
import os
import signal

for kill in (lambda: os.killpg(os.getpgid(0), signal.SIGKILL), lambda: os.kill(0, signal.SIGKILL)):
    try:
        kill()
    except OSError as exc:
        print("group kill:", exc)
os.kill(os.getpid(), signal.SIGKILL)
