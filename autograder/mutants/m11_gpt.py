"""Wrong answers to lesson 11-gpt.

Each is written as a student would type it in the notebook, where ``torch``, ``nn``, ``pair_counts``,
``merge_pair``, ``causal_allowed``, ``DecoderLayer``, ``KVCache``, ``cached_causal_mask``, ``attention``,
``split_heads``, ``merge_heads`` and ``top_k_filter`` exist.
"""

import torch
from torch import nn

from autograder.mutants import mutant, patched, shown_bug

MUTANTS: list = []


# -- train_bpe ---------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "train_bpe", "ties go to the smallest pair, not the first one")
def train_bpe(text, vocab_size):
    ids = list(text.encode("utf-8"))
    merges = []
    for new_id in range(256, vocab_size):
        counts = pair_counts(ids)  # noqa: F821 - given in the notebook
        if not counts:
            break
        top = max(counts.values())
        best = min(pair for pair, n in counts.items() if n == top)
        ids = merge_pair(ids, best, new_id)  # noqa: F821
        merges.append(best)
    return merges


@mutant(MUTANTS, "train_bpe", "counts the pairs once, before any merge, and takes the top ones")
def train_bpe(text, vocab_size):  # noqa: F811
    ids = list(text.encode("utf-8"))
    counts = pair_counts(ids)  # noqa: F821
    ranked = sorted(counts, key=counts.get, reverse=True)
    return ranked[: max(vocab_size - 256, 0)]


@mutant(MUTANTS, "train_bpe", "one merge too few: range(257, vocab_size)")
def train_bpe(text, vocab_size):  # noqa: F811
    ids = list(text.encode("utf-8"))
    merges = []
    for new_id in range(257, vocab_size):
        counts = pair_counts(ids)  # noqa: F821
        if not counts:
            break
        best = max(counts, key=counts.get)
        ids = merge_pair(ids, best, new_id - 1)  # noqa: F821
        merges.append(best)
    return merges


# -- BPETokenizer ------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "BPETokenizer", "decodes token by token: a character split across tokens becomes U+FFFD")
class BPETokenizer:
    def __init__(self, merges):
        self.merges = [(int(a), int(b)) for a, b in merges]
        self.vocab = [bytes([b]) for b in range(256)]
        for a, b in self.merges:
            self.vocab.append(self.vocab[a] + self.vocab[b])

    @property
    def vocab_size(self):
        return len(self.vocab)

    def encode(self, text):
        ids = list(text.encode("utf-8"))
        for k, pair in enumerate(self.merges):
            ids = merge_pair(ids, pair, 256 + k)  # noqa: F821
        return ids

    def decode(self, ids):
        return "".join(self.vocab[int(i)].decode("utf-8", errors="replace") for i in ids)


@mutant(MUTANTS, "BPETokenizer", "applies the merges from the last learned to the first")
class BPETokenizer:  # noqa: F811
    def __init__(self, merges):
        self.merges = [(int(a), int(b)) for a, b in merges]
        self.vocab = [bytes([b]) for b in range(256)]
        for a, b in self.merges:
            self.vocab.append(self.vocab[a] + self.vocab[b])

    @property
    def vocab_size(self):
        return len(self.vocab)

    def encode(self, text):
        ids = list(text.encode("utf-8"))
        for k in reversed(range(len(self.merges))):
            ids = merge_pair(ids, self.merges[k], 256 + k)  # noqa: F821
        return ids

    def decode(self, ids):
        return b"".join(self.vocab[int(i)] for i in ids).decode("utf-8", errors="replace")


@mutant(MUTANTS, "BPETokenizer", "vocab_size counts the merges only")
class BPETokenizer:  # noqa: F811
    def __init__(self, merges):
        self.merges = [(int(a), int(b)) for a, b in merges]
        self.vocab = [bytes([b]) for b in range(256)]
        for a, b in self.merges:
            self.vocab.append(self.vocab[a] + self.vocab[b])

    @property
    def vocab_size(self):
        return len(self.merges)

    def encode(self, text):
        ids = list(text.encode("utf-8"))
        for k, pair in enumerate(self.merges):
            ids = merge_pair(ids, pair, 256 + k)  # noqa: F821
        return ids

    def decode(self, ids):
        return b"".join(self.vocab[int(i)] for i in ids).decode("utf-8", errors="replace")


