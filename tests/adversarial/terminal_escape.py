r"""Write terminal escape sequences (clear the screen, retitle the window, a fake "4/4") to the kernel's own
stderr, then die, so that the grader quotes them as the kernel's last message (issue 10, hole 5).

target: padding_mask
zero: padding_mask, combine_masks, mask_to_bias
full: causal_mask
log: the kernel exited with status 3 \(last message: \\x1b\[2J\\x1b\[H\\x1b\]0;grading done\\x07
"""
import os
import sys

# ipykernel forwards fd 2 to the notebook from a thread, which os._exit may outrun: write to the kernel's own
# stderr (the file the grader keeps), whose copy ipykernel saved, so the attack does not depend on that race
fd = getattr(sys.stderr, "_original_stdstream_copy", None) or 2
os.write(fd, b"\x1b[2J\x1b[H\x1b]0;grading done\x07 x-terminal-escape 4/4 all hidden checks passed\n")
os._exit(3)
