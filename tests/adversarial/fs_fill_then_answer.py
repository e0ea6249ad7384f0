"""Fill $HOME, /tmp and /dev/shm to their cap, in bytes and in files, then answer correctly.

The student's own space is a file system of its own (autograder/sandbox/launch.py: capped tmpfs): filling it stops the
student's writes with ENOSPC, and nothing of grading, which hands answers in through another one.
target: causal_mask
full: causal_mask, padding_mask, combine_masks, mask_to_bias
log: filled /home/student, /tmp and /dev/shm
"""
import os

for place in ("/home/student", "/tmp", "/dev/shm"):
    try:
        with open(os.path.join(place, "fill.bin"), "wb") as handle:
            while True:
                handle.write(b"\0" * (1 << 20))
                handle.flush()
    except OSError:
        pass
try:
    for i in range(10**6):
        open(f"/tmp/empty{i}", "w").close()
except OSError:
    pass


def causal_mask(T):
    return np.tril(np.ones((T, T), dtype=bool))
