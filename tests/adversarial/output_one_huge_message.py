"""Send one 200 MB message straight through the kernel's IOPub socket: the grader's socket refuses the frame.

The grader never allocates it: libzmq closes the connection on reading its length (ZMQ_MAXMSGSIZE); the grader
opens it again and the later cells' output arrives.
target: causal_mask
full: causal_mask, padding_mask, combine_masks, mask_to_bias
log: output limit of a cell in one message
"""


def causal_mask(T):
    return np.arange(T)[None, :] <= np.arange(T)[:, None]


kernel = get_ipython().kernel
kernel.session.send(kernel.iopub_socket, "display_data", {"data": {"text/plain": "."}, "metadata": {}},
                    parent=kernel.get_parent(), ident=b"display_data", buffers=[b"x" * (200 << 20)])
