"""Reference for lesson 11-gpt (PyTorch): a decoder-only language model, from bytes to generated text.

Four pieces, in the order the lesson builds them:

- a **byte-level BPE tokenizer** (Sennrich et al. 2016 on bytes, as GPT-2): the 256 byte values are the first
  tokens, and ``train_bpe`` learns merges, each fusing the most frequent adjacent pair into one new token;
  ``BPETokenizer`` replays them. Every text round-trips exactly, because every token is a byte string;
- ``GPT``: token + learned position embeddings, a stack of lesson 05's ``DecoderLayer`` with cross-attention
  switched off (the same class: ``cross_attn=False``), pre-LN with a final LayerNorm, and an output projection
  tied to the token embedding. With copied weights it equals a stack of ``nn.TransformerEncoderLayer
  (batch_first=True, norm_first=True)`` run with a causal mask: an "encoder" layer that cannot see the future
  *is* a decoder-only layer;
- ``lm_batches``: random windows of a token stream, the targets shifted by one;
- ``generate``: temperature and top-k sampling with lesson 09's ``KVCache``: the prompt fills the cache once,
  then each step runs one new position;
- ``generate_long``, a find-the-bug exercise (autograder.course.bugs): given code that calls the student's ``generate``
  in rounds to write past ``max_len``, with one mistake in the tokens it hands each round.

Departures from GPT-2, marked: ReLU instead of GELU in the feed-forward (lesson 05's block), biases everywhere
(GPT-2 has them too; many newer models drop them), no pre-tokenising regex (merges may cross word boundaries).
"""

from collections import Counter

import torch
from torch import nn

from autograder.course.reference.decoder_layer import DecoderLayer, FeedForward  # noqa: F401 - given in the lesson
from autograder.course.reference.generation import top_k_filter
from autograder.course.reference.kv_cache import KVCache, cached_causal_mask
from autograder.course.reference.multi_head import MultiHeadAttention, attention, merge_heads, split_heads  # noqa: F401


# -- given helpers -------------------------------------------------------------------------------------------------
def pair_counts(ids: list[int]) -> Counter:
    """How often each adjacent pair occurs, counted at every position (``[5, 5, 5]`` holds ``(5, 5)`` twice).

    The counter's keys are in order of first occurrence, so ``max(counts, key=counts.get)`` breaks ties in
    favour of the pair that occurs first.

    Shape:
        ids: list of N ints -> Counter {(a, b): count}
    """
    return Counter(zip(ids, ids[1:]))


