"""Display outputs whose transient field (never saved by Jupyter) carries 800 KB each: it counts as well.

target: padding_mask
full: causal_mask, padding_mask, combine_masks, mask_to_bias
log: sent past the 1 MB output limit of a cell
"""
from IPython.display import publish_display_data


def padding_mask(token_ids, pad_id):
    return np.asarray(token_ids) != pad_id


for _ in range(16):
    publish_display_data({"text/plain": "."}, transient={"display_id": "t", "junk": "t" * (800 << 10)})
