"""Wrong answers to lesson 06-model.

Each is written as a student would type it in the notebook, where ``math``, ``torch``, ``nn``,
``sinusoidal_table``, ``PositionalEncoding``, ``MultiHeadAttention``, ``FeedForward``, ``EncoderLayer``, ``Encoder``,
``Decoder`` and ``DecoderLayer`` exist.

The order of the items (table, Decoder, model, PositionalEncoding, EncoderLayer) decides which items the demo's
"typical mistakes" student gets wrong (every other item): the table, the model and the encoder layer (the model,
built on the student's encoder layer, is judged relative to it).
"""

import math

import torch
from torch import nn

from autograder.mutants import mutant, patched, shown_bug
from autograder.reference.decoder_layer import DecoderLayer, FeedForward
from autograder.reference.model import Encoder
from autograder.reference.multi_head import MultiHeadAttention

MUTANTS: list = []


# -- sinusoidal_table ----------------------------------------------------------------------------------------
@mutant(MUTANTS, "sinusoidal_table", "cosines on the even features, sines on the odd ones")
def sinusoidal_table(max_len, d_model):
    position = torch.arange(max_len, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    angle = position * inv_freq
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.cos(angle)
    table[:, 1::2] = torch.sin(angle)
    return table


@mutant(MUTANTS, "sinusoidal_table", "one frequency per feature (10000^(j/D)), not one per pair")
def sinusoidal_table(max_len, d_model):  # noqa: F811 - each mutant is a separate wrong answer
    position = torch.arange(max_len, dtype=torch.float32)[:, None]
    inv_freq = 1.0 / 10000 ** (torch.arange(d_model, dtype=torch.float32) / d_model)
    angle = position * inv_freq
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(angle[:, 0::2])
    table[:, 1::2] = torch.cos(angle[:, 1::2])
    return table


@mutant(MUTANTS, "sinusoidal_table", "all sines, then all cosines, instead of interleaved pairs")
def sinusoidal_table(max_len, d_model):  # noqa: F811
    position = torch.arange(max_len, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    angle = position * inv_freq
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)


@mutant(MUTANTS, "sinusoidal_table", "cosines of every angle: fails for an odd D (one cosine fewer than sines)")
def sinusoidal_table(max_len, d_model):  # noqa: F811
    position = torch.arange(max_len, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    angle = position * inv_freq
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table


# -- Decoder -------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "Decoder", "no final LayerNorm after a pre-LN stack")
class Decoder(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, n_layers, dropout=0.1, norm_first=True):
        super().__init__()
        self.layers = nn.ModuleList(
            [DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=norm_first) for _ in range(n_layers)]
        )
        self.norm = nn.Identity()

    def forward(self, x, memory, self_allowed=None, cross_allowed=None):
        for layer in self.layers:
            x = layer(x, memory, self_allowed, cross_allowed)
        return self.norm(x)


@mutant(MUTANTS, "Decoder", "one layer object repeated n_layers times: the layers share their weights")
class Decoder(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, d_ff, n_layers, dropout=0.1, norm_first=True):
        super().__init__()
        layer = DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=norm_first)
        self.layers = nn.ModuleList([layer] * n_layers)
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x, memory, self_allowed=None, cross_allowed=None):
        for layer in self.layers:
            x = layer(x, memory, self_allowed, cross_allowed)
        return self.norm(x)


@mutant(MUTANTS, "Decoder", "cross_allowed not passed to the layers: memory padding leaks")
class Decoder(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, d_ff, n_layers, dropout=0.1, norm_first=True):
        super().__init__()
        self.layers = nn.ModuleList(
            [DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=norm_first) for _ in range(n_layers)]
        )
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x, memory, self_allowed=None, cross_allowed=None):
        for layer in self.layers:
            x = layer(x, memory, self_allowed)
        return self.norm(x)


@mutant(MUTANTS, "Decoder", "every layer reads the stack's input x instead of the previous layer's output")
class Decoder(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, d_ff, n_layers, dropout=0.1, norm_first=True):
        super().__init__()
        self.layers = nn.ModuleList(
            [DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=norm_first) for _ in range(n_layers)]
        )
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x, memory, self_allowed=None, cross_allowed=None):
        out = x
        for layer in self.layers:
            out = layer(x, memory, self_allowed, cross_allowed)
        return self.norm(out)