def merge_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every occurrence of ``pair`` by ``new_id``, left to right without overlaps (``[5, 5, 5]`` with
    ``(5, 5)`` -> ``[new, 5]``); a new list, the input is unchanged.

    Shape:
        ids: list of N ints -> list of at most N ints
    """
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)  # the pair becomes one token; skip both of its halves
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def causal_allowed(T: int, device=None) -> torch.Tensor:
    """Lesson 01's causal mask in PyTorch: query t may attend to keys 0 .. t.

    Shape:
        -> (T, T) bool, True = may attend
    """
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


# -- the tokenizer -------------------------------------------------------------------------------------------------
def train_bpe(text: str, vocab_size: int) -> list[tuple[int, int]]:
    """Learn byte-level BPE merges from ``text``: ``merges[i]`` is the pair fused into the new token ``256 + i``.

    Start from the UTF-8 bytes of ``text`` (ids 0..255). Each round, count the adjacent pairs of the current
    sequence (``pair_counts``: overlapping, at every position), take the most frequent one, ties going to the
    pair that occurs **first** in the current sequence, record it and merge it everywhere (``merge_pair``).
    Stop after ``vocab_size - 256`` merges, or earlier when the sequence has no pair left (fewer than two
    tokens). ``vocab_size <= 256`` learns no merge.

    Shape:
        text: str, vocab_size: int -> list of at most max(vocab_size - 256, 0) pairs (a, b) of ints
    """
    ### BEGIN SOLUTION
    ids = list(text.encode("utf-8"))  # the 256 byte values are the first 256 tokens
    merges = []
    for new_id in range(256, vocab_size):
        counts = pair_counts(ids)
        if not counts:
            break  # fewer than two tokens left: nothing to merge
        best = max(counts, key=counts.get)  # the most frequent pair; on a tie, the first one seen
        ids = merge_pair(ids, best, new_id)
        merges.append(best)
    return merges
    ### END SOLUTION


class BPETokenizer:
    """Encode text into BPE token ids and decode them back, from the merges ``train_bpe`` learned.

    ``vocab[i]`` is the byte string of token ``i``: the 256 single bytes, then ``vocab[256 + k] =
    vocab[a] + vocab[b]`` for ``merges[k] = (a, b)``; ``vocab_size == 256 + len(merges)``.

    ``encode`` turns the text into its UTF-8 bytes and applies the merges **in the order they were learned**,
    each everywhere, left to right without overlaps (as ``merge_pair``), so it gives exactly the sequence
    training produced on the training text. ``decode`` joins the tokens' bytes and decodes them as UTF-8 with
    ``errors="replace"``: any list of valid ids decodes (a cut multi-byte character becomes U+FFFD), and
    ``decode(encode(text)) == text`` for every string. An id outside ``0 .. vocab_size - 1`` raises.

    Shape:
        encode: str -> list of ints; decode: list (or 1-D tensor) of ints -> str
    """

    def __init__(self, merges: list[tuple[int, int]]):
        ### BEGIN SOLUTION
        self.merges = [(int(a), int(b)) for a, b in merges]
        self.ranks = {pair: k for k, pair in enumerate(self.merges)}  # pair -> merge index (lower = earlier)
        self.vocab = [bytes([b]) for b in range(256)]  # token id -> its bytes
        for a, b in self.merges:
            self.vocab.append(self.vocab[a] + self.vocab[b])  # token 256 + k is the two halves' bytes joined
        ### END SOLUTION

    @property
    def vocab_size(self) -> int:
        """256 byte tokens plus one per merge."""
        ### BEGIN SOLUTION
        return len(self.vocab)
        ### END SOLUTION

    def encode(self, text: str) -> list[int]:
        """Text -> token ids: its UTF-8 bytes, then the merges in the order they were learned.

        Shape:
            str -> list of ints in 0 .. vocab_size - 1
        """
        ### BEGIN SOLUTION
        # The sequence as a string whose characters are token ids (chr(id)): str.replace merges left to right
        # without overlaps, exactly as merge_pair does, but in C (a hundred times faster on a long text).
        seq = text.encode("utf-8").decode("latin-1")  # one character per byte, chr(0) .. chr(255)
        for k, (a, b) in enumerate(self.merges):
            # merge k only ever needs tokens made by merges 0 .. k-1, so replaying in order reproduces training
            seq = seq.replace(chr(a) + chr(b), chr(256 + k))
        return [ord(c) for c in seq]
        ### END SOLUTION

    def decode(self, ids) -> str:
        """Token ids -> text: the tokens' bytes joined, decoded as UTF-8 with ``errors="replace"``.

        Shape:
            list (or 1-D tensor) of ints -> str
        """
        ### BEGIN SOLUTION
        ids = [int(i) for i in ids]  # a tensor's elements, or plain ints
        if any(i < 0 or i >= len(self.vocab) for i in ids):
            raise ValueError(f"token ids must be in 0 .. {len(self.vocab) - 1}")
        data = b"".join(self.vocab[i] for i in ids)
        return data.decode("utf-8", errors="replace")  # a cut multi-byte character becomes U+FFFD
        ### END SOLUTION


# -- the model -----------------------------------------------------------------------------------------------------
class GPT(nn.Module):
    """A decoder-only Transformer language model: ``logits[b, t]`` scores the token after ``ids[b, :t + 1]``.

    Submodules (their names are part of the contract): ``tok_embed`` ``nn.Embedding(V, D)``, ``pos_embed``
    ``nn.Embedding(max_len, D)`` (learned positions: row t is added at position t), ``dropout``, ``layers``
    (``n_layers`` of ``DecoderLayer(D, H, F, dropout, norm_first=True, cross_attn=False)``), ``norm`` (the final
    ``nn.LayerNorm(D)`` pre-LN needs) and ``out_proj`` ``nn.Linear(D, V, bias=False)`` whose weight **is**
    ``tok_embed.weight`` (tied: one (V, D) matrix embeds and scores tokens). Both embeddings start at
    N(0, 0.02²), as GPT-2's: with PyTorch's N(0, 1) a tied output would start with logits of size ~√D.

    ``forward(ids)`` runs every position with the causal mask (query t sees keys 0 .. t). ``forward(ids,
    cache)`` with a lesson 09 ``KVCache`` (one slot per layer) runs only the new positions ``cache.length ..
    cache.length + T - 1``, any number of them per call: each layer's self-attention appends its keys and values to
    the cache and attends over everything cached (a (T, S) mask aligned to absolute positions), so prefilling a
    prompt, then feeding chunks of several tokens or one token at a time, gives the logits of the full forward.
    More than ``max_len`` positions raise ``ValueError``; ``self.max_len`` keeps the constructor's ``max_len``
    (``generate`` and ``generate_long`` read it). Built from your ``DecoderLayer``: ``nn.TransformerEncoderLayer``,
    ``nn.TransformerEncoder``, ``nn.TransformerDecoderLayer`` and ``nn.Transformer`` are not to be used (the checks
    refuse them).

    Shape:
        ids: (B, T) int64 with cache.length + T <= max_len -> logits (B, T, V) float32
    """

    def __init__(self, vocab: int, d_model: int, n_heads: int, d_ff: int, n_layers: int, max_len: int,
                 dropout: float = 0.0):
        super().__init__()
        ### BEGIN SOLUTION
        self.max_len = max_len
        self.tok_embed = nn.Embedding(vocab, d_model)  # (V, D)
        self.pos_embed = nn.Embedding(max_len, d_model)  # (max_len, D): one learned vector per position
        self.dropout = nn.Dropout(dropout)
        # lesson 05's layer without its cross-attention: self-attention + feed-forward, pre-LN
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=True, cross_attn=False) for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)  # pre-LN leaves the stream unnormalised: normalise once at the end
        self.out_proj = nn.Linear(d_model, vocab, bias=False)  # D -> V
        self.out_proj.weight = self.tok_embed.weight  # tied: the same Parameter (V, D)
        nn.init.normal_(self.tok_embed.weight, std=0.02)  # small, or tied logits start ~sqrt(D) large
        nn.init.normal_(self.pos_embed.weight, std=0.02)
        ### END SOLUTION

    def forward(self, ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits of the next token at every position of ``ids`` (with a cache: at the new positions).

        Shape:
            ids: (B, T) -> logits (B, T, V)
        """
        ### BEGIN SOLUTION
        T = ids.shape[1]
        start = 0 if cache is None else cache.length  # absolute position of ids[:, 0]
        if start + T > self.max_len:
            raise ValueError(f"{start + T} positions, but the model has learned only max_len={self.max_len}")
        positions = torch.arange(start, start + T, device=ids.device)  # (T,)
        x = self.dropout(self.tok_embed(ids) + self.pos_embed(positions))  # (B, T, D)
        if cache is None:
            allowed = causal_allowed(T, ids.device)  # (T, T): no peeking at later tokens
            for layer in self.layers:
                x = layer(x, self_allowed=allowed)  # memory=None: the layer has no cross-attention
        else:
            for i, layer in enumerate(self.layers):
                x = self._cached_layer(layer, x, cache, i, positions)
        return self.out_proj(self.norm(x))  # (B, T, V)
        ### END SOLUTION

    @staticmethod
    def _cached_layer(layer: DecoderLayer, x: torch.Tensor, cache: KVCache, i: int,
                      positions: torch.Tensor) -> torch.Tensor:
        """``layer`` (pre-LN, no cross-attention) on new positions, its keys/values appended to ``cache[i]``.

        Shape:
            x: (B, T_new, D), positions: (T_new,) absolute -> (B, T_new, D)
        """
        ### BEGIN SOLUTION
        # the same wiring as DecoderLayer.forward with norm_first=True, the self-attention opened up
        attn, h = layer.self_attn, layer.norm1(x)
        q = split_heads(attn.q_proj(h), attn.n_heads)  # (B, H, T_new, Dh)
        k, v = cache.update(split_heads(attn.k_proj(h), attn.n_heads),
                            split_heads(attn.v_proj(h), attn.n_heads), i)  # (B, H, S, Dh): every position so far
        allowed = cached_causal_mask(positions, k.shape[2])  # (T_new, S): key s allowed when s <= position
        out, _ = attention(q, k, v, allowed, dropout=attn.dropout)  # (B, H, T_new, Dh)
        x = x + layer.dropout1(attn.out_proj(merge_heads(out)))  # (B, T_new, D)
        return x + layer._ff_block(layer.norm3(x))
        ### END SOLUTION


