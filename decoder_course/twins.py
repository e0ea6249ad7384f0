"""PyTorch twins of the course's modules: the same weights under PyTorch's parameter names.

The course's attention keeps four projections, ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``;
``nn.MultiheadAttention`` packs the first three into one ``in_proj`` of shape ``(3 D, D)``, q then k then v. A
course layer and PyTorch's layer therefore differ only by parameter names and that packing::

    theirs = nn.TransformerDecoderLayer(D, H, F, batch_first=True)
    theirs.load_state_dict(to_torch(ours.state_dict(), "decoder"))   # ours -> PyTorch
    ours.load_state_dict(from_torch(theirs.state_dict(), "decoder"))  # PyTorch -> ours

``kind`` is ``"attention"`` (``MultiHeadAttention`` / ``CrossAttention`` ↔ ``nn.MultiheadAttention``),
``"encoder"`` (``EncoderLayer`` ↔ ``nn.TransformerEncoderLayer``) or ``"decoder"`` (``DecoderLayer`` ↔
``nn.TransformerDecoderLayer``). Values may be tensors or NumPy arrays; they are not copied. Entries with no twin on
the other side (a buffer a student added, say) are left out.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

QKV = ("q_proj", "k_proj", "v_proj")
# the course's attention submodules -> PyTorch's, per kind of layer
_ATTENTIONS = {"attention": {"": ""}, "encoder": {"self_attn.": "self_attn."},
               "decoder": {"self_attn.": "self_attn.", "cross_attn.": "multihead_attn."}}


def _kind(kind: str) -> dict[str, str]:
    if kind not in _ATTENTIONS:
        raise ValueError(f"kind is one of {sorted(_ATTENTIONS)}, not {kind!r}")
    return _ATTENTIONS[kind]


def _cat(parts):
    return np.concatenate(parts) if isinstance(parts[0], np.ndarray) else torch.cat(parts)


def _chunk(packed, n: int = 3):
    return np.split(packed, n) if isinstance(packed, np.ndarray) else packed.chunk(n)


def to_torch(state: dict, kind: str) -> dict:
    """A course state dict under PyTorch's names (``in_proj`` packed from q, k, v)."""
    attentions, mapped = _kind(kind), {}
    for ours, theirs in attentions.items():
        for what in ("weight", "bias"):
            mapped[f"{theirs}in_proj_{what}"] = _cat([state[f"{ours}{p}.{what}"] for p in QKV])  # (3 D, ...)
            mapped[f"{theirs}out_proj.{what}"] = state[f"{ours}out_proj.{what}"]
    for key, value in state.items():  # the layers' feed-forward and norms; any other entry has no twin
        if kind != "attention" and key.startswith(("feed_forward.linear1.", "feed_forward.linear2.", "norm")):
            mapped[key.removeprefix("feed_forward.")] = value
    return mapped


def from_torch(state: dict, kind: str) -> dict:
    """A PyTorch state dict under the course's names (``in_proj`` split into q, k, v)."""
    attentions, mapped = _kind(kind), {}
    for ours, theirs in attentions.items():
        for what in ("weight", "bias"):
            for proj, part in zip(QKV, _chunk(state[f"{theirs}in_proj_{what}"]), strict=True):  # (D, ...) each
                mapped[f"{ours}{proj}.{what}"] = part
            mapped[f"{ours}out_proj.{what}"] = state[f"{theirs}out_proj.{what}"]
    for key, value in state.items():
        if kind != "attention" and key.startswith(("linear1.", "linear2.")):
            mapped[f"feed_forward.{key}"] = value
        elif kind != "attention" and key.startswith("norm"):
            mapped[key] = value
    return mapped


def torch_twin(ours_state: dict, kind: str, n_heads: int, *, d_ff: int | None = None, norm_first: bool = False,
               dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> nn.Module:
    """PyTorch's own module of ``kind`` holding the weights of a course state dict, in eval mode (``dropout``: the
    attention's, for training mode).

    ``d_ff`` is needed for the layers; the width is read from the weights.
    """
    D = ours_state[f"{next(iter(_kind(kind)))}q_proj.weight"].shape[-1]
    if kind != "attention" and d_ff is None:
        raise ValueError(f"a {kind} layer's twin needs d_ff")
    with torch.random.fork_rng():  # its initial weights, overwritten below, leave the caller's random state alone
        if kind == "attention":
            theirs = nn.MultiheadAttention(D, n_heads, dropout=dropout, batch_first=True, dtype=dtype)
        else:
            layer = nn.TransformerEncoderLayer if kind == "encoder" else nn.TransformerDecoderLayer
            theirs = layer(D, n_heads, d_ff, batch_first=True, norm_first=norm_first, dtype=dtype)
    theirs.load_state_dict({key: torch.as_tensor(np.asarray(value) if not torch.is_tensor(value) else value,
                                                 dtype=dtype).detach().clone()
                            for key, value in to_torch(ours_state, kind).items()})
    return theirs.eval()
