"""Stand-in models for testing decoding code: next-token logits you choose, with no network and no training.

Both models implement the interface every decoding function of the course uses (lessons 08–09)::

    memory = model.encode(src_ids, src_is_real=None)                          # (B, S, D)
    logits = model.decode(tgt_ids, memory, src_is_real=None, tgt_is_real=None)  # (B, T, V)

where ``logits[b, t]`` scores the token that follows ``tgt_ids[b, :t + 1]`` (the decoder input starts with
BOS). Because the logits depend only on the prefix (and, for :class:`HashedLogitsModel`, on the real source
tokens), a check knows exactly which sequence greedy decoding, sampling or beam search must return.

- :class:`ScriptedModel` reads its logits from a table or a probability tree you write by hand: draw a tree on
  paper where greedy and beam search disagree and the check knows both answers.
- :class:`HashedLogitsModel` draws pseudo-random logits seeded by (seed, source, prefix): every batch row
  gets its own deterministic answer, so batched decoding can be compared with decoding one row at a time.
- :class:`HashedLM` is the decoder-only counterpart (lesson 11): ``model(ids, cache=None)`` with lesson 09's
  ``KVCache``, logits fixed by (seed, prefix); it keeps its past *only* in the cache it is handed and counts
  the positions it runs, so a check sees whether generation fed each token once.

Constructor arguments are plain data (ints, floats, nested lists and dicts, arrays), so a grading case written
as JSON can build either model. Neither model holds any solution: they only answer ``decode`` calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from decoder_course.conventions import BOS, EOS, PAD

__all__ = ["HashedLM", "HashedLogitsModel", "ScriptedModel", "sequence_log_prob", "text_codes"]


def _as_prefix(key: Any) -> tuple[int, ...]:
    """A table key (tuple, list, array or "3,5" string) as a tuple of ints."""
    if isinstance(key, str):
        return tuple(int(part) for part in key.replace(" ", "").split(",") if part)
    return tuple(int(token) for token in np.asarray(key, dtype=np.int64).reshape(-1))


def _check_decode_inputs(
    tgt_ids: torch.Tensor, memory: torch.Tensor, src_is_real, bos_id: int | None
) -> None:
    """Fail loudly, naming the idea, when a decoding function feeds the model wrong inputs."""
    if not isinstance(tgt_ids, torch.Tensor) or tgt_ids.dim() != 2:
        raise ValueError(
            f"decode expects tgt_ids as a (B, T) tensor of token ids, got {type(tgt_ids).__name__} "
            f"of shape {tuple(getattr(tgt_ids, 'shape', ()))}"
        )
    if tgt_ids.dtype.is_floating_point or tgt_ids.dtype == torch.bool:
        raise ValueError(f"decode expects integer token ids, got dtype {tgt_ids.dtype}")
    if tgt_ids.shape[1] == 0:
        raise ValueError("decode got an empty decoder input: it must start with the BOS token")
    if memory.shape[0] != tgt_ids.shape[0]:
        raise ValueError(
            f"memory has batch size {memory.shape[0]} but tgt_ids has {tgt_ids.shape[0]}: "
            "each decoder row needs its own row of memory (did you expand memory for the beams?)"
        )
    if src_is_real is not None and tuple(src_is_real.shape) != tuple(memory.shape[:2]):
        raise ValueError(
            f"src_is_real has shape {tuple(src_is_real.shape)} but memory is "
            f"{tuple(memory.shape)}: it must be (B, S), one row per memory row"
        )
    if bos_id is not None and bool((tgt_ids[:, 0] != bos_id).any()):
        raise ValueError(
            f"every decoder input must start with BOS (id {bos_id}); got first tokens "
            f"{tgt_ids[:, 0].tolist()}"
        )


class ScriptedModel(nn.Module):
    """A model whose next-token logits are read from a hand-written table or probability tree.

    The key of a table entry is the prefix generated so far, *after* BOS, as a tuple of ids: ``()`` scores the
    first generated token, ``(3,)`` the token after 3, and so on. Prefixes missing from the table get
    ``default_logits`` (by default: EOS with probability ≈ 1, so every path ends). The source is ignored
    except for its batch size: every batch row follows the same script.

    Args:
        vocab_size: V.
        table: ``{prefix: logits (V,)}`` or a list of ``[prefix, logits]`` pairs (JSON-friendly).
        tree: instead of a table, a probability tree ``{token: [prob, child]}`` (or a list of
            ``[token, prob, child]``), where ``child`` is a tree of the same kind for the next step or None.
            Unlisted tokens get probability ``floor``; the logits are the log-probabilities.
        bos_id, eos_id: the special ids; every decoder input must start with ``bos_id``.
        default_logits: logits (V,) for prefixes not in the table.
        floor: probability of the tokens a tree node does not list.

    Shape:
        encode: src_ids (B, S) -> memory (B, S, 1) zeros;
        decode: tgt_ids (B, T), memory (B, S, 1) -> logits (B, T, V) float32
    """

    def __init__(
        self,
        vocab_size: int,
        table: Any = None,
        tree: Any = None,
        *,
        bos_id: int = BOS,
        eos_id: int = EOS,
        default_logits: Any = None,
        floor: float = 1e-6,
    ):
        super().__init__()
        if (table is None) == (tree is None):
            raise ValueError("give exactly one of table= or tree=")
        self.vocab_size = int(vocab_size)
        self.bos_id, self.eos_id, self.floor = int(bos_id), int(eos_id), float(floor)
        if default_logits is None:
            # EOS almost surely: an unscripted prefix ends the sequence
            default_logits = self._logits_from_probs({self.eos_id: 1.0})
        self.default_logits = self._as_logits(default_logits)
        self.table: dict[tuple[int, ...], torch.Tensor] = {}
        if table is not None:
            pairs = table.items() if isinstance(table, Mapping) else table
            for prefix, logits in pairs:
                self.table[_as_prefix(prefix)] = self._as_logits(logits)
        else:
            self._add_tree(tree, ())

    @classmethod
    def from_tree(cls, tree: Any, vocab_size: int, **kwargs) -> ScriptedModel:
        """A :class:`ScriptedModel` from a probability tree ``{token: [prob, child]}`` (see the class doc)."""
        return cls(vocab_size, tree=tree, **kwargs)

    # -- building the table ---------------------------------------------------------------------------------
    def _as_logits(self, logits: Any) -> torch.Tensor:
        values = torch.as_tensor(np.asarray(logits, dtype=np.float32).reshape(-1))
        if values.numel() != self.vocab_size:
            raise ValueError(f"a logits vector must have V={self.vocab_size} entries, got {values.numel()}")
        return values

    def _logits_from_probs(self, probs: Mapping[int, float]) -> torch.Tensor:
        logits = torch.full((self.vocab_size,), math.log(self.floor))
        for token, prob in probs.items():
            if not 0.0 < float(prob) <= 1.0:
                raise ValueError(f"probability of token {token} must be in (0, 1], got {prob}")
            logits[int(token)] = math.log(float(prob))
        return logits

    def _add_tree(self, node: Any, prefix: tuple[int, ...]) -> None:
        if node is None:
            return
        if isinstance(node, Mapping):
            entries = [(int(token), *value) for token, value in node.items()]
        else:
            entries = [tuple(entry) for entry in node]
        self.table[prefix] = self._logits_from_probs({token: prob for token, prob, _ in entries})
        for token, _, child in entries:
            if token != self.eos_id:
                self._add_tree(child, prefix + (token,))

    # -- the model interface --------------------------------------------------------------------------------
    def next_logits(self, prefix: Iterable[int]) -> torch.Tensor:
        """Logits (V,) of the token after ``prefix`` (the generated tokens, without BOS)."""
        return self.table.get(_as_prefix(list(prefix)), self.default_logits)

    def encode(self, src_ids: torch.Tensor, src_is_real: torch.Tensor | None = None) -> torch.Tensor:
        """Memory of zeros: this model ignores the source.

        Shape:
            src_ids (B, S) -> memory (B, S, 1)
        """
        return torch.zeros(src_ids.shape[0], src_ids.shape[1], 1, device=src_ids.device)

    def decode(
        self,
        tgt_ids: torch.Tensor,
        memory: torch.Tensor,
        src_is_real: torch.Tensor | None = None,
        tgt_is_real: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits of every next token, read from the table by prefix.

        Shape:
            tgt_ids (B, T) starting with BOS, memory (B, S, 1) -> logits (B, T, V)
        """
        _check_decode_inputs(tgt_ids, memory, src_is_real, self.bos_id)
        rows = tgt_ids.detach().cpu().tolist()
        # position t scores the token after tgt_ids[b, :t + 1]: its key is that prefix without BOS
        logits = [torch.stack([self.next_logits(row[1 : t + 1]) for t in range(len(row))]) for row in rows]
        return torch.stack(logits).to(tgt_ids.device)  # (B, T, V)

    def forward(self, src_ids, tgt_ids, src_is_real=None, tgt_is_real=None) -> torch.Tensor:
        """``decode(tgt_ids, encode(src_ids))``.

        Shape:
            src_ids (B, S), tgt_ids (B, T) -> logits (B, T, V)
        """
        return self.decode(tgt_ids, self.encode(src_ids, src_is_real), src_is_real, tgt_is_real)