# -- Seq2SeqTransformer --------------------------------------------------------------------------------------
@mutant(MUTANTS, "Seq2SeqTransformer", "no causal mask in decode: only target padding is masked")
class Seq2SeqTransformer(nn.Module):
    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, d_ff, n_layers, dropout=0.1, tie_weights=True,
                 norm_first=True, max_len=512, scale_embedding=False):
        super().__init__()
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.embed_scale = math.sqrt(d_model) if scale_embedding else 1.0
        self.pos_encoding = PositionalEncoding(d_model, max_len, dropout)
        self.encoder = Encoder(d_model, n_heads, d_ff, n_layers, dropout, norm_first)
        self.decoder = Decoder(d_model, n_heads, d_ff, n_layers, dropout, norm_first)
        self.out_proj = nn.Linear(d_model, tgt_vocab)
        if tie_weights:
            self.out_proj.weight = self.tgt_embed.weight

    def encode(self, src_ids, src_is_real=None):
        x = self.pos_encoding(self.src_embed(src_ids) * self.embed_scale)
        return self.encoder(x, src_is_real)

    def decode(self, tgt_ids, memory, src_is_real=None, tgt_is_real=None):
        self_allowed = None if tgt_is_real is None else tgt_is_real[:, None, None, :]
        cross_allowed = None if src_is_real is None else src_is_real[:, None, None, :]
        y = self.pos_encoding(self.tgt_embed(tgt_ids) * self.embed_scale)
        return self.out_proj(self.decoder(y, memory, self_allowed, cross_allowed))

    def forward(self, src_ids, tgt_ids, src_is_real=None, tgt_is_real=None):
        return self.decode(tgt_ids, self.encode(src_ids, src_is_real), src_is_real, tgt_is_real)


@mutant(MUTANTS, "Seq2SeqTransformer", "source padding only given to the encoder, not to cross-attention")
class Seq2SeqTransformer(nn.Module):  # noqa: F811
    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, d_ff, n_layers, dropout=0.1, tie_weights=True,
                 norm_first=True, max_len=512, scale_embedding=False):
        super().__init__()
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.embed_scale = math.sqrt(d_model) if scale_embedding else 1.0
        self.pos_encoding = PositionalEncoding(d_model, max_len, dropout)
        self.encoder = Encoder(d_model, n_heads, d_ff, n_layers, dropout, norm_first)
        self.decoder = Decoder(d_model, n_heads, d_ff, n_layers, dropout, norm_first)
        self.out_proj = nn.Linear(d_model, tgt_vocab)
        if tie_weights:
            self.out_proj.weight = self.tgt_embed.weight

    def encode(self, src_ids, src_is_real=None):
        x = self.pos_encoding(self.src_embed(src_ids) * self.embed_scale)
        return self.encoder(x, src_is_real)

    def decode(self, tgt_ids, memory, src_is_real=None, tgt_is_real=None):
        T = tgt_ids.shape[1]
        self_allowed = torch.ones(T, T, dtype=torch.bool).tril()
        if tgt_is_real is not None:
            self_allowed = self_allowed & tgt_is_real[:, None, None, :]
        y = self.pos_encoding(self.tgt_embed(tgt_ids) * self.embed_scale)
        return self.out_proj(self.decoder(y, memory, self_allowed))

    def forward(self, src_ids, tgt_ids, src_is_real=None, tgt_is_real=None):
        return self.decode(tgt_ids, self.encode(src_ids, src_is_real), src_is_real, tgt_is_real)


