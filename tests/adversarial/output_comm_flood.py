"""Send 400 widget-state updates on one comm, with 4 KB binary buffers: comm messages count too.

target: mask_to_bias
full: causal_mask, padding_mask, combine_masks, mask_to_bias
log: sent past the 1 MB output limit of a cell
"""
from comm import create_comm


def mask_to_bias(allowed, dtype=np.float32):
    return np.where(allowed, 0, np.finfo(dtype).min).astype(dtype)


widget = create_comm(target_name="jupyter.widget", data={"state": {"_model_name": "X", "_model_module": "x"},
                                                         "buffer_paths": []})
for i in range(400):
    widget.send({"method": "update", "state": {"value": i}, "buffer_paths": [["data"]]}, buffers=[b"b" * 4096])
