"""Reference for lesson 05-decoder-layer: the feed-forward block and a decoder layer, in PyTorch and in NumPy.

A decoder layer has three sublayers, each wrapped in a residual connection and a LayerNorm: masked
self-attention, cross-attention over the encoder's memory, and a position-wise feed-forward network.
``norm_first=False`` is the paper's post-LN (normalise after adding the residual); ``norm_first=True`` is
pre-LN (normalise each sublayer's input), a departure from the paper that trains deep stacks more stably and
needs a final LayerNorm after the stack (lesson 06). With copied weights both equal
``nn.TransformerDecoderLayer(batch_first=True, norm_first=...)`` in eval mode.

``cross_attn=False`` switches the cross-attention sublayer off: what is left (masked self-attention and the
feed-forward) is a *decoder-only* layer, the block of GPT (lesson 11). It equals
``nn.TransformerEncoderLayer(batch_first=True, norm_first=...)`` run with a causal mask.

``run_with_torch_masks`` is a find-the-bug exercise (autograder.course.bugs): given code that calls the student's
``DecoderLayer`` with the mask arguments of ``nn.TransformerDecoderLayer`` (True = blocked), with one mistake in
how it joins two of them.
"""

import numpy as np
import torch
from torch import nn

from autograder.course.reference.attention import scaled_dot_product_attention
from autograder.course.reference.cross_attention import CrossAttention
from autograder.course.reference.multi_head import MultiHeadAttention, load_from_torch_mha, merge_heads, split_heads


class FeedForward(nn.Module):
    """Position-wise feed-forward network: Linear D -> F, ReLU, dropout, Linear F -> D, at every position.

    Submodules ``linear1``, ``dropout``, ``linear2``; in training mode dropout acts on the hidden (B, T, F)
    activations, after the ReLU; the caller's ``x`` is unchanged.

    Shape:
        x: (B, T, D) -> (B, T, D)
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        ### BEGIN SOLUTION
        self.linear1 = nn.Linear(d_model, d_ff)  # D -> F: widen (F is usually 4 D)
        self.dropout = nn.Dropout(dropout)  # on the hidden activations, after the ReLU (as PyTorch)
        self.linear2 = nn.Linear(d_ff, d_model)  # F -> D: back to the residual stream's width
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the network to every position independently.

        Shape:
            x: (B, T, D) -> (B, T, D)
        """
        ### BEGIN SOLUTION
        hidden = torch.relu(self.linear1(x))  # (B, T, F)
        return self.linear2(self.dropout(hidden))  # (B, T, D)
        ### END SOLUTION


