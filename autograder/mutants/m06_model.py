"""Wrong answers to lesson 06-model.

Each is the reference with a line or a few changed (:func:`autograder.mutants.patched`), run where a student's
notebook has ``math``, ``torch``, ``nn``, ``sinusoidal_table``, ``PositionalEncoding``, ``MultiHeadAttention``,
``FeedForward``, ``EncoderLayer``, ``Encoder``, ``Decoder`` and ``DecoderLayer``.

The order of the items (table, Decoder, model, PositionalEncoding, EncoderLayer) decides which items the demo's
"typical mistakes" student gets wrong (every other item): the table, the model and the encoder layer (the model,
built on the student's encoder layer, is judged relative to it).
"""

from autograder.mutants import patched, shown_bug

LESSON = "06-model"
MUTANTS: list = []


# -- sinusoidal_table ----------------------------------------------------------------------------------------
_EVEN = "    table[:, 0::2] = torch.sin(angle)"
_ODD = "    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])"

patched(MUTANTS, LESSON, "sinusoidal_table", "cosines on the even features, sines on the odd ones",
        (_EVEN, "    table[:, 0::2] = torch.cos(angle)"), (_ODD, "    table[:, 1::2] = torch.sin(angle)"))

patched(MUTANTS, LESSON, "sinusoidal_table", "one frequency per feature (10000^(j/D)), not one per pair",
        ("    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32)"
         " * (-math.log(10000.0) / d_model))\n",
         "    inv_freq = 1.0 / 10000 ** (torch.arange(d_model, dtype=torch.float32) / d_model)\n"),
        (_EVEN, "    table[:, 0::2] = torch.sin(angle[:, 0::2])"),
        (_ODD, "    table[:, 1::2] = torch.cos(angle[:, 1::2])"))

patched(MUTANTS, LESSON, "sinusoidal_table", "all sines, then all cosines, instead of interleaved pairs",
        ("    table = torch.zeros(max_len, d_model)\n" + _EVEN + "  # even features\n" + _ODD
         + "  # odd features (one fewer when D is odd)\n    return table  # (max_len, D)",
         "    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)"))

patched(MUTANTS, LESSON, "sinusoidal_table",
        "cosines of every angle: fails for an odd D (one cosine fewer than sines)",
        (_ODD, "    table[:, 1::2] = torch.cos(angle)"))

patched(MUTANTS, LESSON, "sinusoidal_table", "positions counted from 1: the first row is position 0",
        ("torch.arange(max_len, dtype=torch.float32)", "torch.arange(1, max_len + 1, dtype=torch.float32)"))


# -- Decoder -------------------------------------------------------------------------------------------------
_CALL = "            x = layer(x, memory, self_allowed, cross_allowed)"

patched(MUTANTS, LESSON, "Decoder", "no final LayerNorm after a pre-LN stack",
        ("        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()",
         "        self.norm = nn.Identity()"))

patched(MUTANTS, LESSON, "Decoder", "one layer object repeated n_layers times: the layers share their weights",
        ("        self.layers = nn.ModuleList(\n"
         "            [DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=norm_first) for _ in range(n_layers)]\n"
         "        )\n",
         "        layer = DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=norm_first)\n"
         "        self.layers = nn.ModuleList([layer] * n_layers)\n"))

patched(MUTANTS, LESSON, "Decoder", "dropout not passed to the layers: they are built with p = 0",
        ("[DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=norm_first) for _ in range(n_layers)]",
         "[DecoderLayer(d_model, n_heads, d_ff, 0.0, norm_first=norm_first) for _ in range(n_layers)]"))

patched(MUTANTS, LESSON, "Decoder", "cross_allowed not passed to the layers: memory padding leaks",
        (_CALL, "            x = layer(x, memory, self_allowed)"))

patched(MUTANTS, LESSON, "Decoder", "every layer reads the stack's input x instead of the previous layer's output",
        ("        for layer in self.layers:\n", "        out = x\n        for layer in self.layers:\n"),
        (_CALL, "            out = layer(x, memory, self_allowed, cross_allowed)"),
        ("        return self.norm(x)", "        return self.norm(out)"))


# -- Seq2SeqTransformer --------------------------------------------------------------------------------------
_SCALE = "        self.embed_scale = math.sqrt(d_model) if scale_embedding else 1.0"

patched(MUTANTS, LESSON, "Seq2SeqTransformer", "no causal mask in decode: only target padding is masked",
        ("        self_allowed = causal[None, None]", "        self_allowed = None"),
        ("            self_allowed = self_allowed & tgt_is_real.bool()[:, None, None, :]",
         "            self_allowed = tgt_is_real.bool()[:, None, None, :]"))

