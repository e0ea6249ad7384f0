"""Reference for lesson 06-model (PyTorch): positional encoding, the decoder stack, a full encoder-decoder.

The model follows "Attention Is All You Need" with two marked departures:

- pre-LN by default (``norm_first=True``): each sublayer normalises its input, and each stack ends with a
  final LayerNorm, which trains deep stacks more stably than the paper's post-LN;
- embeddings are *not* multiplied by sqrt(D) by default. The paper does it with embeddings initialised small;
  with PyTorch's default N(0, 1) ``nn.Embedding`` init it makes token vectors ~sqrt(D) times larger than the
  sinusoids (at most 1), drowning the position signal (lesson 07 measures the slowdown).
  ``scale_embedding=True`` restores the paper's scaling.

Masks follow the course: boolean, True = "this query may attend to this key". The encoder is a stack of our
own ``EncoderLayer`` (lesson 03's ``MultiHeadAttention`` and lesson 05's ``FeedForward``), equal to PyTorch's
``nn.TransformerEncoderLayer`` with copied weights; no part of the model is PyTorch's.

``logits_from_ids`` is a find-the-bug exercise (autograder.course.bugs): given code that makes the padding masks from
the token ids and calls the student's ``encode`` and ``decode``, with one mistake in what it hands ``decode``.
"""

import math

import torch
from torch import nn

from autograder.course.reference.decoder_layer import DecoderLayer, FeedForward
from autograder.course.reference.multi_head import MultiHeadAttention, load_from_torch_mha


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """The paper's sinusoidal table: PE[pos, 2i] = sin(pos / 10000^(2i/D)), PE[pos, 2i+1] = cos(same).

    Any width D, odd ones included: an odd D has one sine more than cosines (the last pair has no cosine).

    Shape:
        returns (max_len, D) float32
    """
    ### BEGIN SOLUTION
    position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (max_len, 1)
    # 1 / 10000^(2i/D) for each pair of features, via exp/log to stay accurate
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    angle = position * inv_freq  # (max_len, ceil(D/2)): one wavelength per feature pair
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(angle)  # even features
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])  # odd features (one fewer when D is odd)
    return table  # (max_len, D)
    ### END SOLUTION


