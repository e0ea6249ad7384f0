"""Slow every later cell to just under the cell timeout (a pre_run_cell hook): only the deadline stops it.

target: causal_mask
zero: causal_mask, mask_to_bias
log: ran past its [0-9.]+ s deadline
log: mask_to_bias: failed: timed out: the notebook ran past its [0-9.]+ s time limit
"""
import time

get_ipython().events.register("pre_run_cell", lambda *args: time.sleep(5))


def causal_mask(T):
    return np.zeros((T, T), dtype=bool)  # wrong
