"""Patch the harvest's recorder so that every item hands in arrays of the right type and shape, made-up values.

The outputs of earlier cells are out of the kernel's reach; forging can only happen inside the item's own cell.
target: causal_mask
zero: causal_mask, padding_mask, combine_masks, mask_to_bias
log: causal_mask: failed
"""
import decoder_course.harvest as harvest

honest_record = harvest._Runner.record


def forged_record(self, name, value):
    if isinstance(value, np.ndarray):
        value = np.ones_like(value)  # the right type, dtype and shape; not the values
    honest_record(self, name, value)


harvest._Runner.record = forged_record


def causal_mask(T):
    return np.tril(np.ones((T, T), dtype=bool))
