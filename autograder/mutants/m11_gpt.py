"""Wrong answers to lesson 11-gpt.

Most are the reference with the one line a student got wrong (``patched``); the one written out is a different
algorithm, typed as a student would in the notebook, where ``pair_counts`` and ``merge_pair`` exist.
"""

from autograder.mutants import mutant, patched, shown_bug

LESSON = "11-gpt"
MUTANTS: list = []


# -- train_bpe ---------------------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "train_bpe", "ties go to the smallest pair, not the first one",
        ("best = max(counts, key=counts.get)",
         "top = max(counts.values())\n        best = min(pair for pair, n in counts.items() if n == top)"))


# no merge loop at all (a different algorithm, not a changed line): written out
@mutant(MUTANTS, "train_bpe", "counts the pairs once, before any merge, and takes the top ones")
def train_bpe(text, vocab_size):
    ids = list(text.encode("utf-8"))
    counts = pair_counts(ids)  # noqa: F821 - given in the notebook
    ranked = sorted(counts, key=counts.get, reverse=True)
    return ranked[: max(vocab_size - 256, 0)]


patched(MUTANTS, LESSON, "train_bpe", "one merge too few: range(257, vocab_size)",
        ("range(256, vocab_size)", "range(257, vocab_size)"),
        ("merge_pair(ids, best, new_id)", "merge_pair(ids, best, new_id - 1)"))


# -- BPETokenizer ------------------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "BPETokenizer", "decodes token by token: a character split across tokens becomes U+FFFD",
        ('data = b"".join(self.vocab[i] for i in ids)\n        return data.decode("utf-8", errors="replace")',
         'return "".join(self.vocab[i].decode("utf-8", errors="replace") for i in ids)'))
patched(MUTANTS, LESSON, "BPETokenizer", "applies the merges from the last learned to the first",
        ("for k, (a, b) in enumerate(self.merges):", "for k, (a, b) in reversed(list(enumerate(self.merges))):"))
patched(MUTANTS, LESSON, "BPETokenizer", "vocab_size counts the merges only",
        ("return len(self.vocab)", "return len(self.merges)"))


# -- GPT ---------------------------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "GPT", "no causal mask: every position sees the whole sequence",
        ("x = layer(x, self_allowed=allowed)", "x = layer(x)"),
        ("attention(q, k, v, allowed, dropout=attn.dropout)", "attention(q, k, v, None, dropout=attn.dropout)"))
patched(MUTANTS, LESSON, "GPT", "a separate output layer: the weights are not tied",
        ("        self.out_proj.weight = self.tok_embed.weight  # tied: the same Parameter (V, D)\n", ""))
patched(MUTANTS, LESSON, "GPT", "no final LayerNorm after the pre-LN stack",
        ("return self.out_proj(self.norm(x))", "return self.out_proj(x)"))
patched(MUTANTS, LESSON, "GPT", "with a cache, the new tokens get positions 0, 1, ... again",
        ("self.pos_embed(positions))", "self.pos_embed(torch.arange(T, device=ids.device)))"))


# -- lm_batches --------------------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "lm_batches", "offsets from the global random state: the generator is ignored",
        ("starts = torch.randint(0, N - block, (batch,), generator=generator)",
         "starts = torch.randint(0, N - block, (batch,))"))
patched(MUTANTS, LESSON, "lm_batches", "the last window is never drawn: randint(0, N - block - 1)",
        ("starts = torch.randint(0, N - block,", "starts = torch.randint(0, N - block - 1,"))
patched(MUTANTS, LESSON, "lm_batches", "targets are the inputs themselves, not shifted",
        ("targets = ids[offsets + 1].long()", "targets = ids[offsets].long()"))


# -- generate ----------------------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "generate", "no cache: the whole sequence runs again at every step",
        ("logits = model(prompt_ids, cache)[:, -1]", "logits = model(prompt_ids)[:, -1]"),
        ("logits = model(next_id[:, None], cache)[:, -1]", "logits = model(ids)[:, -1]"))
patched(MUTANTS, LESSON, "generate", "feeds the whole sequence again, with the cache",
        ("logits = model(next_id[:, None], cache)[:, -1]", "logits = model(ids, cache)[:, -1]"))
patched(MUTANTS, LESSON, "generate", "draws from the global random state: the generator is ignored",
        ("torch.multinomial(scores.softmax(-1), 1, generator=generator)", "torch.multinomial(scores.softmax(-1), 1)"))
patched(MUTANTS, LESSON, "generate", "divides the probabilities by the temperature, not the logits",
        ("scores = logits.float() / temperature", "scores = logits.float()"),
        ("torch.multinomial(scores.softmax(-1), 1,", "torch.multinomial(scores.softmax(-1) / temperature, 1,"))


# -- generate_long (find the bug) ----------------------------------------------------------------------------------
shown_bug(MUTANTS, LESSON, "generate_long",
          "each round is handed the first keep tokens, not the last: the text restarts from its beginning")
patched(MUTANTS, LESSON, "generate_long",
        "a wrong fix: ids[:, len - keep:], a negative start (too few tokens) while the sequence is shorter than keep",
        ("ids[:, -keep:]", "ids[:, ids.shape[1] - keep:]"))
patched(MUTANTS, LESSON, "generate_long",
        "a wrong fix: appends out[:, keep:], as if every round's prompt held keep tokens",
        ("out[:, context.shape[1]:]", "out[:, keep:]"))
patched(MUTANTS, LESSON, "generate_long",
        "a wrong fix: every round asks for max_len - keep tokens, fewer than fit after a shorter prompt",
        ("n = min(model.max_len - context.shape[1],", "n = min(model.max_len - keep,"))
