"""While its own cell is collected, plant a link to the grader's secret and a FIFO (it blocks a reader) where
the harvest writes causal_mask's outputs.

The harvest writes its files under temporary names and renames them into place: the planted ones are replaced,
never followed nor opened, and the correct answer keeps its mark. (Were they left, the grader would refuse them:
tests/test_harvest_fork.py.)
target: causal_mask
full: causal_mask, padding_mask, combine_masks, mask_to_bias
log: causal_mask: passed
"""
import os


def causal_mask(T):
    folder = os.path.join(os.environ.get("DECODER_COURSE_HARVEST", "/tmp"), "outputs")
    for name, plant in [("causal_mask.npz", lambda p: os.symlink("/work/main/.grading/secret", p)),
                        ("causal_mask.json", os.mkfifo)]:
        path = os.path.join(folder, name)
        if not os.path.lexists(path):
            try:
                plant(path)
            except OSError as exc:
                print("could not plant", name, exc)
    return np.tril(np.ones((T, T), dtype=bool))  # a correct answer, handed in through tampered files
