"""Wrong answers to lesson 05-decoder-layer.

Each is the reference with a line or a few changed (:func:`autograder.mutants.patched`), run where a student's
notebook has ``torch``, ``nn``, ``np``, ``MultiHeadAttention``, ``CrossAttention``, ``FeedForward``, ``split_heads``,
``merge_heads`` and ``scaled_dot_product_attention``.
"""

from autograder.mutants import patched, shown_bug

LESSON = "05-decoder-layer"
MUTANTS: list = []


# -- FeedForward ---------------------------------------------------------------------------------------------
_HIDDEN = "        hidden = torch.relu(self.linear1(x))"

patched(MUTANTS, LESSON, "FeedForward", "no ReLU: two linear maps collapse into one",
        (_HIDDEN, "        hidden = self.linear1(x)"))

patched(MUTANTS, LESSON, "FeedForward", "GELU instead of the ReLU of the paper and of PyTorch",
        (_HIDDEN, "        hidden = torch.nn.functional.gelu(self.linear1(x))"))

patched(MUTANTS, LESSON, "FeedForward", "dropout on the output instead of the hidden layer",
        ("        return self.linear2(self.dropout(hidden))", "        return self.dropout(self.linear2(hidden))"))


# -- DecoderLayer --------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "DecoderLayer", "norm_first ignored: always post-LN",
        ("        self.norm_first = norm_first", "        self.norm_first = False  # the argument is never read"))

patched(MUTANTS, LESSON, "DecoderLayer", "pre-LN adds the sublayer to the normalised x, not to the raw x",
        ("            x = x + self._sa_block(self.norm1(x), self_allowed)\n",
         "            h = self.norm1(x)\n            x = h + self._sa_block(h, self_allowed)\n"),
        ("                x = x + self._ca_block(self.norm2(x), memory, cross_allowed)\n",
         "                h = self.norm2(x)\n                x = h + self._ca_block(h, memory, cross_allowed)\n"),
        ("            x = x + self._ff_block(self.norm3(x))\n",
         "            h = self.norm3(x)\n            x = h + self._ff_block(h)\n"))

patched(MUTANTS, LESSON, "DecoderLayer", "cross_allowed never passed: memory padding leaks",
        ("        out, _ = self.cross_attn(x, memory, allowed=allowed)", "        out, _ = self.cross_attn(x, memory)"))

patched(MUTANTS, LESSON, "DecoderLayer", "the sublayers passed in are ignored: always builds its own",
        ("self.self_attn = self_attn if self_attn is not None else MultiHeadAttention(",
         "self.self_attn = MultiHeadAttention("),
        ("self.cross_attn = cross_attn if cross_attn is not None else CrossAttention(",
         "self.cross_attn = CrossAttention("),
        ("self.feed_forward = feed_forward if feed_forward is not None else FeedForward(",
         "self.feed_forward = FeedForward("))

patched(MUTANTS, LESSON, "DecoderLayer", "dropout1..3 built but never applied: no dropout on the sublayers' outputs",
        ("        return self.dropout1(out)", "        return out"),
        ("        return self.dropout2(out)", "        return out"),
        ("        return self.dropout3(self.feed_forward(x))", "        return self.feed_forward(x)"))

patched(MUTANTS, LESSON, "DecoderLayer", "cross_attn=False still builds norm2: a decoder-only layer has a stray norm",
        ("        self.norm2 = nn.LayerNorm(d_model) if cross else None", "        self.norm2 = nn.LayerNorm(d_model)"))

patched(MUTANTS, LESSON, "DecoderLayer", "decoder-only forward normalises the feed-forward's input with norm1 again",
        ("            x = x + self._ff_block(self.norm3(x))\n",
         "            x = x + self._ff_block((self.norm3 if cross else self.norm1)(x))\n"))


# -- init_numpy_decoder_params -------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "init_numpy_decoder_params", "standard normal weights, not scaled by 1/sqrt(fan_in)",
        ("rng.normal(0.0, 1.0 / np.sqrt(n_in), size=(n_in, n_out))", "rng.standard_normal((n_in, n_out))"))

