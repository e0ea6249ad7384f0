"""Wrong answers to lesson 05-decoder-layer.

Each is written as a student would type it in the notebook, where ``torch``, ``nn``, ``np``,
``MultiHeadAttention``, ``CrossAttention``, ``FeedForward``, ``split_heads``, ``merge_heads`` and
``scaled_dot_product_attention`` exist.
"""

import numpy as np
import torch
from torch import nn

from autograder.mutants import mutant, patched, shown_bug
from autograder.reference.attention import scaled_dot_product_attention
from autograder.reference.cross_attention import CrossAttention
from autograder.reference.multi_head import MultiHeadAttention, merge_heads, split_heads

MUTANTS: list = []


# -- FeedForward ---------------------------------------------------------------------------------------------
@mutant(MUTANTS, "FeedForward", "no ReLU: two linear maps collapse into one")
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(self.dropout(self.linear1(x)))


@mutant(MUTANTS, "FeedForward", "GELU instead of the ReLU of the paper and of PyTorch")
class FeedForward(nn.Module):  # noqa: F811
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(self.dropout(torch.nn.functional.gelu(self.linear1(x))))


@mutant(MUTANTS, "FeedForward", "dropout on the output instead of the hidden layer")
class FeedForward(nn.Module):  # noqa: F811
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.dropout(self.linear2(torch.relu(self.linear1(x))))


# -- DecoderLayer --------------------------------------------------------------------------------------------
@mutant(MUTANTS, "DecoderLayer", "norm_first ignored: always post-LN")
class DecoderLayer(nn.Module):
    def __init__(
        self,
        d_model,
        n_heads,
        d_ff,
        dropout=0.1,
        norm_first=False,
        self_attn=None,
        cross_attn=None,
        feed_forward=None,
    ):
        super().__init__()
        self.self_attn = self_attn if self_attn is not None else MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = cross_attn if cross_attn is not None else CrossAttention(d_model, n_heads, dropout)
        self.feed_forward = feed_forward if feed_forward is not None else FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(self, x, memory, self_allowed=None, cross_allowed=None):
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, allowed=self_allowed)[0]))
        x = self.norm2(x + self.dropout2(self.cross_attn(x, memory, allowed=cross_allowed)[0]))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))


@mutant(MUTANTS, "DecoderLayer", "pre-LN adds the sublayer to the normalised x, not to the raw x")
class DecoderLayer(nn.Module):  # noqa: F811
    def __init__(
        self,
        d_model,
        n_heads,
        d_ff,
        dropout=0.1,
        norm_first=False,
        self_attn=None,
        cross_attn=None,
        feed_forward=None,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = self_attn if self_attn is not None else MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = cross_attn if cross_attn is not None else CrossAttention(d_model, n_heads, dropout)
        self.feed_forward = feed_forward if feed_forward is not None else FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(self, x, memory, self_allowed=None, cross_allowed=None):
        if self.norm_first:
            h = self.norm1(x)
            x = h + self.dropout1(self.self_attn(h, h, h, allowed=self_allowed)[0])
            h = self.norm2(x)
            x = h + self.dropout2(self.cross_attn(h, memory, allowed=cross_allowed)[0])
            h = self.norm3(x)
            return h + self.dropout3(self.feed_forward(h))
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, allowed=self_allowed)[0]))
        x = self.norm2(x + self.dropout2(self.cross_attn(x, memory, allowed=cross_allowed)[0]))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))


@mutant(MUTANTS, "DecoderLayer", "cross_allowed never passed: memory padding leaks")
class DecoderLayer(nn.Module):  # noqa: F811
    def __init__(
        self,
        d_model,
        n_heads,
        d_ff,
        dropout=0.1,
        norm_first=False,
        self_attn=None,
        cross_attn=None,
        feed_forward=None,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = self_attn if self_attn is not None else MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = cross_attn if cross_attn is not None else CrossAttention(d_model, n_heads, dropout)
        self.feed_forward = feed_forward if feed_forward is not None else FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(self, x, memory, self_allowed=None, cross_allowed=None):
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.dropout1(self.self_attn(h, h, h, allowed=self_allowed)[0])
            x = x + self.dropout2(self.cross_attn(self.norm2(x), memory)[0])
            return x + self.dropout3(self.feed_forward(self.norm3(x)))
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, allowed=self_allowed)[0]))
        x = self.norm2(x + self.dropout2(self.cross_attn(x, memory)[0]))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))