class PositionalEncoding(nn.Module):
    """Add the sinusoidal position table to a sequence of embeddings, then apply dropout.

    Dropout acts on the sum ``x + pe[:T]``, in training mode only; the caller's ``x`` is unchanged.

    The table is a buffer ``pe`` (max_len, D): saved and moved by ``.to(device)`` with the model, not trained.

    Shape:
        x: (B, T, D) with T <= max_len -> (B, T, D)
    """

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0):
        super().__init__()
        ### BEGIN SOLUTION
        self.register_buffer("pe", sinusoidal_table(max_len, d_model))  # (max_len, D)
        self.dropout = nn.Dropout(dropout)
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Add the encodings of positions 0 .. T-1.

        Shape:
            x: (B, T, D) -> (B, T, D)
        """
        ### BEGIN SOLUTION
        T = x.shape[1]
        if T > self.pe.shape[0]:
            raise ValueError(f"sequence length {T} exceeds max_len={self.pe.shape[0]}")
        return self.dropout(x + self.pe[:T])  # (B, T, D); pe[:T] (T, D) broadcasts over the batch
        ### END SOLUTION


class EncoderLayer(nn.Module):
    """An encoder layer: self-attention over the source, then a feed-forward; each with residual + LayerNorm.

    A decoder layer without cross-attention and without a causal mask: every source position may read every
    *real* source position (``src_is_real`` masks padding keys, on the key axis only). Submodules, by the
    contract's names: ``self_attn`` (``MultiHeadAttention``), ``feed_forward`` (``FeedForward``), ``norm1``,
    ``norm2`` (``nn.LayerNorm(D)``) and ``dropout1``, ``dropout2``, numbered in the order the sublayers run.
    ``norm_first=False`` is the paper's post-LN (normalise the residual sum), ``True`` pre-LN (normalise each
    sublayer's input). With copied weights it equals ``nn.TransformerEncoderLayer(batch_first=True,
    norm_first=...)`` in eval mode, whose ``src_key_padding_mask`` is ``~src_is_real``. The input is unchanged.
    Built from your modules: ``nn.TransformerEncoderLayer`` and ``nn.TransformerEncoder`` are not to be used (the
    checks refuse them).

    Shape:
        x: (B, S, D), src_is_real: (B, S) bool or None -> (B, S, D)
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.1, norm_first: bool = False):
        super().__init__()
        ### BEGIN SOLUTION
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)  # queries, keys, values: the source
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        # one LayerNorm and one dropout per sublayer, numbered in the order the sublayers run
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        ### END SOLUTION

    def forward(self, x: torch.Tensor, src_is_real: torch.Tensor | None = None) -> torch.Tensor:
        """Self-attention (padding keys masked), then feed-forward, each with its residual and LayerNorm.

        Shape:
            x: (B, S, D), src_is_real: (B, S) bool or None -> (B, S, D)
        """
        ### BEGIN SOLUTION
        # padding is a property of the keys: (B, 1, 1, S) broadcasts over heads and queries; no causal mask
        allowed = None if src_is_real is None else src_is_real.bool()[:, None, None, :]  # (B, 1, 1, S)

        def sa_block(h):
            out, _ = self.self_attn(h, h, h, allowed=allowed)  # (B, S, D)
            return self.dropout1(out)

        if self.norm_first:
            # pre-LN (not the paper's): normalise the sublayer's input, add its output to the raw stream
            x = x + sa_block(self.norm1(x))
            x = x + self.dropout2(self.feed_forward(self.norm2(x)))
        else:
            # post-LN (the paper): add the sublayer's output to its input, then normalise the sum
            x = self.norm1(x + sa_block(x))
            x = self.norm2(x + self.dropout2(self.feed_forward(x)))
        return x  # (B, S, D)
        ### END SOLUTION


def load_from_torch_encoder_layer(ours: EncoderLayer, torch_layer: nn.TransformerEncoderLayer) -> EncoderLayer:
    """Copy an ``nn.TransformerEncoderLayer``'s weights into our ``EncoderLayer``.

    Shape:
        parameters only; ours must have the same d_model, n_heads and d_ff
    """
    load_from_torch_mha(ours.self_attn, torch_layer.self_attn)
    pairs = [
        (ours.feed_forward.linear1, torch_layer.linear1),
        (ours.feed_forward.linear2, torch_layer.linear2),
        (ours.norm1, torch_layer.norm1),
        (ours.norm2, torch_layer.norm2),
    ]
    with torch.no_grad():
        for mine, theirs in pairs:
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)
    return ours


