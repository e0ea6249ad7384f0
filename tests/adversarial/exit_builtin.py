"""Call IPython's exit() / quit() in a cell, which asks the kernel to shut down.

target: padding_mask
zero: padding_mask
full: causal_mask
log: padding_mask: failed
"""
exit()
quit()
