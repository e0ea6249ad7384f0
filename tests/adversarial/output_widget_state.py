"""Open 40 widget comms whose state holds 512 KB each: nbclient would keep every widget's state.

target: combine_masks
full: causal_mask, padding_mask, combine_masks, mask_to_bias
log: sent past the 1 MB output limit of a cell
"""
from comm import create_comm


def combine_masks(causal, key_is_real):
    return causal[None, None] & key_is_real[:, None, None, :]


widgets = [create_comm(target_name="jupyter.widget",
                       data={"state": {"_model_name": "X", "_model_module": "x", "value": "w" * (512 << 10)},
                             "buffer_paths": []}) for _ in range(40)]