class Encoder(nn.Module):
    """A stack of ``EncoderLayer`` s, with a final LayerNorm when pre-LN (given: it is built like ``Decoder``).

    Shape:
        x: (B, S, D), is_real: (B, S) bool or None -> (B, S, D)
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        n_layers: int,
        dropout: float = 0.1,
        norm_first: bool = True,
    ):
        super().__init__()
        # N independent layers, each with its own weights
        self.layers = nn.ModuleList(
            [EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first=norm_first) for _ in range(n_layers)]
        )
        # pre-LN leaves the residual stream unnormalised: one last LayerNorm (post-LN already ends with one)
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x: torch.Tensor, is_real: torch.Tensor | None = None) -> torch.Tensor:
        """Encode the source; padding keys are ignored in every layer.

        Shape:
            x: (B, S, D), is_real: (B, S) bool or None -> (B, S, D)
        """
        for layer in self.layers:
            x = layer(x, is_real)  # (B, S, D)
        return self.norm(x)


class Decoder(nn.Module):
    """A stack of ``DecoderLayer`` s, with a final LayerNorm when pre-LN.

    Submodules ``layers`` (an ``nn.ModuleList`` of ``n_layers`` separate ``DecoderLayer`` s, each given ``dropout``
    and ``norm_first``) and ``norm`` (``nn.LayerNorm(d_model)`` when pre-LN, ``nn.Identity()`` when post-LN, whose
    layers already end normalised). Every layer gets the masks; the caller's inputs are unchanged. Built from your
    ``DecoderLayer``: ``nn.TransformerDecoder`` and ``nn.TransformerDecoderLayer`` are not to be used (the checks
    refuse them: the stack is the exercise).

    Shape:
        x: (B, T, D), memory: (B, S, D), self_allowed: (B, H, T, T)-broadcastable bool or None,
        cross_allowed: (B, H, T, S)-broadcastable bool or None -> (B, T, D)
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        n_layers: int,
        dropout: float = 0.1,
        norm_first: bool = True,
    ):
        super().__init__()
        ### BEGIN SOLUTION
        # N independent layers (separate weights), not one layer applied N times
        self.layers = nn.ModuleList(
            [DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=norm_first) for _ in range(n_layers)]
        )
        # pre-LN adds every sublayer's output to an unnormalised stream: normalise it once at the end
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        ### END SOLUTION

    def forward(self, x, memory, self_allowed=None, cross_allowed=None):
        """Run every layer in order with the same memory and masks.

        Shape:
            x: (B, T, D), memory: (B, S, D) -> (B, T, D)
        """
        ### BEGIN SOLUTION
        for layer in self.layers:
            x = layer(x, memory, self_allowed, cross_allowed)  # (B, T, D)
        return self.norm(x)  # (B, T, D)
        ### END SOLUTION


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder Transformer: source and target ids in, next-token logits out; builds its own masks.

    Submodules ``src_embed``, ``tgt_embed``, ``pos_encoding``, ``encoder``, ``decoder``, ``out_proj``.
    ``scale_embedding=True`` multiplies both embeddings by sqrt(D) (the paper); the default does not. Tied weights
    are one Parameter (``out_proj.weight is tgt_embed.weight``); ``dropout`` reaches every submodule; the caller's
    inputs are unchanged. Built from this course's modules: ``nn.Transformer``, ``nn.TransformerEncoder``,
    ``nn.TransformerEncoderLayer``, ``nn.TransformerDecoder`` and ``nn.TransformerDecoderLayer`` are not to be used
    (the checks refuse them).

    ``encode``/``decode`` are separate so that generation (lesson 08) encodes the source once. The decoder
    self-attention is causal and, when ``tgt_is_real`` is given, skips target padding keys; cross-attention
    skips source padding keys (``src_is_real``). With ``tie_weights`` the output projection shares its weight
    with the target embedding (Press & Wolf 2017): one (V, D) matrix both embeds and scores tokens.

    Shape:
        src_ids: (B, S), tgt_ids: (B, T), src_is_real: (B, S) bool or None, tgt_is_real: (B, T) bool or None
        -> logits: (B, T, V) with V = tgt_vocab
    """

    def __init__(
        self,
        src_vocab: int,
        tgt_vocab: int,
        d_model: int,
        n_heads: int,
        d_ff: int,
        n_layers: int,
        dropout: float = 0.1,
        tie_weights: bool = True,
        norm_first: bool = True,
        max_len: int = 512,
        scale_embedding: bool = False,
    ):
        super().__init__()
        ### BEGIN SOLUTION
        self.src_embed = nn.Embedding(src_vocab, d_model)  # (V_src, D)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)  # (V, D)
        # departure from the paper, off by default: see the module docstring
        self.embed_scale = math.sqrt(d_model) if scale_embedding else 1.0
        self.pos_encoding = PositionalEncoding(d_model, max_len, dropout)  # shared: it has no weights
        self.encoder = Encoder(d_model, n_heads, d_ff, n_layers, dropout, norm_first)
        self.decoder = Decoder(d_model, n_heads, d_ff, n_layers, dropout, norm_first)
        self.out_proj = nn.Linear(d_model, tgt_vocab)  # D -> V
        if tie_weights:
            self.out_proj.weight = self.tgt_embed.weight  # the same Parameter: one storage, one gradient
        ### END SOLUTION

    def encode(self, src_ids: torch.Tensor, src_is_real: torch.Tensor | None = None) -> torch.Tensor:
        """Embed and encode the source once.

        Shape:
            src_ids: (B, S), src_is_real: (B, S) bool or None -> memory: (B, S, D)
        """
        ### BEGIN SOLUTION
        x = self.pos_encoding(self.src_embed(src_ids) * self.embed_scale)  # (B, S, D)
        return self.encoder(x, src_is_real)  # (B, S, D)
        ### END SOLUTION

    def decode(
        self,
        tgt_ids: torch.Tensor,
        memory: torch.Tensor,
        src_is_real: torch.Tensor | None = None,
        tgt_is_real: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Next-token logits at every target position, attending causally to the target and to the memory.

        Shape:
            tgt_ids: (B, T), memory: (B, S, D) -> logits: (B, T, V)
        """
        ### BEGIN SOLUTION
        T = tgt_ids.shape[1]
        # causal: position t may attend to positions 0..t of the target, never to the future
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_ids.device).tril()  # (T, T)
        self_allowed = causal[None, None]  # (1, 1, T, T)
        if tgt_is_real is not None:
            # and never to target padding keys
            self_allowed = self_allowed & tgt_is_real.bool()[:, None, None, :]  # (B, 1, T, T)
        # every target position may attend to every real source token
        cross_allowed = None if src_is_real is None else src_is_real.bool()[:, None, None, :]  # (B, 1, 1, S)
        y = self.pos_encoding(self.tgt_embed(tgt_ids) * self.embed_scale)  # (B, T, D)
        y = self.decoder(y, memory, self_allowed, cross_allowed)  # (B, T, D)
        return self.out_proj(y)  # (B, T, V)
        ### END SOLUTION

    def forward(self, src_ids, tgt_ids, src_is_real=None, tgt_is_real=None):
        """Encode the source, then decode the whole (shifted) target in parallel, as in training.

        Shape:
            src_ids: (B, S), tgt_ids: (B, T) -> logits: (B, T, V)
        """
        ### BEGIN SOLUTION
        memory = self.encode(src_ids, src_is_real)  # (B, S, D)
        return self.decode(tgt_ids, memory, src_is_real, tgt_is_real)  # (B, T, V)
        ### END SOLUTION


