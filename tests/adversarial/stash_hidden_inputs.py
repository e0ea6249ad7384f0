"""A correct answer that keeps its arguments (a global list, a closure, a class attribute, a NumPy module
attribute, builtins); this cell and a later one print what was kept: no hidden input may reach the feedback.

Everything after the `# %% a later cell` line is a new cell at the end of the notebook.
target: padding_mask
full: causal_mask, padding_mask, combine_masks, mask_to_bias
log: padding_mask: passed
"""
import builtins

stash = []


class Keeper:
    kept = []


def _keeping():
    kept = []

    def padding_mask(token_ids, pad_id):
        stash.append((np.asarray(token_ids).tolist(), pad_id))
        kept.append(np.asarray(token_ids).tolist())
        Keeper.kept.append(np.array(token_ids))
        np._stash = [*getattr(np, "_stash", []), np.array(token_ids)]
        builtins._stash = [*getattr(builtins, "_stash", []), np.array(token_ids)]
        return np.asarray(token_ids) != pad_id

    return padding_mask, kept


padding_mask, kept = _keeping()
print("kept so far:", stash, kept, Keeper.kept, getattr(np, "_stash", []), getattr(builtins, "_stash", []))
# %% a later cell
print("stash sizes:", [len(stash), len(kept), len(Keeper.kept), len(getattr(np, "_stash", [])),
                       len(getattr(builtins, "_stash", []))])
print("kept:", stash, kept, Keeper.kept, getattr(np, "_stash", None), getattr(builtins, "_stash", None))
