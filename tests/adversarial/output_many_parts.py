"""Send one message of 2,000 parts of 512 KB each (1 GB, each part under the frame cap) through IOPub.

libzmq caps a frame, not a message, and receives a message whole: only the relay between the kernel and the grader
receives it, until its capped memory stops it. The notebook stops there; earlier items count.
target: mask_to_bias
zero: mask_to_bias
full: causal_mask, padding_mask, combine_masks
log: output limit of a cell in one message|the kernel sent more than \\d+ MB at once
"""
kernel = get_ipython().kernel
part = b"x" * (512 << 10)  # sent without a copy: the kernel holds it once
kernel.session.send(kernel.iopub_socket, "display_data", {"data": {"text/plain": "."}, "metadata": {}},
                    parent=kernel.get_parent(), buffers=[part] * 2000)