@mutant(MUTANTS, "DecoderLayer", "the sublayers passed in are ignored: always builds its own")
class DecoderLayer(nn.Module):  # noqa: F811
    def __init__(
        self,
        d_model,
        n_heads,
        d_ff,
        dropout=0.1,
        norm_first=False,
        self_attn=None,
        cross_attn=None,
        feed_forward=None,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = CrossAttention(d_model, n_heads, dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(self, x, memory, self_allowed=None, cross_allowed=None):
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.dropout1(self.self_attn(h, h, h, allowed=self_allowed)[0])
            x = x + self.dropout2(self.cross_attn(self.norm2(x), memory, allowed=cross_allowed)[0])
            return x + self.dropout3(self.feed_forward(self.norm3(x)))
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, allowed=self_allowed)[0]))
        x = self.norm2(x + self.dropout2(self.cross_attn(x, memory, allowed=cross_allowed)[0]))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))


@mutant(MUTANTS, "DecoderLayer", "dropout1..3 built but never applied: no dropout on the sublayers' outputs")
class DecoderLayer(nn.Module):  # noqa: F811
    def __init__(
        self,
        d_model,
        n_heads,
        d_ff,
        dropout=0.1,
        norm_first=False,
        self_attn=None,
        cross_attn=None,
        feed_forward=None,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = self_attn if self_attn is not None else MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = cross_attn if cross_attn is not None else CrossAttention(d_model, n_heads, dropout)
        self.feed_forward = feed_forward if feed_forward is not None else FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(self, x, memory, self_allowed=None, cross_allowed=None):
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.self_attn(h, h, h, allowed=self_allowed)[0]
            x = x + self.cross_attn(self.norm2(x), memory, allowed=cross_allowed)[0]
            return x + self.feed_forward(self.norm3(x))
        x = self.norm1(x + self.self_attn(x, x, x, allowed=self_allowed)[0])
        x = self.norm2(x + self.cross_attn(x, memory, allowed=cross_allowed)[0])
        return self.norm3(x + self.feed_forward(x))


# -- init_numpy_decoder_params -------------------------------------------------------------------------------
@mutant(MUTANTS, "init_numpy_decoder_params", "standard normal weights, not scaled by 1/sqrt(fan_in)")
def init_numpy_decoder_params(D, H, F, rng=None):
    rng = np.random.default_rng() if rng is None else rng
    params = {}
    for prefix in ["sa", "ca"]:
        for name in ["q", "k", "v", "o"]:
            params[f"{prefix}_W{name}"] = rng.standard_normal((D, D))
            params[f"{prefix}_b{name}"] = np.zeros(D)
    params["ff_W1"], params["ff_b1"] = rng.standard_normal((D, F)), np.zeros(F)
    params["ff_W2"], params["ff_b2"] = rng.standard_normal((F, D)), np.zeros(D)
    for i in [1, 2, 3]:
        params[f"ln{i}_g"], params[f"ln{i}_b"] = np.ones(D), np.zeros(D)
    return params


@mutant(MUTANTS, "init_numpy_decoder_params", "ff_W2 stored (D, F), the (out, in) layout of nn.Linear")
def init_numpy_decoder_params(D, H, F, rng=None):  # noqa: F811 - each mutant is a separate wrong answer
    rng = np.random.default_rng() if rng is None else rng
    params = {}
    for prefix in ["sa", "ca"]:
        for name in ["q", "k", "v", "o"]:
            params[f"{prefix}_W{name}"] = rng.normal(0, 1 / np.sqrt(D), (D, D))
            params[f"{prefix}_b{name}"] = np.zeros(D)
    params["ff_W1"], params["ff_b1"] = rng.normal(0, 1 / np.sqrt(D), (D, F)), np.zeros(F)
    params["ff_W2"], params["ff_b2"] = rng.normal(0, 1 / np.sqrt(F), (D, F)), np.zeros(D)
    for i in [1, 2, 3]:
        params[f"ln{i}_g"], params[f"ln{i}_b"] = np.ones(D), np.zeros(D)
    return params


@mutant(MUTANTS, "init_numpy_decoder_params", "rng=None falls back to a fixed seed: every run is the same")
def init_numpy_decoder_params(D, H, F, rng=None):  # noqa: F811
    rng = np.random.default_rng(0) if rng is None else rng
    params = {}
    for prefix in ["sa", "ca"]:
        for name in ["q", "k", "v", "o"]:
            params[f"{prefix}_W{name}"] = rng.normal(0, 1 / np.sqrt(D), (D, D))
            params[f"{prefix}_b{name}"] = np.zeros(D)
    params["ff_W1"], params["ff_b1"] = rng.normal(0, 1 / np.sqrt(D), (D, F)), np.zeros(F)
    params["ff_W2"], params["ff_b2"] = rng.normal(0, 1 / np.sqrt(F), (F, D)), np.zeros(D)
    for i in [1, 2, 3]:
        params[f"ln{i}_g"], params[f"ln{i}_b"] = np.ones(D), np.zeros(D)
    return params


@mutant(MUTANTS, "init_numpy_decoder_params", "LayerNorm gains start at zero: every output starts at 0")
def init_numpy_decoder_params(D, H, F, rng=None):  # noqa: F811
    rng = np.random.default_rng() if rng is None else rng
    params = {}
    for prefix in ["sa", "ca"]:
        for name in ["q", "k", "v", "o"]:
            params[f"{prefix}_W{name}"] = rng.normal(0, 1 / np.sqrt(D), (D, D))
            params[f"{prefix}_b{name}"] = np.zeros(D)
    params["ff_W1"], params["ff_b1"] = rng.normal(0, 1 / np.sqrt(D), (D, F)), np.zeros(F)
    params["ff_W2"], params["ff_b2"] = rng.normal(0, 1 / np.sqrt(F), (F, D)), np.zeros(D)
    for i in [1, 2, 3]:
        params[f"ln{i}_g"], params[f"ln{i}_b"] = np.zeros(D), np.zeros(D)
    return params


# -- numpy_decoder_layer -------------------------------------------------------------------------------------
@mutant(MUTANTS, "numpy_decoder_layer", "W2 @ h instead of h @ W2 in the feed-forward")
def numpy_decoder_layer(x, memory, params, n_heads, self_allowed=None, cross_allowed=None, norm_first=False):
    p = params

    def layer_norm(h, i):
        mean = h.mean(axis=-1, keepdims=True)
        var = h.var(axis=-1, keepdims=True)
        return (h - mean) / np.sqrt(var + 1e-5) * p[f"ln{i}_g"] + p[f"ln{i}_b"]

    def multi_head(h_q, h_kv, prefix, allowed):
        q = split_heads(h_q @ p[f"{prefix}_Wq"] + p[f"{prefix}_bq"], n_heads)
        k = split_heads(h_kv @ p[f"{prefix}_Wk"] + p[f"{prefix}_bk"], n_heads)
        v = split_heads(h_kv @ p[f"{prefix}_Wv"] + p[f"{prefix}_bv"], n_heads)
        out, _ = scaled_dot_product_attention(q, k, v, allowed)
        return merge_heads(out) @ p[f"{prefix}_Wo"] + p[f"{prefix}_bo"]

    def feed_forward(h):
        hidden = np.maximum(p["ff_W1"] @ h + p["ff_b1"], 0.0)
        return p["ff_W2"] @ hidden + p["ff_b2"]

    if norm_first:
        h = layer_norm(x, 1)
        x = x + multi_head(h, h, "sa", self_allowed)
        x = x + multi_head(layer_norm(x, 2), memory, "ca", cross_allowed)
        return x + feed_forward(layer_norm(x, 3))
    x = layer_norm(x + multi_head(x, x, "sa", self_allowed), 1)
    x = layer_norm(x + multi_head(x, memory, "ca", cross_allowed), 2)
    return layer_norm(x + feed_forward(x), 3)


@mutant(MUTANTS, "numpy_decoder_layer", "LayerNorm statistics over the time axis, not over D")
def numpy_decoder_layer(  # noqa: F811
    x,
    memory,
    params,
    n_heads,
    self_allowed=None,
    cross_allowed=None,
    norm_first=False,
):
    p = params

    def layer_norm(h, i):
        mean = h.mean(axis=1, keepdims=True)
        var = h.var(axis=1, keepdims=True)
        return (h - mean) / np.sqrt(var + 1e-5) * p[f"ln{i}_g"] + p[f"ln{i}_b"]

    def multi_head(h_q, h_kv, prefix, allowed):
        q = split_heads(h_q @ p[f"{prefix}_Wq"] + p[f"{prefix}_bq"], n_heads)
        k = split_heads(h_kv @ p[f"{prefix}_Wk"] + p[f"{prefix}_bk"], n_heads)
        v = split_heads(h_kv @ p[f"{prefix}_Wv"] + p[f"{prefix}_bv"], n_heads)
        out, _ = scaled_dot_product_attention(q, k, v, allowed)
        return merge_heads(out) @ p[f"{prefix}_Wo"] + p[f"{prefix}_bo"]

    def feed_forward(h):
        hidden = np.maximum(h @ p["ff_W1"] + p["ff_b1"], 0.0)
        return hidden @ p["ff_W2"] + p["ff_b2"]

    if norm_first:
        h = layer_norm(x, 1)
        x = x + multi_head(h, h, "sa", self_allowed)
        x = x + multi_head(layer_norm(x, 2), memory, "ca", cross_allowed)
        return x + feed_forward(layer_norm(x, 3))
    x = layer_norm(x + multi_head(x, x, "sa", self_allowed), 1)
    x = layer_norm(x + multi_head(x, memory, "ca", cross_allowed), 2)
    return layer_norm(x + feed_forward(x), 3)


@mutant(MUTANTS, "numpy_decoder_layer", "cross-attention's keys and values taken from x, not the memory")
def numpy_decoder_layer(  # noqa: F811
    x,
    memory,
    params,
    n_heads,
    self_allowed=None,
    cross_allowed=None,
    norm_first=False,
):
    p = params

    def layer_norm(h, i):
        mean = h.mean(axis=-1, keepdims=True)
        var = h.var(axis=-1, keepdims=True)
        return (h - mean) / np.sqrt(var + 1e-5) * p[f"ln{i}_g"] + p[f"ln{i}_b"]

    def multi_head(h_q, h_kv, prefix, allowed):
        q = split_heads(h_q @ p[f"{prefix}_Wq"] + p[f"{prefix}_bq"], n_heads)
        k = split_heads(h_kv @ p[f"{prefix}_Wk"] + p[f"{prefix}_bk"], n_heads)
        v = split_heads(h_kv @ p[f"{prefix}_Wv"] + p[f"{prefix}_bv"], n_heads)
        out, _ = scaled_dot_product_attention(q, k, v, allowed)
        return merge_heads(out) @ p[f"{prefix}_Wo"] + p[f"{prefix}_bo"]

    def feed_forward(h):
        hidden = np.maximum(h @ p["ff_W1"] + p["ff_b1"], 0.0)
        return hidden @ p["ff_W2"] + p["ff_b2"]

    if norm_first:
        h = layer_norm(x, 1)
        x = x + multi_head(h, h, "sa", self_allowed)
        h = layer_norm(x, 2)
        x = x + multi_head(h, h, "ca", None)
        return x + feed_forward(layer_norm(x, 3))
    x = layer_norm(x + multi_head(x, x, "sa", self_allowed), 1)
    x = layer_norm(x + multi_head(x, x, "ca", None), 2)
    return layer_norm(x + feed_forward(x), 3)


@mutant(MUTANTS, "numpy_decoder_layer", "no residual around the feed-forward")
def numpy_decoder_layer(  # noqa: F811
    x,
    memory,
    params,
    n_heads,
    self_allowed=None,
    cross_allowed=None,
    norm_first=False,
):
    p = params

    def layer_norm(h, i):
        mean = h.mean(axis=-1, keepdims=True)
        var = h.var(axis=-1, keepdims=True)
        return (h - mean) / np.sqrt(var + 1e-5) * p[f"ln{i}_g"] + p[f"ln{i}_b"]

    def multi_head(h_q, h_kv, prefix, allowed):
        q = split_heads(h_q @ p[f"{prefix}_Wq"] + p[f"{prefix}_bq"], n_heads)
        k = split_heads(h_kv @ p[f"{prefix}_Wk"] + p[f"{prefix}_bk"], n_heads)
        v = split_heads(h_kv @ p[f"{prefix}_Wv"] + p[f"{prefix}_bv"], n_heads)
        out, _ = scaled_dot_product_attention(q, k, v, allowed)
        return merge_heads(out) @ p[f"{prefix}_Wo"] + p[f"{prefix}_bo"]

    def feed_forward(h):
        hidden = np.maximum(h @ p["ff_W1"] + p["ff_b1"], 0.0)
        return hidden @ p["ff_W2"] + p["ff_b2"]

    if norm_first:
        h = layer_norm(x, 1)
        x = x + multi_head(h, h, "sa", self_allowed)
        x = x + multi_head(layer_norm(x, 2), memory, "ca", cross_allowed)
        return feed_forward(layer_norm(x, 3))
    x = layer_norm(x + multi_head(x, x, "sa", self_allowed), 1)
    x = layer_norm(x + multi_head(x, memory, "ca", cross_allowed), 2)
    return layer_norm(feed_forward(x), 3)


# -- run_with_torch_masks (find the bug) ----------------------------------------------------------------------
LESSON = "05-decoder-layer"
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