# -- GPT ---------------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "GPT", "no causal mask: every position sees the whole sequence")
class GPT(nn.Module):
    def __init__(self, vocab, d_model, n_heads, d_ff, n_layers, max_len, dropout=0.0):
        super().__init__()
        self.max_len = max_len
        self.tok_embed = nn.Embedding(vocab, d_model)
        self.pos_embed = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=True,  # noqa: F821
                                                 cross_attn=False) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.out_proj = nn.Linear(d_model, vocab, bias=False)
        self.out_proj.weight = self.tok_embed.weight
        nn.init.normal_(self.tok_embed.weight, std=0.02)
        nn.init.normal_(self.pos_embed.weight, std=0.02)

    def forward(self, ids, cache=None):
        T = ids.shape[1]
        start = 0 if cache is None else cache.length
        if start + T > self.max_len:
            raise ValueError("too long")
        positions = torch.arange(start, start + T, device=ids.device)
        x = self.dropout(self.tok_embed(ids) + self.pos_embed(positions))
        for i, layer in enumerate(self.layers):
            if cache is None:
                x = layer(x)
            else:
                attn, h = layer.self_attn, layer.norm1(x)
                q = split_heads(attn.q_proj(h), attn.n_heads)  # noqa: F821
                k, v = cache.update(split_heads(attn.k_proj(h), attn.n_heads),  # noqa: F821
                                    split_heads(attn.v_proj(h), attn.n_heads), i)  # noqa: F821
                out, _ = attention(q, k, v, None, dropout=attn.dropout)  # noqa: F821
                x = x + layer.dropout1(attn.out_proj(merge_heads(out)))  # noqa: F821
                x = x + layer._ff_block(layer.norm3(x))
        return self.out_proj(self.norm(x))


@mutant(MUTANTS, "GPT", "a separate output layer: the weights are not tied")
class GPT(nn.Module):  # noqa: F811
    def __init__(self, vocab, d_model, n_heads, d_ff, n_layers, max_len, dropout=0.0):
        super().__init__()
        self.max_len = max_len
        self.tok_embed = nn.Embedding(vocab, d_model)
        self.pos_embed = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=True,  # noqa: F821
                                                 cross_attn=False) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.out_proj = nn.Linear(d_model, vocab, bias=False)
        nn.init.normal_(self.tok_embed.weight, std=0.02)
        nn.init.normal_(self.pos_embed.weight, std=0.02)

    def forward(self, ids, cache=None):
        T = ids.shape[1]
        start = 0 if cache is None else cache.length
        if start + T > self.max_len:
            raise ValueError("too long")
        positions = torch.arange(start, start + T, device=ids.device)
        x = self.dropout(self.tok_embed(ids) + self.pos_embed(positions))
        for i, layer in enumerate(self.layers):
            if cache is None:
                x = layer(x, self_allowed=causal_allowed(T, ids.device))  # noqa: F821
            else:
                attn, h = layer.self_attn, layer.norm1(x)
                q = split_heads(attn.q_proj(h), attn.n_heads)  # noqa: F821
                k, v = cache.update(split_heads(attn.k_proj(h), attn.n_heads),  # noqa: F821
                                    split_heads(attn.v_proj(h), attn.n_heads), i)  # noqa: F821
                out, _ = attention(q, k, v, cached_causal_mask(positions, k.shape[2]),  # noqa: F821
                                   dropout=attn.dropout)
                x = x + layer.dropout1(attn.out_proj(merge_heads(out)))  # noqa: F821
                x = x + layer._ff_block(layer.norm3(x))
        return self.out_proj(self.norm(x))


