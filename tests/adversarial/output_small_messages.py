"""Send 500 small (4 KB) displays as fast as the kernel can: each message counts; the flood costs only its cell.

target: mask_to_bias
full: causal_mask, padding_mask, combine_masks, mask_to_bias
log: sent past the 1 MB output limit of a cell
"""
from IPython.display import display


def mask_to_bias(allowed, dtype=np.float32):
    return np.where(allowed, 0, np.finfo(dtype).min).astype(dtype)


for _ in range(500):
    display({"text/plain": "s" * 4000}, raw=True)
