"""Leave sparse files whose sizes add up to three times the harvest outputs' cap, holding almost nothing.

A grader that summed file sizes would stop this notebook; a cap kept by the file system counts what the files
hold: the correct answer keeps its mark.
target: causal_mask
full: causal_mask, padding_mask, combine_masks, mask_to_bias
log: causal_mask: passed
"""
import os

folder = os.path.join(os.environ.get("DECODER_COURSE_HARVEST", "."), "outputs")
for place in (folder, "/tmp"):
    for i in range(10):
        with open(os.path.join(place, f"sparse{i}"), "wb") as handle:
            handle.truncate(15 << 20)


def causal_mask(T):
    return np.tril(np.ones((T, T), dtype=bool))
