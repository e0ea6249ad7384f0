"""A whole wrong answer to lesson 11-gpt (the patches of the reference are its ``MISTAKES``): a different algorithm,
typed as a student would in the notebook, where ``pair_counts`` and ``merge_pair`` exist.
"""

from autograder.course.mutants import mutant

MUTANTS: list = []


# no merge loop at all (a different algorithm, not a changed line): written out
@mutant(MUTANTS, "train_bpe", "counts the pairs once, before any merge, and takes the top ones")
def train_bpe(text, vocab_size):
    ids = list(text.encode("utf-8"))
    counts = pair_counts(ids)  # noqa: F821 - given in the notebook
    ranked = sorted(counts, key=counts.get, reverse=True)
    return ranked[: max(vocab_size - 256, 0)]


