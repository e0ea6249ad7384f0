"""Show 200 displays with one id, then update it 300 times: each update is written to all 200 outputs.

target: causal_mask
full: causal_mask, padding_mask, combine_masks, mask_to_bias
log: sent past the 1 MB output limit of a cell
"""
from IPython.display import display, update_display


def causal_mask(T):
    return np.arange(T)[None, :] <= np.arange(T)[:, None]


for _ in range(200):
    display({"text/plain": "."}, raw=True, display_id="same")
for _ in range(300):
    update_display({"text/plain": "u" * (16 << 10)}, raw=True, display_id="same")