patched(MUTANTS, LESSON, "Seq2SeqTransformer", "source padding only given to the encoder, not to cross-attention",
        ("        y = self.decoder(y, memory, self_allowed, cross_allowed)",
         "        y = self.decoder(y, memory, self_allowed)"))

patched(MUTANTS, LESSON, "Seq2SeqTransformer", "weights tied by copying the values once: two separate tensors",
        ("            self.out_proj.weight = self.tgt_embed.weight",
         "            with torch.no_grad():\n                self.out_proj.weight.copy_(self.tgt_embed.weight)"))

patched(MUTANTS, LESSON, "Seq2SeqTransformer", "embeddings always multiplied by sqrt(D), as in the paper",
        (_SCALE, "        self.embed_scale = math.sqrt(d_model)"))

patched(MUTANTS, LESSON, "Seq2SeqTransformer", "scale_embedding ignored: embeddings never multiplied by sqrt(D)",
        (_SCALE, "        self.embed_scale = 1.0"))


# -- PositionalEncoding --------------------------------------------------------------------------------------
_BUFFER = '        self.register_buffer("pe", sinusoidal_table(max_len, d_model))'
_ADD = "        return self.dropout(x + self.pe[:T])"

patched(MUTANTS, LESSON, "PositionalEncoding", "rows picked by the batch size (x.shape[0]), not by T (x.shape[1])",
        (_ADD, "        return self.dropout(x + self.pe[: x.shape[0]])"))

patched(MUTANTS, LESSON, "PositionalEncoding", "the table is an nn.Parameter: it would be trained",
        (_BUFFER, "        self.pe = nn.Parameter(sinusoidal_table(max_len, d_model))"))

patched(MUTANTS, LESSON, "PositionalEncoding", "dropout on the embeddings before the table is added",
        (_ADD, "        return self.dropout(x) + self.pe[:T]"))

patched(MUTANTS, LESSON, "PositionalEncoding", "the table is a plain attribute, not a buffer",
        (_BUFFER, "        self.pe = sinusoidal_table(max_len, d_model)"))


# -- EncoderLayer --------------------------------------------------------------------------------------------
_KEYS = "        allowed = None if src_is_real is None else src_is_real.bool()[:, None, None, :]"

patched(MUTANTS, LESSON, "EncoderLayer", "the padding mask on the query axis (B, 1, S, 1), not on the keys",
        (_KEYS, "        allowed = None if src_is_real is None else src_is_real.bool()[:, None, :, None]"))

patched(MUTANTS, LESSON, "EncoderLayer", "a causal mask in the encoder, as in the decoder's self-attention",
        (_KEYS, "        S = x.shape[1]\n"
                "        allowed = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()\n"
                "        if src_is_real is not None:\n"
                "            allowed = allowed & src_is_real[:, None, None, :]"))

patched(MUTANTS, LESSON, "EncoderLayer", "norm_first ignored: always post-LN",
        ("        self.norm_first = norm_first", "        self.norm_first = False  # the argument is never read"))

patched(MUTANTS, LESSON, "EncoderLayer", "the dropout argument ignored: every dropout of the layer has p = 0",
        ("MultiHeadAttention(d_model, n_heads, dropout)", "MultiHeadAttention(d_model, n_heads, 0.0)"),
        ("FeedForward(d_model, d_ff, dropout)", "FeedForward(d_model, d_ff, 0.0)"),
        ("        self.dropout1 = nn.Dropout(dropout)\n        self.dropout2 = nn.Dropout(dropout)",
         "        self.dropout1 = nn.Dropout(0.0)\n        self.dropout2 = nn.Dropout(0.0)"))


# -- logits_from_ids (find the bug) ---------------------------------------------------------------------------
_DECODE = "    return model.decode(tgt_ids, memory, src_is_real, tgt_is_real)"  # the fixed line of the reference

shown_bug(MUTANTS, LESSON, "logits_from_ids",
          "decode given no source padding: the cross-attention reads the padded memory positions")

patched(MUTANTS, LESSON, "logits_from_ids",
        "a wrong fix: the source padding handed to decode and taken from encode: the encoder reads the pads",
        ("    memory = model.encode(src_ids, src_is_real)", "    memory = model.encode(src_ids)"))

patched(MUTANTS, LESSON, "logits_from_ids",
        "a wrong fix: decode given the source padding positionally, the target padding dropped",
        (_DECODE, "    return model.decode(tgt_ids, memory, src_is_real)"))

patched(MUTANTS, LESSON, "logits_from_ids",
        "a wrong fix: the two masks passed in the wrong order, decode(tgt_ids, memory, tgt_is_real, src_is_real)",
        (_DECODE, "    return model.decode(tgt_ids, memory, tgt_is_real, src_is_real)"))