class HashedLogitsModel(nn.Module):
    """A model whose logits are pseudo-random but fixed by (seed, real source tokens, decoder prefix).

    Each batch row gets its own deterministic answer, so a batched decoder can be compared row by row with the
    same decoder run on one sequence at a time. Source padding matters: only the tokens marked real by
    ``src_is_real`` (given to ``encode``) enter the hash, so forgetting to pass the padding changes the
    answer. PAD and BOS always get ``special_logit`` (never chosen), so padding in an output is unambiguous;
    EOS gets ``eos_bias`` added, which controls how soon sequences end.

    Args:
        vocab_size: V.
        seed: selects the table of logits.
        scale: standard deviation of the random logits.
        eos_bias: added to the EOS logit (positive: shorter sequences).
        special_logit: the logit of PAD and BOS.

    Shape:
        encode: src_ids (B, S) -> memory (B, S, 1) (the real source ids, -1 at padding);
        decode: tgt_ids (B, T), memory (B, S, 1) -> logits (B, T, V) float32
    """

    def __init__(
        self,
        vocab_size: int,
        seed: int = 0,
        *,
        scale: float = 1.0,
        eos_bias: float = 0.0,
        bos_id: int = BOS,
        eos_id: int = EOS,
        pad_id: int = PAD,
        special_logit: float = -20.0,
    ):
        super().__init__()
        self.vocab_size, self.seed = int(vocab_size), int(seed)
        self.scale, self.eos_bias, self.special_logit = float(scale), float(eos_bias), float(special_logit)
        self.bos_id, self.eos_id, self.pad_id = int(bos_id), int(eos_id), int(pad_id)
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    def next_logits(self, src: Iterable[int], prefix: Iterable[int]) -> torch.Tensor:
        """Logits (V,) of the token after decoder input ``prefix`` (BOS included), given the real ``src``."""
        src, prefix = tuple(int(t) for t in src), tuple(int(t) for t in prefix)
        # the separator V is not a token id, so (src, prefix) pairs never collide
        key = (self.seed, len(src), *src, self.vocab_size, *prefix)
        if key not in self._cache:
            rng = np.random.default_rng(list(key))
            logits = torch.as_tensor(rng.standard_normal(self.vocab_size) * self.scale, dtype=torch.float32)
            logits[self.eos_id] += self.eos_bias
            logits[self.pad_id] = self.special_logit
            logits[self.bos_id] = self.special_logit
            self._cache[key] = logits
        return self._cache[key]

    def encode(self, src_ids: torch.Tensor, src_is_real: torch.Tensor | None = None) -> torch.Tensor:
        """The source ids themselves as memory, -1 where the source is padding.

        Shape:
            src_ids (B, S), src_is_real (B, S) or None -> memory (B, S, 1) float32
        """
        memory = src_ids.to(torch.float32)
        if src_is_real is not None:
            memory = memory.masked_fill(~src_is_real.bool(), -1.0)
        return memory.unsqueeze(-1)  # (B, S, 1)

    def decode(
        self,
        tgt_ids: torch.Tensor,
        memory: torch.Tensor,
        src_is_real: torch.Tensor | None = None,
        tgt_is_real: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pseudo-random logits for every position, fixed by the real source and the prefix.

        Shape:
            tgt_ids (B, T) starting with BOS, memory (B, S, 1) -> logits (B, T, V)
        """
        _check_decode_inputs(tgt_ids, memory, src_is_real, self.bos_id)
        sources = memory[..., 0].detach().cpu().tolist()
        rows = tgt_ids.detach().cpu().tolist()
        logits = []
        for src, row in zip(sources, rows, strict=True):
            real_src = [s for s in src if s >= 0]  # padding was stored as -1 by encode
            logits.append(torch.stack([self.next_logits(real_src, row[: t + 1]) for t in range(len(row))]))
        return torch.stack(logits).to(tgt_ids.device)  # (B, T, V)

    def forward(self, src_ids, tgt_ids, src_is_real=None, tgt_is_real=None) -> torch.Tensor:
        """``decode(tgt_ids, encode(src_ids, src_is_real))``.

        Shape:
            src_ids (B, S), tgt_ids (B, T) -> logits (B, T, V)
        """
        return self.decode(tgt_ids, self.encode(src_ids, src_is_real), src_is_real, tgt_is_real)


class HashedLM(nn.Module):
    """A decoder-only stand-in language model: logits pseudo-random but fixed by (seed, the tokens so far).

    ``forward(ids)`` scores every position of ``ids`` (B, T) from scratch. ``forward(ids, cache)`` with a
    ``KVCache`` of ``len(model.layers)`` slots treats ``ids`` as the positions after those already cached: it
    keeps its past *only* in the cache (each layer's "keys" are the token ids), so feeding a token twice, or a
    prompt again, changes the answer, exactly as it would for a real model with a cache. ``positions_run``
    counts the positions scored per row (a forward on (B, T) adds T); ``calls`` counts forwards. More than
    ``max_len`` positions raise ``ValueError``, as ``GPT`` does.

    Args:
        vocab_size: V.
        seed: selects the table of logits.
        n_layers: the number of cache slots (``layers`` is that many ``nn.Identity``).
        max_len: the most positions a sequence may have.
        scale: standard deviation of the random logits.

    Shape:
        ids (B, T) int -> logits (B, T, V) float32 on ids' device
    """

    def __init__(self, vocab_size: int, seed: int = 0, *, n_layers: int = 2, max_len: int = 64, scale: float = 1.0):
        super().__init__()
        self.vocab_size, self.seed, self.max_len, self.scale = int(vocab_size), int(seed), int(max_len), float(scale)
        self.layers = nn.ModuleList(nn.Identity() for _ in range(int(n_layers)))
        self.positions_run, self.calls = 0, 0
        self._table: dict[tuple[int, ...], torch.Tensor] = {}

    def next_logits(self, prefix: Iterable[int]) -> torch.Tensor:
        """Logits (V,) of the token after ``prefix`` (the tokens so far, at least one)."""
        key = (self.seed, self.vocab_size, *(int(t) for t in prefix))
        if key not in self._table:
            rng = np.random.default_rng(list(key))
            self._table[key] = torch.as_tensor(rng.standard_normal(self.vocab_size) * self.scale, dtype=torch.float32)
        return self._table[key]

    def forward(self, ids: torch.Tensor, cache=None) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype.is_floating_point:
            raise ValueError(f"the model expects ids as a (B, T) integer tensor, got {type(ids).__name__} of shape "
                             f"{tuple(getattr(ids, 'shape', ()))}")
        B, T = ids.shape
        if T == 0:
            raise ValueError("the model got no new token: ids has shape (B, 0)")
        past = torch.zeros(B, 0, dtype=torch.long)
        if cache is not None:
            if len(getattr(cache, "keys", ())) != len(self.layers):
                raise ValueError(f"the cache should have one slot per layer: KVCache(len(model.layers)) = "
                                 f"KVCache({len(self.layers)})")
            new = ids.detach().cpu().to(torch.float32)[:, None, :, None]  # (B, 1, T, 1): tokens as "keys"
            for i in range(len(self.layers)):
                k_all, _ = cache.update(new, new, i)  # every layer sees the same past
            past = k_all[:, 0, :-T, 0].long() if k_all.shape[2] > T else past  # (B, S - T): what came before
            if k_all.shape[0] != B:
                raise ValueError(f"the cache holds {k_all.shape[0]} rows but ids has {B}")
        tokens = torch.cat([past, ids.detach().cpu().long()], dim=1).tolist()  # (B, S) the whole sequence
        if len(tokens[0]) > self.max_len:
            raise ValueError(f"{len(tokens[0])} positions, more than max_len={self.max_len}")
        start = len(tokens[0]) - T
        self.positions_run += T  # per row: a batch runs its rows side by side
        self.calls += 1
        logits = [torch.stack([self.next_logits(row[: start + t + 1]) for t in range(T)]) for row in tokens]
        return torch.stack(logits).to(ids.device)  # (B, T, V)


@torch.no_grad()
def sequence_log_prob(
    model: nn.Module,
    src_ids: torch.Tensor,
    tokens: torch.Tensor,
    bos_id: int = BOS,
    eos_id: int = EOS,
    src_is_real: torch.Tensor | None = None,
) -> torch.Tensor:
    """Total log-probability the model gives each generated sequence, up to and including its first EOS.

    ``tokens`` are generated ids without BOS; positions after the first EOS (padding) are not scored.

    Shape:
        src_ids (B, S), tokens (B, L) -> (B,) float
    """
    tokens = torch.as_tensor(tokens)
    B = tokens.shape[0]
    memory = model.encode(src_ids, src_is_real)
    tgt_in = torch.cat([torch.full((B, 1), bos_id, dtype=tokens.dtype, device=tokens.device), tokens], 1)
    logp = model.decode(tgt_in[:, :-1], memory, src_is_real=src_is_real).float().log_softmax(-1)  # (B, L, V)
    picked = logp.gather(-1, tokens[..., None]).squeeze(-1)  # (B, L)
    is_eos = tokens == eos_id
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # (B, L): strictly after the first EOS
    return picked.masked_fill(after_eos, 0.0).sum(-1)


def text_codes(text: str) -> np.ndarray:
    """A string's code points as an int64 array: how a check hands text (a tokenizer's ``decode``) back as data.

    Raises ``TypeError`` for anything that is not a ``str`` (bytes included: ``decode`` must return text).

    Shape:
        str of length L -> (L,) int64
    """
    if type(text) is not str:
        raise TypeError(f"expected a str, got {type(text).__name__}")
    return np.array([ord(c) for c in text], dtype=np.int64)
