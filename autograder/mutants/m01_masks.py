"""Wrong answers to lesson 01-masks: the reference with a line changed."""

from autograder.mutants import patched

MUTANTS: list = []
LESSON = "01-masks"

patched(MUTANTS, LESSON, "causal_mask", "strictly lower triangle: a token cannot see itself",
        ("return k_pos <= q_pos", "return k_pos < q_pos"))
patched(MUTANTS, LESSON, "causal_mask", "upper triangle: polarity of the future inverted",
        ("return k_pos <= q_pos", "return k_pos >= q_pos"))
patched(MUTANTS, LESSON, "causal_mask", "0/1 integers instead of booleans",
        ("return k_pos <= q_pos", "return (k_pos <= q_pos).astype(int)"))
patched(MUTANTS, LESSON, "padding_mask", "assumes the pad id is 0",
        ("!= pad_id", "!= 0"))
patched(MUTANTS, LESSON, "padding_mask", "inverted polarity: True marks the padding",
        ("!= pad_id", "== pad_id"))
patched(MUTANTS, LESSON, "combine_masks", "key padding put on the query axis",
        ("key_is_real[:, None, None, :]", "key_is_real[:, None, :, None]"))
patched(MUTANTS, LESSON, "combine_masks", "OR instead of AND",
        ("return causal & key_is_real", "return causal | key_is_real"))
patched(MUTANTS, LESSON, "mask_to_bias", "-inf for blocked entries",
        ("very_negative = np.finfo(dtype).min", "very_negative = -np.inf"))
patched(MUTANTS, LESSON, "mask_to_bias", "-1e9, which overflows float16",
        ("very_negative = np.finfo(dtype).min", "very_negative = -1e9"))
patched(MUTANTS, LESSON, "mask_to_bias", "ignores the requested dtype",
        ("return np.where(allowed, 0, very_negative).astype(dtype)",
         "return np.where(allowed, 0.0, np.finfo(np.float64).min)"))