def load_from_torch_encoder_layers(model: GPT, torch_layers) -> GPT:
    """Copy a list of ``nn.TransformerEncoderLayer`` (norm_first=True) into ``model.layers``: self-attention,
    feed-forward, and their norms (the encoder layer's ``norm2`` is our ``norm3``, the feed-forward's).

    Shape:
        parameters only; the same D, H, F and number of layers
    """
    from autograder.course.reference.multi_head import load_from_torch_mha

    with torch.no_grad():
        for ours, theirs in zip(model.layers, torch_layers, strict=True):
            load_from_torch_mha(ours.self_attn, theirs.self_attn)
            for mine, other in [(ours.feed_forward.linear1, theirs.linear1), (ours.feed_forward.linear2,
                                                                               theirs.linear2),
                                (ours.norm1, theirs.norm1), (ours.norm3, theirs.norm2)]:
                mine.weight.copy_(other.weight)
                mine.bias.copy_(other.bias)
    return model


# -- data and generation -------------------------------------------------------------------------------------------
def lm_batches(ids: torch.Tensor, block: int, batch: int,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of next-token training windows from a token stream.

    Draw ``batch`` start offsets with ``torch.randint(0, N - block, (batch,), generator=generator)`` (every
    window and its one-token shift fit inside the stream: the last start is ``N - block - 1``); row r of
    ``inputs`` is ``ids[o_r : o_r + block]`` and of ``targets`` ``ids[o_r + 1 : o_r + block + 1]``, so
    ``targets[:, t]`` is the token that follows ``inputs[:, t]``. A stream with ``N <= block`` raises
    ``ValueError``. Both come back on ``ids``'s device, int64; ``ids`` is unchanged.

    Shape:
        ids: (N,) int -> inputs (batch, block), targets (batch, block), int64
    """
    ### BEGIN SOLUTION
    N = ids.shape[0]
    if N <= block:
        raise ValueError(f"a stream of {N} tokens has no window of {block} tokens plus a target")
    starts = torch.randint(0, N - block, (batch,), generator=generator)  # (batch,) in 0 .. N - block - 1
    offsets = starts[:, None] + torch.arange(block)  # (batch, block): the positions of each window
    offsets = offsets.to(ids.device)
    inputs = ids[offsets].long()  # (batch, block)
    targets = ids[offsets + 1].long()  # (batch, block): the next token of every input position
    return inputs, targets
    ### END SOLUTION


@torch.no_grad()
def generate(model: nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Continue each prompt by ``max_new_tokens`` sampled tokens, running the model once per token with a cache.

    One ``KVCache`` with a slot per layer (``len(model.layers)``); ``model(prompt_ids, cache)`` fills it with the
    whole prompt once; then each new token alone is fed with the cache (``model(next_ids, cache)``, (B, 1)):
    never the whole sequence again. Per step, from the last position's logits: ``temperature == 0`` takes the
    argmax (greedy); otherwise divide by the temperature, keep the ``top_k`` largest (lesson 08's ``top_k_filter``, when
    ``top_k`` is not None), and draw one token per row with ``torch.multinomial(softmax, 1,
    generator=generator)``, so a seeded generator reproduces the draws whatever the global random state.
    Needs ``T + max_new_tokens <= model.max_len`` (``GPT`` keeps its ``max_len`` as an attribute for this). The
    caller puts the model in eval mode (``model.eval()``, as the lesson's cells do) before calling: ``generate``
    leaves the mode as it is, and ``prompt_ids`` is unchanged.

    Shape:
        prompt_ids: (B, T) int64, T >= 1 -> ids (B, T + max_new_tokens): the prompt, then the new tokens
    """
    ### BEGIN SOLUTION
    cache = KVCache(len(model.layers))
    ids = prompt_ids
    logits = model(prompt_ids, cache)[:, -1]  # (B, V): the prompt runs once, filling the cache
    for step in range(max_new_tokens):
        if temperature == 0:
            next_id = logits.argmax(-1)  # (B,): greedy
        else:
            scores = logits.float() / temperature  # < 1 sharpens, > 1 flattens
            if top_k is not None:
                scores = top_k_filter(scores, top_k)  # -inf outside the k best: probability exactly 0
            next_id = torch.multinomial(scores.softmax(-1), 1, generator=generator).squeeze(-1)  # (B,)
        ids = torch.cat([ids, next_id[:, None]], dim=1)  # (B, T + step + 1)
        if step + 1 < max_new_tokens:
            logits = model(next_id[:, None], cache)[:, -1]  # one new position; the past comes from the cache
    return ids
    ### END SOLUTION


@torch.no_grad()
def generate_long(model: nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int, keep: int,
                  temperature: float = 1.0, top_k: int | None = None,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Write past the model's ``max_len`` with your ``generate``, in rounds (find the bug).

    A model with learned positions has none past ``max_len - 1``, so one cache holds at most ``max_len``
    positions. Each round therefore starts a fresh ``generate`` call whose prompt is the **last** ``keep`` tokens
    of the sequence so far (all of it while it is shorter): the oldest tokens are forgotten, the latest are always
    seen. The round asks for as many new tokens as fit, ``min(model.max_len - len(prompt), tokens still due)``,
    passes ``temperature``, ``top_k`` and ``generator`` on unchanged, and its new tokens are appended to the
    sequence. Needs ``1 <= keep < model.max_len``; ``prompt_ids`` is unchanged.

    Shape:
        prompt_ids: (B, T) int64 -> ids (B, T + max_new_tokens): the whole prompt, then the new tokens
    """
    T = prompt_ids.shape[1]
    ids = prompt_ids  # (B, T): grows by each round's new tokens
    while ids.shape[1] < T + max_new_tokens:
        ### BEGIN SOLUTION
        context = ids[:, -keep:]  # (B, <= keep): the latest tokens, the only ones this round sees
        ### END SOLUTION
        ### BEGIN BUG
        # context = ids[:, :keep]  # (B, <= keep)
        ### END BUG
        n = min(model.max_len - context.shape[1], T + max_new_tokens - ids.shape[1])  # new tokens that fit
        out = generate(model, context, n, temperature, top_k, generator)  # (B, len(context) + n)
        ids = torch.cat([ids, out[:, context.shape[1]:]], dim=1)  # append this round's new tokens only
    return ids


# -- known mistakes ------------------------------------------------------------------------------------------------
# Realistic wrong answers, each this module's code with a few lines changed: (item, what is wrong, (old, new), ...),
# applied by autograder.course.mutants.patched (each old must occur exactly once in the item's code, so an edit above
# that
# moves a line breaks its mistake loudly). (item, what is wrong) alone is the bug a find-the-bug exercise's release
# shows. Every one must cost its own item and no other, in both layers of checks (tests/test_hidden_checks.py,
# tests/test_visible_catch_rate.py); whole wrong answers of another structure live in autograder/course/mutants/.
MISTAKES = [
    ("train_bpe", "ties go to the smallest pair, not the first one",
     ("best = max(counts, key=counts.get)",
      "top = max(counts.values())\n        best = min(pair for pair, n in counts.items() if n == top)")),
    ("train_bpe", "one merge too few: range(257, vocab_size)",
     ("range(256, vocab_size)", "range(257, vocab_size)"),
     ("merge_pair(ids, best, new_id)", "merge_pair(ids, best, new_id - 1)")),
    ("train_bpe", "starts from the text's code points (ord(c)), not its UTF-8 bytes",
     ('ids = list(text.encode("utf-8"))  # the 256 byte values',
      "ids = [ord(c) for c in text]  # the 256 byte values")),
    ("BPETokenizer", "decodes token by token: a character split across tokens becomes U+FFFD",
     ('data = b"".join(self.vocab[i] for i in ids)\n        return data.decode("utf-8", errors="replace")',
      'return "".join(self.vocab[i].decode("utf-8", errors="replace") for i in ids)')),
    ("BPETokenizer", "applies the merges from the last learned to the first",
     ("for k, (a, b) in enumerate(self.merges):", "for k, (a, b) in reversed(list(enumerate(self.merges))):")),
    ("BPETokenizer", "vocab_size counts the merges only",
     ("return len(self.vocab)", "return len(self.merges)")),
    ("GPT", "no causal mask: every position sees the whole sequence",
     ("x = layer(x, self_allowed=allowed)", "x = layer(x)"),
     ("attention(q, k, v, allowed, dropout=attn.dropout)", "attention(q, k, v, None, dropout=attn.dropout)")),
    ("GPT", "a separate output layer: the weights are not tied",
     ("        self.out_proj.weight = self.tok_embed.weight  # tied: the same Parameter (V, D)\n", "")),
    ("GPT", "no final LayerNorm after the pre-LN stack",
     ("return self.out_proj(self.norm(x))", "return self.out_proj(x)")),
    ("GPT", "with a cache, a (T_new, T_new) causal mask, not one aligned to absolute positions: right for a "
            "prefill and single tokens, raises on a chunk of several tokens after a non-empty cache",
     ("allowed = cached_causal_mask(positions, k.shape[2])", "allowed = causal_allowed(x.shape[1], x.device)")),
    ("GPT", "with a cache, the new tokens get positions 0, 1, ... again",
     ("self.pos_embed(positions))", "self.pos_embed(torch.arange(T, device=ids.device)))")),
    ("lm_batches", "offsets from the global random state: the generator is ignored",
     ("starts = torch.randint(0, N - block, (batch,), generator=generator)",
      "starts = torch.randint(0, N - block, (batch,))")),
    ("lm_batches", "the last window is never drawn: randint(0, N - block - 1)",
     ("starts = torch.randint(0, N - block,", "starts = torch.randint(0, N - block - 1,")),
    ("lm_batches", "starts drawn up to N - block: the last window's target runs past the stream",
     ("starts = torch.randint(0, N - block,", "starts = torch.randint(0, N - block + 1,")),
    ("lm_batches", "keeps the stream's dtype: int32 ids come back int32, not int64",
     ("inputs = ids[offsets].long()", "inputs = ids[offsets]"),
     ("targets = ids[offsets + 1].long()", "targets = ids[offsets + 1]")),
    ("lm_batches", "targets are the inputs themselves, not shifted",
     ("targets = ids[offsets + 1].long()", "targets = ids[offsets].long()")),
    ("generate", "no cache: the whole sequence runs again at every step",
     ("logits = model(prompt_ids, cache)[:, -1]", "logits = model(prompt_ids)[:, -1]"),
     ("logits = model(next_id[:, None], cache)[:, -1]", "logits = model(ids)[:, -1]")),
    ("generate", "feeds the whole sequence again, with the cache",
     ("logits = model(next_id[:, None], cache)[:, -1]", "logits = model(ids, cache)[:, -1]")),
    ("generate", "feeds the last prompt token twice: the prefill's last logits already predict the first new "
                 "token, so feed each new token once, after it is drawn",
     ("logits = model(prompt_ids, cache)[:, -1]",
      "model(prompt_ids, cache)\n    logits = model(prompt_ids[:, -1:], cache)[:, -1]")),
    ("generate", "switches the model to eval mode itself: the caller's mode is not left as it is",
     ("cache = KVCache(len(model.layers))\n    ids = prompt_ids",
      "model.eval()\n    cache = KVCache(len(model.layers))\n    ids = prompt_ids")),
    ("generate", "draws from the global random state: the generator is ignored",
     ("torch.multinomial(scores.softmax(-1), 1, generator=generator)", "torch.multinomial(scores.softmax(-1), 1)")),
    ("generate", "divides the probabilities by the temperature, not the logits",
     ("scores = logits.float() / temperature", "scores = logits.float()"),
     ("torch.multinomial(scores.softmax(-1), 1,", "torch.multinomial(scores.softmax(-1) / temperature, 1,")),
    ("generate_long",
     "each round is handed the first keep tokens, not the last: the text restarts from its beginning"),
    ("generate_long",
     "a wrong fix: ids[:, len - keep:], a negative start (too few tokens) while the sequence is shorter than keep",
     ("ids[:, -keep:]", "ids[:, ids.shape[1] - keep:]")),
    ("generate_long",
     "a wrong fix: appends out[:, keep:], as if every round's prompt held keep tokens",
     ("out[:, context.shape[1]:]", "out[:, keep:]")),
    ("generate_long",
     "a wrong fix: every round asks for max_len - keep tokens, fewer than fit after a shorter prompt",
     ("n = min(model.max_len - context.shape[1],", "n = min(model.max_len - keep,")),
]
