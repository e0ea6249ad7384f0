"""Put 64 MB in the cell's reply (an execute_reply payload, on the shell channel): the grader refuses the frame.

The reply is lost with its connection: the notebook stops at this cell, with a message; earlier items count.
target: mask_to_bias
zero: mask_to_bias
full: causal_mask, padding_mask, combine_masks
log: output limit of a cell on its shell channel
"""
get_ipython().payload_manager.write_payload({"source": "page", "data": {"text/plain": "p" * (64 << 20)},
                                            "start": 0})
