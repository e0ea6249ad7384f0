"""Slow every later cell to just under the cell timeout (a pre_run_cell hook): only the deadline stops it.

How far the notebook gets depends on the deadline, which is stretched by the machine's measured slowdown: an item
reached before it is judged on its answer (mask_to_bias here is right), one not reached says "timed out". On a
machine busy enough (a stretch past about 4×) every cell runs within the stretched deadline: then the notebook
ends on its own, which is as right (the deadline's own test is test_kill_ends_every_process_..._deadline_holds).
target: causal_mask
zero: causal_mask
log: ran past its [0-9.]+ s deadline|mask_to_bias: passed
log: mask_to_bias: (passed|failed: timed out: the notebook ran past its [0-9.]+ s time limit)
"""
import time

get_ipython().events.register("pre_run_cell", lambda *args: time.sleep(5))


def causal_mask(T):
    return np.zeros((T, T), dtype=bool)  # wrong