class DecoderLayer(nn.Module):
    """A decoder layer: masked self-attention, cross-attention, feed-forward; each with residual + LayerNorm.

    In training mode the layer's own ``dropout1``, ``dropout2``, ``dropout3`` act once each, in that order
    (``dropout2`` only with cross-attention), on each sublayer's (B, T, D) output before its residual addition; in
    eval mode nothing is random. Parameters load by the names ``self_attn``, ``cross_attn``, ``feed_forward``,
    ``norm1``..``norm3``; the caller's inputs are unchanged. Built by hand: ``nn.TransformerDecoderLayer`` and
    ``nn.TransformerDecoder`` are what it is compared with, not to be used (the checks refuse them).

    Sublayers may be injected (``self_attn``, ``cross_attn``, ``feed_forward``); by default they are built
    from ``MultiHeadAttention``, ``CrossAttention`` and ``FeedForward``. Masks are boolean, True = may attend.
    ``cross_attn=False`` builds a decoder-only layer: no cross-attention sublayer (``cross_attn``, ``norm2`` and
    ``dropout2`` are None, so they hold no parameters), and ``forward`` takes ``memory=None``.

    Shape:
        x: (B, T, D), memory: (B, S, D) or None without cross-attention,
        self_allowed: (B, H, T, T)-broadcastable bool or None,
        cross_allowed: (B, H, T, S)-broadcastable bool or None -> (B, T, D)
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
        self_attn: nn.Module | None = None,
        cross_attn: nn.Module | bool | None = None,
        feed_forward: nn.Module | None = None,
    ):
        super().__init__()
        ### BEGIN SOLUTION
        self.norm_first = norm_first
        # an injected sublayer is used as given (a test can plug in a known-good part); else build our own
        cross = cross_attn is not False  # False: decoder-only (GPT), no cross-attention sublayer at all
        self.self_attn = self_attn if self_attn is not None else MultiHeadAttention(d_model, n_heads, dropout)
        if not cross:
            self.cross_attn = None
        else:
            self.cross_attn = cross_attn if cross_attn is not None else CrossAttention(d_model, n_heads, dropout)
        self.feed_forward = feed_forward if feed_forward is not None else FeedForward(d_model, d_ff, dropout)
        # one LayerNorm and one dropout per sublayer, numbered in the order the sublayers run
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model) if cross else None  # the cross-attention's: absent without it
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout) if cross else None
        self.dropout3 = nn.Dropout(dropout)
        ### END SOLUTION

    def _sa_block(self, x: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        """Self-attention sublayer (before its residual). Shape: (B, T, D) -> (B, T, D)"""
        ### BEGIN SOLUTION
        out, _ = self.self_attn(x, x, x, allowed=allowed)  # (B, T, D): queries, keys, values all from x
        return self.dropout1(out)
        ### END SOLUTION

    def _ca_block(self, x: torch.Tensor, memory: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        """Cross-attention sublayer, before its residual. Shape: x (B, T, D), memory (B, S, D) -> (B, T, D)"""
        ### BEGIN SOLUTION
        out, _ = self.cross_attn(x, memory, allowed=allowed)  # (B, T, D): keys and values from the memory
        return self.dropout2(out)
        ### END SOLUTION

    def _ff_block(self, x: torch.Tensor) -> torch.Tensor:
        """Feed-forward sublayer (before its residual). Shape: (B, T, D) -> (B, T, D)"""
        ### BEGIN SOLUTION
        return self.dropout3(self.feed_forward(x))
        ### END SOLUTION

    def forward(self, x, memory=None, self_allowed=None, cross_allowed=None):
        """Run the sublayers (three, or two without cross-attention), each with its residual and LayerNorm.

        Shape:
            x: (B, T, D), memory: (B, S, D), or None when cross-attention is off -> (B, T, D)
        """
        ### BEGIN SOLUTION
        cross = self.cross_attn is not None  # False for a decoder-only layer (cross_attn=False)
        if cross and memory is None:
            raise ValueError("this layer has cross-attention: pass the encoder's memory")
        if self.norm_first:
            # pre-LN (not the paper's): normalise the sublayer's input, add its output to the raw stream
            x = x + self._sa_block(self.norm1(x), self_allowed)
            if cross:
                x = x + self._ca_block(self.norm2(x), memory, cross_allowed)
            x = x + self._ff_block(self.norm3(x))
        else:
            # post-LN (the paper): add the sublayer's output to its input, then normalise the sum
            x = self.norm1(x + self._sa_block(x, self_allowed))
            if cross:
                x = self.norm2(x + self._ca_block(x, memory, cross_allowed))
            x = self.norm3(x + self._ff_block(x))
        return x  # (B, T, D)
        ### END SOLUTION


def load_from_torch_decoder_layer(
    ours: DecoderLayer, torch_layer: nn.TransformerDecoderLayer
) -> DecoderLayer:
    """Copy an ``nn.TransformerDecoderLayer``'s weights into ours (its cross-attention is ``multihead_attn``).

    Shape:
        parameters only; ours must have the same d_model, n_heads and d_ff
    """
    load_from_torch_mha(ours.self_attn, torch_layer.self_attn)
    load_from_torch_mha(ours.cross_attn, torch_layer.multihead_attn)
    pairs = [
        (ours.feed_forward.linear1, torch_layer.linear1),
        (ours.feed_forward.linear2, torch_layer.linear2),
        (ours.norm1, torch_layer.norm1),
        (ours.norm2, torch_layer.norm2),
        (ours.norm3, torch_layer.norm3),
    ]
    with torch.no_grad():
        for mine, theirs in pairs:
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)
    return ours


def count_parameters(module: nn.Module) -> dict[str, int]:
    """Count trainable parameters per direct submodule, plus ``"total"``.

    Shape:
        module -> {submodule name: count, ..., "total": count}
    """
    counts = {name: sum(p.numel() for p in child.parameters()) for name, child in module.named_children()}
    counts["total"] = sum(p.numel() for p in module.parameters())
    return counts


def init_numpy_decoder_params(D: int, H: int, F: int, rng: np.random.Generator | None = None) -> dict:
    """Random parameters for ``numpy_decoder_layer``; weights are stored (in, out): a layer is ``x @ W + b``.

    NumPy only, like the layer (no torch: the checks refuse a ``torch.`` call).

    Each weight matrix is drawn separately from N(0, 1/fan_in) (standard deviation 1/sqrt(fan_in)), biases are
    zeros, LayerNorm gains ones and biases zeros; every number comes from ``rng``. Raises ValueError when D is not
    divisible by H.

    Keys: ``sa_`` (self-attention) and ``ca_`` (cross-attention) ``Wq, bq, Wk, bk, Wv, bv, Wo, bo``;
    ``ff_W1, ff_b1, ff_W2, ff_b2``; ``ln1_g, ln1_b`` ... ``ln3_g, ln3_b`` (LayerNorm gain and bias).
    ``rng=None`` draws fresh randomness (two calls differ).

    Shape:
        W*: (D, D), b*: (D,), ff_W1: (D, F), ff_b1: (F,), ff_W2: (F, D), ff_b2: (D,), ln*: (D,)
    """
    ### BEGIN SOLUTION
    if D % H != 0:
        raise ValueError(f"D={D} is not divisible by H={H}")
    rng = np.random.default_rng() if rng is None else rng

    def dense(n_in, n_out):
        # std 1/sqrt(n_in) keeps each output's variance near its input's (LeCun/Xavier-style)
        return rng.normal(0.0, 1.0 / np.sqrt(n_in), size=(n_in, n_out)), np.zeros(n_out)

    params = {}
    for prefix in ["sa", "ca"]:
        for name in ["q", "k", "v", "o"]:
            params[f"{prefix}_W{name}"], params[f"{prefix}_b{name}"] = dense(D, D)  # (D, D), (D,)
    params["ff_W1"], params["ff_b1"] = dense(D, F)  # (D, F), (F,)
    params["ff_W2"], params["ff_b2"] = dense(F, D)  # (F, D), (D,)
    for i in [1, 2, 3]:
        params[f"ln{i}_g"], params[f"ln{i}_b"] = np.ones(D), np.zeros(D)  # LayerNorm starts as the identity
    return params
    ### END SOLUTION


def numpy_decoder_layer(
    x: np.ndarray,
    memory: np.ndarray,
    params: dict,
    n_heads: int,
    self_allowed: np.ndarray | None = None,
    cross_allowed: np.ndarray | None = None,
    norm_first: bool = False,
) -> np.ndarray:
    """A decoder layer in NumPy alone: the same computation as ``DecoderLayer`` in eval mode (no dropout).

    NumPy only (no torch); the caller's ``x``, ``memory`` and ``params`` are unchanged.

    Shape:
        x: (B, T, D), memory: (B, S, D), self_allowed: (B, H, T, T)-broadcastable bool or None,
        cross_allowed: (B, H, T, S)-broadcastable bool or None -> (B, T, D)
    """
    ### BEGIN SOLUTION
    p = params

    def layer_norm(h, i):
        # normalise each position over D (biased variance and eps=1e-5, as nn.LayerNorm), then scale and shift
        mean = h.mean(axis=-1, keepdims=True)  # (B, T, 1)
        var = h.var(axis=-1, keepdims=True)  # (B, T, 1)
        return (h - mean) / np.sqrt(var + 1e-5) * p[f"ln{i}_g"] + p[f"ln{i}_b"]  # (B, T, D)

    def multi_head(h_q, h_kv, prefix, allowed):
        q = split_heads(h_q @ p[f"{prefix}_Wq"] + p[f"{prefix}_bq"], n_heads)  # (B, H, T, Dh)
        k = split_heads(h_kv @ p[f"{prefix}_Wk"] + p[f"{prefix}_bk"], n_heads)  # (B, H, S, Dh)
        v = split_heads(h_kv @ p[f"{prefix}_Wv"] + p[f"{prefix}_bv"], n_heads)  # (B, H, S, Dh)
        out, _ = scaled_dot_product_attention(q, k, v, allowed)  # (B, H, T, Dh)
        return merge_heads(out) @ p[f"{prefix}_Wo"] + p[f"{prefix}_bo"]  # (B, T, D)

    def feed_forward(h):
        # activations on the left, weights on the right: (B, T, D) @ (D, F), never W @ h
        hidden = np.maximum(h @ p["ff_W1"] + p["ff_b1"], 0.0)  # (B, T, F), ReLU
        return hidden @ p["ff_W2"] + p["ff_b2"]  # (B, T, D)

    if norm_first:
        # pre-LN: each sublayer reads a normalised copy; the residual stream itself is never normalised here
        h = layer_norm(x, 1)
        x = x + multi_head(h, h, "sa", self_allowed)
        x = x + multi_head(layer_norm(x, 2), memory, "ca", cross_allowed)
        x = x + feed_forward(layer_norm(x, 3))
    else:
        # post-LN: residual sum first, then normalise
        x = layer_norm(x + multi_head(x, x, "sa", self_allowed), 1)
        x = layer_norm(x + multi_head(x, memory, "ca", cross_allowed), 2)
        x = layer_norm(x + feed_forward(x), 3)
    return x  # (B, T, D)
    ### END SOLUTION


def numpy_params_from_torch(layer: DecoderLayer) -> dict:
    """Our ``DecoderLayer``'s weights as a ``numpy_decoder_layer`` parameter dict (Linear weights transposed).

    Shape:
        nn.Linear weight (out, in) -> W (in, out); biases and LayerNorm parameters unchanged
    """

    def as_numpy(t):
        return t.detach().cpu().numpy().copy()

    params = {}
    for prefix, attn in [("sa", layer.self_attn), ("ca", layer.cross_attn)]:
        for name, proj in [("q", attn.q_proj), ("k", attn.k_proj), ("v", attn.v_proj), ("o", attn.out_proj)]:
            params[f"{prefix}_W{name}"] = as_numpy(proj.weight).T  # (D_in, D_out)
            params[f"{prefix}_b{name}"] = as_numpy(proj.bias)
    for i, linear in [(1, layer.feed_forward.linear1), (2, layer.feed_forward.linear2)]:
        params[f"ff_W{i}"] = as_numpy(linear.weight).T  # (D, F) then (F, D)
        params[f"ff_b{i}"] = as_numpy(linear.bias)
    for i, norm in [(1, layer.norm1), (2, layer.norm2), (3, layer.norm3)]:
        params[f"ln{i}_g"] = as_numpy(norm.weight)
        params[f"ln{i}_b"] = as_numpy(norm.bias)
    return params


def run_with_torch_masks(
    layer: DecoderLayer,
    tgt: torch.Tensor,
    memory: torch.Tensor,
    tgt_mask: torch.Tensor | None = None,
    tgt_key_padding_mask: torch.Tensor | None = None,
    memory_key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run our ``DecoderLayer`` with ``nn.TransformerDecoderLayer``'s mask arguments (find the bug).

    Code written for PyTorch's layer passes its masks in PyTorch's polarity, True = **blocked**, all boolean:
    ``tgt_mask`` (T, T) blocks keys per query (usually the future, but any pattern), ``tgt_key_padding_mask``
    (B, T) and ``memory_key_padding_mask`` (B, S) are True at the padding; None blocks nothing. Given the same
    weights, the result is what ``nn.TransformerDecoderLayer`` returns for the same arguments: a key is hidden from
    a query when any of the masks blocks it, and padding is masked on the key axis only. ``layer`` gets the
    course's masks (True = may attend) as ``self_allowed`` and ``cross_allowed``; the caller's tensors are
    unchanged.

    Shape:
        tgt: (B, T, D), memory: (B, S, D), tgt_mask: (T, T) bool or None, tgt_key_padding_mask: (B, T) bool or
        None, memory_key_padding_mask: (B, S) bool or None -> (B, T, D)
    """
    T = tgt.shape[1]
    blocked = torch.zeros(T, T, dtype=torch.bool, device=tgt.device) if tgt_mask is None else tgt_mask  # (T, T)
    if tgt_key_padding_mask is not None:
        ### BEGIN SOLUTION
        blocked = blocked | tgt_key_padding_mask[:, None, None, :]  # (B, 1, T, T): blocked by either mask
        ### END SOLUTION
        ### BEGIN BUG
        # blocked = blocked & tgt_key_padding_mask[:, None, None, :]  # (B, 1, T, T)
        ### END BUG
    cross_blocked = None if memory_key_padding_mask is None else memory_key_padding_mask[:, None, None, :]
    # PyTorch's boundary: its masks say True = blocked, ours True = may attend, so each is inverted here, once
    return layer(tgt, memory, self_allowed=~blocked,
                 cross_allowed=None if cross_blocked is None else ~cross_blocked)  # (B, T, D)