@mutant(MUTANTS, "GPT", "no final LayerNorm after the pre-LN stack")
class GPT(nn.Module):  # noqa: F811
    def __init__(self, vocab, d_model, n_heads, d_ff, n_layers, max_len, dropout=0.0):
        super().__init__()
        self.max_len = max_len
        self.tok_embed = nn.Embedding(vocab, d_model)
        self.pos_embed = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=True,  # noqa: F821
                                                 cross_attn=False) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.out_proj = nn.Linear(d_model, vocab, bias=False)
        self.out_proj.weight = self.tok_embed.weight
        nn.init.normal_(self.tok_embed.weight, std=0.02)
        nn.init.normal_(self.pos_embed.weight, std=0.02)

    def forward(self, ids, cache=None):
        T = ids.shape[1]
        start = 0 if cache is None else cache.length
        if start + T > self.max_len:
            raise ValueError("too long")
        positions = torch.arange(start, start + T, device=ids.device)
        x = self.dropout(self.tok_embed(ids) + self.pos_embed(positions))
        for i, layer in enumerate(self.layers):
            if cache is None:
                x = layer(x, self_allowed=causal_allowed(T, ids.device))  # noqa: F821
            else:
                attn, h = layer.self_attn, layer.norm1(x)
                q = split_heads(attn.q_proj(h), attn.n_heads)  # noqa: F821
                k, v = cache.update(split_heads(attn.k_proj(h), attn.n_heads),  # noqa: F821
                                    split_heads(attn.v_proj(h), attn.n_heads), i)  # noqa: F821
                out, _ = attention(q, k, v, cached_causal_mask(positions, k.shape[2]),  # noqa: F821
                                   dropout=attn.dropout)
                x = x + layer.dropout1(attn.out_proj(merge_heads(out)))  # noqa: F821
                x = x + layer._ff_block(layer.norm3(x))
        return self.out_proj(x)


@mutant(MUTANTS, "GPT", "with a cache, the new tokens get positions 0, 1, ... again")
class GPT(nn.Module):  # noqa: F811
    def __init__(self, vocab, d_model, n_heads, d_ff, n_layers, max_len, dropout=0.0):
        super().__init__()
        self.max_len = max_len
        self.tok_embed = nn.Embedding(vocab, d_model)
        self.pos_embed = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=True,  # noqa: F821
                                                 cross_attn=False) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.out_proj = nn.Linear(d_model, vocab, bias=False)
        self.out_proj.weight = self.tok_embed.weight
        nn.init.normal_(self.tok_embed.weight, std=0.02)
        nn.init.normal_(self.pos_embed.weight, std=0.02)

    def forward(self, ids, cache=None):
        T = ids.shape[1]
        start = 0 if cache is None else cache.length
        if start + T > self.max_len:
            raise ValueError("too long")
        x = self.dropout(self.tok_embed(ids) + self.pos_embed(torch.arange(T, device=ids.device)))
        for i, layer in enumerate(self.layers):
            if cache is None:
                x = layer(x, self_allowed=causal_allowed(T, ids.device))  # noqa: F821
            else:
                positions = torch.arange(start, start + T, device=ids.device)
                attn, h = layer.self_attn, layer.norm1(x)
                q = split_heads(attn.q_proj(h), attn.n_heads)  # noqa: F821
                k, v = cache.update(split_heads(attn.k_proj(h), attn.n_heads),  # noqa: F821
                                    split_heads(attn.v_proj(h), attn.n_heads), i)  # noqa: F821
                out, _ = attention(q, k, v, cached_causal_mask(positions, k.shape[2]),  # noqa: F821
                                   dropout=attn.dropout)
                x = x + layer.dropout1(attn.out_proj(merge_heads(out)))  # noqa: F821
                x = x + layer._ff_block(layer.norm3(x))
        return self.out_proj(self.norm(x))


# -- lm_batches --------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "lm_batches", "offsets from the global random state: the generator is ignored")
def lm_batches(ids, block, batch, generator=None):
    N = ids.shape[0]
    if N <= block:
        raise ValueError("too short")
    starts = torch.randint(0, N - block, (batch,))
    offsets = (starts[:, None] + torch.arange(block)).to(ids.device)
    return ids[offsets].long(), ids[offsets + 1].long()


@mutant(MUTANTS, "lm_batches", "the last window is never drawn: randint(0, N - block - 1)")
def lm_batches(ids, block, batch, generator=None):  # noqa: F811
    N = ids.shape[0]
    if N <= block:
        raise ValueError("too short")
    starts = torch.randint(0, N - block - 1, (batch,), generator=generator)
    offsets = (starts[:, None] + torch.arange(block)).to(ids.device)
    return ids[offsets].long(), ids[offsets + 1].long()


