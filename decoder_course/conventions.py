"""The course's conventions as code: dimension letters, mask polarity, special token ids."""

# Dimension letters used in every shape comment and docstring of the course.
DIMENSIONS: dict[str, str] = {
    "B": "batch size",
    "T": "target (query) length",
    "S": "source (key) length",
    "H": "number of attention heads",
    "D": "model width (d_model)",
    "Dh": "head width, D // H",
    "F": "feed-forward width (d_ff)",
    "V": "vocabulary size",
}

# Mask polarity: True means "this query may attend to this key" (as in F.scaled_dot_product_attention).
MASK_ALLOWED = True

# Special token ids shared by every toy vocabulary of the course.
PAD = 0  # padding: ignored by attention (is_real is False there) and by the loss
BOS = 1  # beginning of sequence: the decoder's first input token
EOS = 2  # end of sequence: generation stops once a sequence emits it
SPECIAL_TOKENS: dict[str, int] = {"PAD": PAD, "BOS": BOS, "EOS": EOS}