patched(MUTANTS, LESSON, "init_numpy_decoder_params", "ff_W2 stored (D, F), the (out, in) layout of nn.Linear",
        ('params["ff_W2"], params["ff_b2"] = dense(F, D)',
         'params["ff_W2"], params["ff_b2"] = rng.normal(0.0, 1.0 / np.sqrt(F), size=(D, F)), np.zeros(D)'))

patched(MUTANTS, LESSON, "init_numpy_decoder_params", "rng=None falls back to a fixed seed: every run is the same",
        ("np.random.default_rng() if rng is None", "np.random.default_rng(0) if rng is None"))

patched(MUTANTS, LESSON, "init_numpy_decoder_params", "LayerNorm gains start at zero: every output starts at 0",
        ('params[f"ln{i}_g"], params[f"ln{i}_b"] = np.ones(D), np.zeros(D)',
         'params[f"ln{i}_g"], params[f"ln{i}_b"] = np.zeros(D), np.zeros(D)'))


# -- numpy_decoder_layer -------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "numpy_decoder_layer", "W2 @ h instead of h @ W2 in the feed-forward",
        ('np.maximum(h @ p["ff_W1"] + p["ff_b1"], 0.0)', 'np.maximum(p["ff_W1"] @ h + p["ff_b1"], 0.0)'),
        ('return hidden @ p["ff_W2"] + p["ff_b2"]', 'return p["ff_W2"] @ hidden + p["ff_b2"]'))

patched(MUTANTS, LESSON, "numpy_decoder_layer", "LayerNorm statistics over the time axis, not over D",
        ("mean = h.mean(axis=-1, keepdims=True)", "mean = h.mean(axis=1, keepdims=True)"),
        ("var = h.var(axis=-1, keepdims=True)", "var = h.var(axis=1, keepdims=True)"))

patched(MUTANTS, LESSON, "numpy_decoder_layer", "cross-attention's keys and values taken from x, not the memory",
        ('        x = x + multi_head(layer_norm(x, 2), memory, "ca", cross_allowed)\n',
         '        h = layer_norm(x, 2)\n        x = x + multi_head(h, h, "ca", None)\n'),
        ('x = layer_norm(x + multi_head(x, memory, "ca", cross_allowed), 2)',
         'x = layer_norm(x + multi_head(x, x, "ca", None), 2)'))

patched(MUTANTS, LESSON, "numpy_decoder_layer", "no residual around the feed-forward",
        ("x = x + feed_forward(layer_norm(x, 3))", "x = feed_forward(layer_norm(x, 3))"),
        ("x = layer_norm(x + feed_forward(x), 3)", "x = layer_norm(feed_forward(x), 3)"))


# -- run_with_torch_masks (find the bug) ----------------------------------------------------------------------
_JOINED = "        blocked = blocked | tgt_key_padding_mask[:, None, None, :]"  # the fixed line of the reference

shown_bug(MUTANTS, LESSON, "run_with_torch_masks",
          "tgt_mask and the target padding joined with &, in PyTorch's polarity: the future and the padding leak")

patched(MUTANTS, LESSON, "run_with_torch_masks",
        "a wrong fix: | with the padding on the query axis: real queries read padded keys",
        (_JOINED, "        blocked = blocked | tgt_key_padding_mask[:, None, :, None]"))

patched(MUTANTS, LESSON, "run_with_torch_masks",
        "a wrong fix: | with the padding inverted first, as if it were is_real: real keys blocked, pads read",
        (_JOINED, "        blocked = blocked | ~tgt_key_padding_mask[:, None, None, :]"))

patched(MUTANTS, LESSON, "run_with_torch_masks",
        "a wrong fix: the padding replaces tgt_mask instead of joining it: the future leaks",
        (_JOINED, "        blocked = tgt_key_padding_mask[:, None, None, :]"))
