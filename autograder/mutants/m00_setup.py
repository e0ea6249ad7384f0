"""Wrong answers to lesson 00-setup (einops warm-ups): the reference with a line changed."""

from autograder.mutants import patched

MUTANTS: list = []
LESSON = "00-setup"
FLAT, MAJOR, SPLIT = '"b t d -> (b t) d"', '"b t d -> t b d"', '"b t (h dh) -> b t h dh", h=H'

patched(MUTANTS, LESSON, "flatten_batch", "time-major order: (t b) instead of (b t)",
        (FLAT, '"b t d -> (t b) d"'))
patched(MUTANTS, LESSON, "flatten_batch", "merges T and D instead of B and T",
        (f"rearrange(x, {FLAT})", "x.reshape(x.shape[0], -1)"))
patched(MUTANTS, LESSON, "flatten_batch", "flattens everything into one axis", (FLAT, '"b t d -> (b t d)"'))
patched(MUTANTS, LESSON, "time_major", "reshape instead of transpose: same shape, scrambled values",
        (f"rearrange(x, {MAJOR})", "x.reshape(x.shape[1], x.shape[0], x.shape[2])"))
patched(MUTANTS, LESSON, "time_major", "NumPy's .T reverses every axis: (D, T, B)", (f"rearrange(x, {MAJOR})", "x.T"))
patched(MUTANTS, LESSON, "time_major", "swaps T and D instead of B and T", (MAJOR, '"b t d -> b d t"'))
patched(MUTANTS, LESSON, "split_last", "(dh h): the heads' features interleaved",
        (SPLIT, '"b t (dh h) -> b t h dh", h=H'))
patched(MUTANTS, LESSON, "split_last", "H hard-coded from the worked example", (SPLIT, SPLIT.replace("h=H", "h=3")))
patched(MUTANTS, LESSON, "split_last", "heads moved before time: (B, H, T, Dh)",
        (SPLIT, '"b t (h dh) -> b h t dh", h=H'))