def logits_from_ids(model: Seq2SeqTransformer, src_ids: torch.Tensor, tgt_ids: torch.Tensor,
                    pad_id: int) -> torch.Tensor:
    """Teacher-forced next-token logits of a padded batch, the masks made from ``pad_id`` (find the bug).

    The padding of each side is every position that holds ``pad_id``: ``src_is_real = src_ids != pad_id`` and
    ``tgt_is_real = tgt_ids != pad_id``. The source is encoded once (``model.encode``), then decoded
    (``model.decode``), the two calls generation makes; the logits equal ``model(src_ids, tgt_ids, src_is_real,
    tgt_is_real)``: no position reads a padded source or target token. The caller's tensors are unchanged.

    Shape:
        src_ids: (B, S) int, tgt_ids: (B, T) int -> logits: (B, T, V)
    """
    src_is_real = src_ids != pad_id  # (B, S)
    tgt_is_real = tgt_ids != pad_id  # (B, T)
    memory = model.encode(src_ids, src_is_real)  # (B, S, D): the source read once, its padding masked
    ### BEGIN SOLUTION
    return model.decode(tgt_ids, memory, src_is_real, tgt_is_real)  # (B, T, V)
    ### END SOLUTION
    ### BEGIN BUG
    # return model.decode(tgt_ids, memory, tgt_is_real=tgt_is_real)  # (B, T, V)
    ### END BUG