# -- known mistakes ------------------------------------------------------------------------------------------------
# Realistic wrong answers, each this module's code with a few lines changed: (item, what is wrong, (old, new), ...),
# applied by autograder.course.mutants.patched (each old must occur exactly once in the item's code, so an edit above
# that
# moves a line breaks its mistake loudly). (item, what is wrong) alone is the bug a find-the-bug exercise's release
# shows. Every one must cost its own item and no other, in both layers of checks (tests/test_hidden_checks.py,
# tests/test_visible_catch_rate.py); whole wrong answers of another structure live in autograder/course/mutants/.

_HIDDEN = "        hidden = torch.relu(self.linear1(x))"
_JOINED = "        blocked = blocked | tgt_key_padding_mask[:, None, None, :]"  # the fixed line of the reference
MISTAKES = [
    ("FeedForward", "no ReLU: two linear maps collapse into one",
     (_HIDDEN, "        hidden = self.linear1(x)")),
    ("FeedForward", "GELU instead of the ReLU of the paper and of PyTorch",
     (_HIDDEN, "        hidden = torch.nn.functional.gelu(self.linear1(x))")),
    ("FeedForward", "dropout on the output instead of the hidden layer",
     ("        return self.linear2(self.dropout(hidden))", "        return self.dropout(self.linear2(hidden))")),
    ("DecoderLayer", "norm_first ignored: always post-LN",
     ("        self.norm_first = norm_first", "        self.norm_first = False  # the argument is never read")),
    ("DecoderLayer", "pre-LN adds the sublayer to the normalised x, not to the raw x",
     ("            x = x + self._sa_block(self.norm1(x), self_allowed)\n",
      "            h = self.norm1(x)\n            x = h + self._sa_block(h, self_allowed)\n"),
     ("                x = x + self._ca_block(self.norm2(x), memory, cross_allowed)\n",
      "                h = self.norm2(x)\n                x = h + self._ca_block(h, memory, cross_allowed)\n"),
     ("            x = x + self._ff_block(self.norm3(x))\n",
      "            h = self.norm3(x)\n            x = h + self._ff_block(h)\n")),
    ("DecoderLayer", "cross_allowed never passed: memory padding leaks",
     ("        out, _ = self.cross_attn(x, memory, allowed=allowed)", "        out, _ = self.cross_attn(x, memory)")),
    ("DecoderLayer", "the sublayers passed in are ignored: always builds its own",
     ("self.self_attn = self_attn if self_attn is not None else MultiHeadAttention(",
      "self.self_attn = MultiHeadAttention("),
     ("self.cross_attn = cross_attn if cross_attn is not None else CrossAttention(",
      "self.cross_attn = CrossAttention("),
     ("self.feed_forward = feed_forward if feed_forward is not None else FeedForward(",
      "self.feed_forward = FeedForward(")),
    ("DecoderLayer", "dropout1..3 built but never applied: no dropout on the sublayers' outputs",
     ("        return self.dropout1(out)", "        return out"),
     ("        return self.dropout2(out)", "        return out"),
     ("        return self.dropout3(self.feed_forward(x))", "        return self.feed_forward(x)")),
    ("DecoderLayer", "cross_attn=False still builds norm2: a decoder-only layer has a stray norm",
     ("        self.norm2 = nn.LayerNorm(d_model) if cross else None", "        self.norm2 = nn.LayerNorm(d_model)")),
    ("DecoderLayer", "decoder-only forward normalises the feed-forward's input with norm1 again",
     ("            x = x + self._ff_block(self.norm3(x))\n",
      "            x = x + self._ff_block((self.norm3 if cross else self.norm1)(x))\n")),
    ("init_numpy_decoder_params", "standard normal weights, not scaled by 1/sqrt(fan_in)",
     ("rng.normal(0.0, 1.0 / np.sqrt(n_in), size=(n_in, n_out))", "rng.standard_normal((n_in, n_out))")),
    ("init_numpy_decoder_params", "ff_W2 stored (D, F), the (out, in) layout of nn.Linear",
     ('params["ff_W2"], params["ff_b2"] = dense(F, D)',
      'params["ff_W2"], params["ff_b2"] = rng.normal(0.0, 1.0 / np.sqrt(F), size=(D, F)), np.zeros(D)')),
    ("init_numpy_decoder_params", "rng=None falls back to a fixed seed: every run is the same",
     ("np.random.default_rng() if rng is None", "np.random.default_rng(0) if rng is None")),
    ("init_numpy_decoder_params", "LayerNorm gains start at zero: every output starts at 0",
     ('params[f"ln{i}_g"], params[f"ln{i}_b"] = np.ones(D), np.zeros(D)',
      'params[f"ln{i}_g"], params[f"ln{i}_b"] = np.zeros(D), np.zeros(D)')),
    ("numpy_decoder_layer", "W2 @ h instead of h @ W2 in the feed-forward",
     ('np.maximum(h @ p["ff_W1"] + p["ff_b1"], 0.0)', 'np.maximum(p["ff_W1"] @ h + p["ff_b1"], 0.0)'),
     ('return hidden @ p["ff_W2"] + p["ff_b2"]', 'return p["ff_W2"] @ hidden + p["ff_b2"]')),
    ("numpy_decoder_layer", "LayerNorm statistics over the time axis, not over D",
     ("mean = h.mean(axis=-1, keepdims=True)", "mean = h.mean(axis=1, keepdims=True)"),
     ("var = h.var(axis=-1, keepdims=True)", "var = h.var(axis=1, keepdims=True)")),
    ("numpy_decoder_layer", "cross-attention's keys and values taken from x, not the memory",
     ('        x = x + multi_head(layer_norm(x, 2), memory, "ca", cross_allowed)\n',
      '        h = layer_norm(x, 2)\n        x = x + multi_head(h, h, "ca", None)\n'),
     ('x = layer_norm(x + multi_head(x, memory, "ca", cross_allowed), 2)',
      'x = layer_norm(x + multi_head(x, x, "ca", None), 2)')),
    ("numpy_decoder_layer", "no residual around the feed-forward",
     ("x = x + feed_forward(layer_norm(x, 3))", "x = feed_forward(layer_norm(x, 3))"),
     ("x = layer_norm(x + feed_forward(x), 3)", "x = layer_norm(feed_forward(x), 3)")),
    ("run_with_torch_masks",
     "tgt_mask and the target padding joined with &, in PyTorch's polarity: the future and the padding leak"),
    ("run_with_torch_masks",
     "a wrong fix: | with the padding on the query axis: real queries read padded keys",
     (_JOINED, "        blocked = blocked | tgt_key_padding_mask[:, None, :, None]")),
    ("run_with_torch_masks",
     "a wrong fix: | with the padding inverted first, as if it were is_real: real keys blocked, pads read",
     (_JOINED, "        blocked = blocked | ~tgt_key_padding_mask[:, None, None, :]")),
    ("run_with_torch_masks",
     "a wrong fix: the padding replaces tgt_mask instead of joining it: the future leaks",
     (_JOINED, "        blocked = tgt_key_padding_mask[:, None, None, :]")),
]
