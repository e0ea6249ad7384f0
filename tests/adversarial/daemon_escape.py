"""Double-fork a daemon in a new session that outlives the notebook and keeps writing.

target: padding_mask
zero: padding_mask
full: causal_mask, combine_masks, mask_to_bias
log: other processes were still running
"""
import os
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:
            try:
                with open(os.path.join(os.environ.get("DECODER_COURSE_HARVEST", "/tmp"), "outputs", "daemon"),
                          "a") as handle:
                    handle.write("still here\n")
            except OSError:
                pass
            time.sleep(0.2)
    os._exit(0)
time.sleep(0.5)