@mutant(MUTANTS, "lm_batches", "targets are the inputs themselves, not shifted")
def lm_batches(ids, block, batch, generator=None):  # noqa: F811
    N = ids.shape[0]
    if N <= block:
        raise ValueError("too short")
    starts = torch.randint(0, N - block, (batch,), generator=generator)
    offsets = (starts[:, None] + torch.arange(block)).to(ids.device)
    return ids[offsets].long(), ids[offsets].long()


# -- generate ----------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "generate", "no cache: the whole sequence runs again at every step")
@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    ids = prompt_ids
    for _ in range(max_new_tokens):
        logits = model(ids)[:, -1]
        if temperature == 0:
            next_id = logits.argmax(-1)
        else:
            scores = logits.float() / temperature
            if top_k is not None:
                scores = top_k_filter(scores, top_k)  # noqa: F821
            next_id = torch.multinomial(scores.softmax(-1), 1, generator=generator).squeeze(-1)
        ids = torch.cat([ids, next_id[:, None]], dim=1)
    return ids


@mutant(MUTANTS, "generate", "feeds the whole sequence again, with the cache")
@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):  # noqa: F811
    cache = KVCache(len(model.layers))  # noqa: F821
    ids = prompt_ids
    for _ in range(max_new_tokens):
        logits = model(ids, cache)[:, -1]
        if temperature == 0:
            next_id = logits.argmax(-1)
        else:
            scores = logits.float() / temperature
            if top_k is not None:
                scores = top_k_filter(scores, top_k)  # noqa: F821
            next_id = torch.multinomial(scores.softmax(-1), 1, generator=generator).squeeze(-1)
        ids = torch.cat([ids, next_id[:, None]], dim=1)
    return ids


@mutant(MUTANTS, "generate", "draws from the global random state: the generator is ignored")
@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):  # noqa: F811
    cache = KVCache(len(model.layers))  # noqa: F821
    ids = prompt_ids
    logits = model(prompt_ids, cache)[:, -1]
    for step in range(max_new_tokens):
        if temperature == 0:
            next_id = logits.argmax(-1)
        else:
            scores = logits.float() / temperature
            if top_k is not None:
                scores = top_k_filter(scores, top_k)  # noqa: F821
            next_id = torch.multinomial(scores.softmax(-1), 1).squeeze(-1)
        ids = torch.cat([ids, next_id[:, None]], dim=1)
        if step + 1 < max_new_tokens:
            logits = model(next_id[:, None], cache)[:, -1]
    return ids


@mutant(MUTANTS, "generate", "divides the probabilities by the temperature, not the logits")
@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):  # noqa: F811
    cache = KVCache(len(model.layers))  # noqa: F821
    ids = prompt_ids
    logits = model(prompt_ids, cache)[:, -1]
    for step in range(max_new_tokens):
        if temperature == 0:
            next_id = logits.argmax(-1)
        else:
            scores = logits.float()
            if top_k is not None:
                scores = top_k_filter(scores, top_k)  # noqa: F821
            next_id = torch.multinomial(scores.softmax(-1) / temperature, 1, generator=generator).squeeze(-1)
        ids = torch.cat([ids, next_id[:, None]], dim=1)
        if step + 1 < max_new_tokens:
            logits = model(next_id[:, None], cache)[:, -1]
    return ids


# -- generate_long (find the bug) ----------------------------------------------------------------------------------
shown_bug(MUTANTS, "11-gpt", "generate_long",
          "each round is handed the first keep tokens, not the last: the text restarts from its beginning")
patched(MUTANTS, "11-gpt", "generate_long",
        "a wrong fix: ids[:, len - keep:], a negative start (too few tokens) while the sequence is shorter than keep",
        ("ids[:, -keep:]", "ids[:, ids.shape[1] - keep:]"))
patched(MUTANTS, "11-gpt", "generate_long",
        "a wrong fix: appends out[:, keep:], as if every round's prompt held keep tokens",
        ("out[:, context.shape[1]:]", "out[:, keep:]"))
patched(MUTANTS, "11-gpt", "generate_long",
        "a wrong fix: every round asks for max_len - keep tokens, fewer than fit after a shorter prompt",
        ("n = min(model.max_len - context.shape[1],", "n = min(model.max_len - keep,"))
