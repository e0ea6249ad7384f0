"""Display HTML nested 200 000 tags deep: the sanitiser (nh3) takes time quadratic in the depth (minutes for
this), so the feedback page is made within its bound: plain text, with the verdicts, and the log says why.

target: causal_mask
full: causal_mask, padding_mask, combine_masks, mask_to_bias
log: making its page took longer than the 20 s limit: its feedback page is plain text
"""
from IPython.display import HTML, display

display(HTML("<div>" * 200_000 + "deep"))


def causal_mask(T):
    return np.tril(np.ones((T, T), dtype=bool))
