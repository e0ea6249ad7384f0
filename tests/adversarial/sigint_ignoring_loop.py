"""Ignore SIGINT, then loop forever: the interrupt after the cell timeout cannot stop it.

nbgrader lost the whole notebook; here the items collected before it keep their marks.
target: mask_to_bias
zero: mask_to_bias
full: causal_mask, padding_mask, combine_masks
log: did not stop within [0-9]+ s of being interrupted
"""
import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    pass