# -- known mistakes ------------------------------------------------------------------------------------------------
# Realistic wrong answers, each this module's code with a few lines changed: (item, what is wrong, (old, new), ...),
# applied by autograder.course.mutants.patched (each old must occur exactly once in the item's code, so an edit above
# that
# moves a line breaks its mistake loudly). (item, what is wrong) alone is the bug a find-the-bug exercise's release
# shows. Every one must cost its own item and no other, in both layers of checks (tests/test_hidden_checks.py,
# tests/test_visible_catch_rate.py); whole wrong answers of another structure live in autograder/course/mutants/.

_EVEN = "    table[:, 0::2] = torch.sin(angle)"
_ODD = "    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])"
_CALL = "            x = layer(x, memory, self_allowed, cross_allowed)"
_SCALE = "        self.embed_scale = math.sqrt(d_model) if scale_embedding else 1.0"
_BUFFER = '        self.register_buffer("pe", sinusoidal_table(max_len, d_model))'
_ADD = "        return self.dropout(x + self.pe[:T])"
_KEYS = "        allowed = None if src_is_real is None else src_is_real.bool()[:, None, None, :]"
_DECODE = "    return model.decode(tgt_ids, memory, src_is_real, tgt_is_real)"  # the fixed line of the reference
MISTAKES = [
    ("sinusoidal_table", "cosines on the even features, sines on the odd ones",
     (_EVEN, "    table[:, 0::2] = torch.cos(angle)"), (_ODD, "    table[:, 1::2] = torch.sin(angle)")),
    ("sinusoidal_table", "one frequency per feature (10000^(j/D)), not one per pair",
     ("    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32)"
      " * (-math.log(10000.0) / d_model))\n",
      "    inv_freq = 1.0 / 10000 ** (torch.arange(d_model, dtype=torch.float32) / d_model)\n"),
     (_EVEN, "    table[:, 0::2] = torch.sin(angle[:, 0::2])"),
     (_ODD, "    table[:, 1::2] = torch.cos(angle[:, 1::2])")),
    ("sinusoidal_table", "all sines, then all cosines, instead of interleaved pairs",
     ("    table = torch.zeros(max_len, d_model)\n" + _EVEN + "  # even features\n" + _ODD
      + "  # odd features (one fewer when D is odd)\n    return table  # (max_len, D)",
      "    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)")),
    ("sinusoidal_table",
     "cosines of every angle: fails for an odd D (one cosine fewer than sines)",
     (_ODD, "    table[:, 1::2] = torch.cos(angle)")),
    ("sinusoidal_table", "positions counted from 1: the first row is position 0",
     ("torch.arange(max_len, dtype=torch.float32)", "torch.arange(1, max_len + 1, dtype=torch.float32)")),
    ("Decoder", "no final LayerNorm after a pre-LN stack",
     ("        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()",
      "        self.norm = nn.Identity()")),
    ("Decoder", "one layer object repeated n_layers times: the layers share their weights",
     ("        self.layers = nn.ModuleList(\n"
      "            [DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=norm_first) for _ in range(n_layers)]\n"
      "        )\n",
      "        layer = DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=norm_first)\n"
      "        self.layers = nn.ModuleList([layer] * n_layers)\n")),
    ("Decoder", "dropout not passed to the layers: they are built with p = 0",
     ("[DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=norm_first) for _ in range(n_layers)]",
      "[DecoderLayer(d_model, n_heads, d_ff, 0.0, norm_first=norm_first) for _ in range(n_layers)]")),
    ("Decoder", "cross_allowed not passed to the layers: memory padding leaks",
     (_CALL, "            x = layer(x, memory, self_allowed)")),
    ("Decoder", "every layer reads the stack's input x instead of the previous layer's output",
     ("        for layer in self.layers:\n", "        out = x\n        for layer in self.layers:\n"),
     (_CALL, "            out = layer(x, memory, self_allowed, cross_allowed)"),
     ("        return self.norm(x)", "        return self.norm(out)")),
    ("Seq2SeqTransformer", "no causal mask in decode: only target padding is masked",
     ("        self_allowed = causal[None, None]", "        self_allowed = None"),
     ("            self_allowed = self_allowed & tgt_is_real.bool()[:, None, None, :]",
      "            self_allowed = tgt_is_real.bool()[:, None, None, :]")),
    ("Seq2SeqTransformer", "source padding only given to the encoder, not to cross-attention",
     ("        y = self.decoder(y, memory, self_allowed, cross_allowed)",
      "        y = self.decoder(y, memory, self_allowed)")),
    ("Seq2SeqTransformer", "weights tied by copying the values once: two separate tensors",
     ("            self.out_proj.weight = self.tgt_embed.weight",
      "            with torch.no_grad():\n                self.out_proj.weight.copy_(self.tgt_embed.weight)")),
    ("Seq2SeqTransformer", "embeddings always multiplied by sqrt(D), as in the paper",
     (_SCALE, "        self.embed_scale = math.sqrt(d_model)")),
    ("Seq2SeqTransformer", "scale_embedding ignored: embeddings never multiplied by sqrt(D)",
     (_SCALE, "        self.embed_scale = 1.0")),
    ("PositionalEncoding", "rows picked by the batch size (x.shape[0]), not by T (x.shape[1])",
     (_ADD, "        return self.dropout(x + self.pe[: x.shape[0]])")),
    ("PositionalEncoding", "the table is an nn.Parameter: it would be trained",
     (_BUFFER, "        self.pe = nn.Parameter(sinusoidal_table(max_len, d_model))")),
    ("PositionalEncoding", "dropout on the embeddings before the table is added",
     (_ADD, "        return self.dropout(x) + self.pe[:T]")),
    ("PositionalEncoding", "the table is a plain attribute, not a buffer",
     (_BUFFER, "        self.pe = sinusoidal_table(max_len, d_model)")),
    ("EncoderLayer", "the padding mask on the query axis (B, 1, S, 1), not on the keys",
     (_KEYS, "        allowed = None if src_is_real is None else src_is_real.bool()[:, None, :, None]")),
    ("EncoderLayer", "a causal mask in the encoder, as in the decoder's self-attention",
     (_KEYS, "        S = x.shape[1]\n"
             "        allowed = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()\n"
             "        if src_is_real is not None:\n"
             "            allowed = allowed & src_is_real[:, None, None, :]")),
    ("EncoderLayer", "norm_first ignored: always post-LN",
     ("        self.norm_first = norm_first", "        self.norm_first = False  # the argument is never read")),
    ("EncoderLayer", "the dropout argument ignored: every dropout of the layer has p = 0",
     ("MultiHeadAttention(d_model, n_heads, dropout)", "MultiHeadAttention(d_model, n_heads, 0.0)"),
     ("FeedForward(d_model, d_ff, dropout)", "FeedForward(d_model, d_ff, 0.0)"),
     ("        self.dropout1 = nn.Dropout(dropout)\n        self.dropout2 = nn.Dropout(dropout)",
      "        self.dropout1 = nn.Dropout(0.0)\n        self.dropout2 = nn.Dropout(0.0)")),
    ("logits_from_ids",
     "decode given no source padding: the cross-attention reads the padded memory positions"),
    ("logits_from_ids",
     "a wrong fix: the source padding handed to decode and taken from encode: the encoder reads the pads",
     ("    memory = model.encode(src_ids, src_is_real)", "    memory = model.encode(src_ids)")),
    ("logits_from_ids",
     "a wrong fix: decode given the source padding positionally, the target padding dropped",
     (_DECODE, "    return model.decode(tgt_ids, memory, src_is_real)")),
    ("logits_from_ids",
     "a wrong fix: the two masks passed in the wrong order, decode(tgt_ids, memory, tgt_is_real, src_is_real)",
     (_DECODE, "    return model.decode(tgt_ids, memory, tgt_is_real, src_is_real)")),
]