@mutant(MUTANTS, "Seq2SeqTransformer", "weights tied by copying the values once: two separate tensors")
class Seq2SeqTransformer(nn.Module):  # noqa: F811
    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, d_ff, n_layers, dropout=0.1, tie_weights=True,
                 norm_first=True, max_len=512, scale_embedding=False):
        super().__init__()
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.embed_scale = math.sqrt(d_model) if scale_embedding else 1.0
        self.pos_encoding = PositionalEncoding(d_model, max_len, dropout)
        self.encoder = Encoder(d_model, n_heads, d_ff, n_layers, dropout, norm_first)
        self.decoder = Decoder(d_model, n_heads, d_ff, n_layers, dropout, norm_first)
        self.out_proj = nn.Linear(d_model, tgt_vocab)
        if tie_weights:
            with torch.no_grad():
                self.out_proj.weight.copy_(self.tgt_embed.weight)

    def encode(self, src_ids, src_is_real=None):
        x = self.pos_encoding(self.src_embed(src_ids) * self.embed_scale)
        return self.encoder(x, src_is_real)

    def decode(self, tgt_ids, memory, src_is_real=None, tgt_is_real=None):
        T = tgt_ids.shape[1]
        self_allowed = torch.ones(T, T, dtype=torch.bool).tril()
        if tgt_is_real is not None:
            self_allowed = self_allowed & tgt_is_real[:, None, None, :]
        cross_allowed = None if src_is_real is None else src_is_real[:, None, None, :]
        y = self.pos_encoding(self.tgt_embed(tgt_ids) * self.embed_scale)
        return self.out_proj(self.decoder(y, memory, self_allowed, cross_allowed))

    def forward(self, src_ids, tgt_ids, src_is_real=None, tgt_is_real=None):
        return self.decode(tgt_ids, self.encode(src_ids, src_is_real), src_is_real, tgt_is_real)


@mutant(MUTANTS, "Seq2SeqTransformer", "embeddings always multiplied by sqrt(D), as in the paper")
class Seq2SeqTransformer(nn.Module):  # noqa: F811
    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, d_ff, n_layers, dropout=0.1, tie_weights=True,
                 norm_first=True, max_len=512, scale_embedding=False):
        super().__init__()
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.embed_scale = math.sqrt(d_model)
        self.pos_encoding = PositionalEncoding(d_model, max_len, dropout)
        self.encoder = Encoder(d_model, n_heads, d_ff, n_layers, dropout, norm_first)
        self.decoder = Decoder(d_model, n_heads, d_ff, n_layers, dropout, norm_first)
        self.out_proj = nn.Linear(d_model, tgt_vocab)
        if tie_weights:
            self.out_proj.weight = self.tgt_embed.weight

    def encode(self, src_ids, src_is_real=None):
        x = self.pos_encoding(self.src_embed(src_ids) * self.embed_scale)
        return self.encoder(x, src_is_real)

    def decode(self, tgt_ids, memory, src_is_real=None, tgt_is_real=None):
        T = tgt_ids.shape[1]
        self_allowed = torch.ones(T, T, dtype=torch.bool).tril()
        if tgt_is_real is not None:
            self_allowed = self_allowed & tgt_is_real[:, None, None, :]
        cross_allowed = None if src_is_real is None else src_is_real[:, None, None, :]
        y = self.pos_encoding(self.tgt_embed(tgt_ids) * self.embed_scale)
        return self.out_proj(self.decoder(y, memory, self_allowed, cross_allowed))

    def forward(self, src_ids, tgt_ids, src_is_real=None, tgt_is_real=None):
        return self.decode(tgt_ids, self.encode(src_ids, src_is_real), src_is_real, tgt_is_real)


@mutant(MUTANTS, "Seq2SeqTransformer", "scale_embedding ignored: embeddings never multiplied by sqrt(D)")
class Seq2SeqTransformer(nn.Module):  # noqa: F811
    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, d_ff, n_layers, dropout=0.1, tie_weights=True,
                 norm_first=True, max_len=512, scale_embedding=False):
        super().__init__()
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.pos_encoding = PositionalEncoding(d_model, max_len, dropout)
        self.encoder = Encoder(d_model, n_heads, d_ff, n_layers, dropout, norm_first)
        self.decoder = Decoder(d_model, n_heads, d_ff, n_layers, dropout, norm_first)
        self.out_proj = nn.Linear(d_model, tgt_vocab)
        if tie_weights:
            self.out_proj.weight = self.tgt_embed.weight

    def encode(self, src_ids, src_is_real=None):
        return self.encoder(self.pos_encoding(self.src_embed(src_ids)), src_is_real)

    def decode(self, tgt_ids, memory, src_is_real=None, tgt_is_real=None):
        T = tgt_ids.shape[1]
        self_allowed = torch.ones(T, T, dtype=torch.bool).tril()
        if tgt_is_real is not None:
            self_allowed = self_allowed & tgt_is_real[:, None, None, :]
        cross_allowed = None if src_is_real is None else src_is_real[:, None, None, :]
        y = self.pos_encoding(self.tgt_embed(tgt_ids))
        return self.out_proj(self.decoder(y, memory, self_allowed, cross_allowed))

    def forward(self, src_ids, tgt_ids, src_is_real=None, tgt_is_real=None):
        return self.decode(tgt_ids, self.encode(src_ids, src_is_real), src_is_real, tgt_is_real)


