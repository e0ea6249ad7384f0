"""Return huge arrays (16 MB a case) from the graded function, to fill the grader's disk and memory.

The lesson's next cell plots causal_mask(6), which takes past the cell limit with such an array: later items are
lost too, but only this student's.
target: causal_mask
zero: causal_mask
log: causal_mask: failed: your code raised
"""


def causal_mask(T):
    depth = (16 << 20) // (T * T) + 1
    return np.ones((T, T, depth), dtype=bool)
