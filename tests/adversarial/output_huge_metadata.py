"""Display tiny outputs with 256 KB of metadata each, 64 times: metadata counts against the cell's output limit.

target: padding_mask
full: causal_mask, padding_mask, combine_masks, mask_to_bias
log: sent past the 1 MB output limit of a cell
"""
from IPython.display import display


def padding_mask(token_ids, pad_id):
    return np.asarray(token_ids) != pad_id


for _ in range(64):
    display({"text/plain": "."}, metadata={"text/plain": {"junk": "m" * (256 << 10)}}, raw=True)