# -- PositionalEncoding --------------------------------------------------------------------------------------
@mutant(MUTANTS, "PositionalEncoding", "rows picked by the batch size (x.shape[0]), not by T (x.shape[1])")
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=512, dropout=0.0):
        super().__init__()
        self.register_buffer("pe", sinusoidal_table(max_len, d_model))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(x + self.pe[: x.shape[0]])


@mutant(MUTANTS, "PositionalEncoding", "the table is an nn.Parameter: it would be trained")
class PositionalEncoding(nn.Module):  # noqa: F811
    def __init__(self, d_model, max_len=512, dropout=0.0):
        super().__init__()
        self.pe = nn.Parameter(sinusoidal_table(max_len, d_model))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(x + self.pe[: x.shape[1]])


@mutant(MUTANTS, "PositionalEncoding", "dropout on the embeddings before the table is added")
class PositionalEncoding(nn.Module):  # noqa: F811
    def __init__(self, d_model, max_len=512, dropout=0.0):
        super().__init__()
        self.register_buffer("pe", sinusoidal_table(max_len, d_model))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(x) + self.pe[: x.shape[1]]


@mutant(MUTANTS, "PositionalEncoding", "the table is a plain attribute, not a buffer")
class PositionalEncoding(nn.Module):  # noqa: F811
    def __init__(self, d_model, max_len=512, dropout=0.0):
        super().__init__()
        self.pe = sinusoidal_table(max_len, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(x + self.pe[: x.shape[1]])


# The mutants above call sinusoidal_table, PositionalEncoding and Decoder by name, as notebook code does. Here those
# names must be the correct ones, so that each wrong answer is wrong in its own item only: rebind them last.
from autograder.reference.model import Decoder, PositionalEncoding, sinusoidal_table  # noqa: E402, F401, F811


# -- EncoderLayer --------------------------------------------------------------------------------------------
@mutant(MUTANTS, "EncoderLayer", "the padding mask on the query axis (B, 1, S, 1), not on the keys")
class EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x, src_is_real=None):
        allowed = None if src_is_real is None else src_is_real[:, None, :, None]
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.dropout1(self.self_attn(h, h, h, allowed=allowed)[0])
            return x + self.dropout2(self.feed_forward(self.norm2(x)))
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, allowed=allowed)[0]))
        return self.norm2(x + self.dropout2(self.feed_forward(x)))


@mutant(MUTANTS, "EncoderLayer", "a causal mask in the encoder, as in the decoder's self-attention")
class EncoderLayer(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x, src_is_real=None):
        S = x.shape[1]
        allowed = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
        if src_is_real is not None:
            allowed = allowed & src_is_real[:, None, None, :]
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.dropout1(self.self_attn(h, h, h, allowed=allowed)[0])
            return x + self.dropout2(self.feed_forward(self.norm2(x)))
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, allowed=allowed)[0]))
        return self.norm2(x + self.dropout2(self.feed_forward(x)))


@mutant(MUTANTS, "EncoderLayer", "norm_first ignored: always post-LN")
class EncoderLayer(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1, norm_first=False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x, src_is_real=None):
        allowed = None if src_is_real is None else src_is_real[:, None, None, :]
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, allowed=allowed)[0]))
        return self.norm2(x + self.dropout2(self.feed_forward(x)))


# -- logits_from_ids (find the bug) ---------------------------------------------------------------------------
LESSON = "06-model"
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
