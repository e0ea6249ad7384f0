"""5. Lesson 09: greedy decoding with a KV cache vs without, at 64 / 128 / 256 generated tokens.

An untrained model of about 1 M parameters (D = 128, 4 heads, F = 512, 2 + 2 layers, 13-token vocabulary) whose
output bias rules out PAD, BOS and EOS, so every row generates exactly the number of tokens asked for. Both
decoders are the references (``generation.greedy_decode``, ``kv_cache.greedy_decode_cached``), timed in turn
in the same run; the tokens must be identical.
"""

from __future__ import annotations

import time

from bench.common import NOT_AVAILABLE, seconds, side_by_side, table

LENGTHS = (64, 128, 256)
BATCHES = (1, 16)
TARGET = 5.0  # speed-up at 256 tokens (issue 7)


def make_model():
    import torch

    from autograder.course.reference.model import Seq2SeqTransformer
    from decoder_course.conventions import BOS, EOS, PAD

    torch.manual_seed(0)
    V = 13
    model = Seq2SeqTransformer(V, V, d_model=128, n_heads=4, d_ff=512, n_layers=2, dropout=0.0,
                               tie_weights=False).eval()
    with torch.no_grad():
        model.out_proj.bias[[PAD, BOS, EOS]] = -1e4  # never stop early, never emit a special token
    return model, V


def run(quick: bool = False, repeats: int = 3) -> str:
    try:
        from autograder.course.reference.generation import greedy_decode
        from autograder.course.reference.kv_cache import greedy_decode_cached
    except ImportError:
        return NOT_AVAILABLE
    import torch

    from decoder_course.conventions import BOS, EOS, PAD

    model, V = make_model()
    params = sum(p.numel() for p in model.parameters())
    rows, at_256 = [], {}
    for B in BATCHES:
        generator = torch.Generator().manual_seed(B)
        src = torch.randint(3, V, (B, 10), generator=generator)  # (B, S): digits, no special tokens
        for L in LENGTHS if not quick else (64, 256):
            plain = greedy_decode(model, src, L, BOS, EOS, pad_id=PAD)
            cached = greedy_decode_cached(model, src, L, BOS, EOS, pad_id=PAD)
            same = plain.shape == (B, L) and torch.equal(plain, cached)
            fns = {
                "plain": lambda src=src, L=L: greedy_decode(model, src, L, BOS, EOS, pad_id=PAD),
                "cached": lambda src=src, L=L: greedy_decode_cached(model, src, L, BOS, EOS, pad_id=PAD),
            }
            # the check above was the warm-up; wall time, then this process's CPU time (the work, not the wait)
            times = side_by_side(fns, repeats=1 if quick else repeats, number=1)
            cpu = side_by_side(fns, repeats=1 if quick else repeats, number=1, clock=time.process_time)
            speedup, cpu_speedup = times["plain"] / times["cached"], cpu["plain"] / cpu["cached"]
            if L == 256:
                at_256[B] = (speedup, cpu_speedup)
            rows.append([B, L, seconds(times["plain"]), seconds(times["cached"]), f"{speedup:.1f}×",
                         f"{cpu_speedup:.1f}×", "yes" if same else "**NO**"])
    verdict = ", ".join(f"batch {B}: {'yes' if min(s) >= TARGET else '**no**'} ({s[0]:.1f}× wall, {s[1]:.1f}× CPU)"
                        for B, s in at_256.items())
    return "\n".join([
        table(["batch", "tokens", "without cache", "with cache", "speed-up (wall)", "speed-up (CPU time)",
               "same tokens"], rows),
        "",
        f"Model: {params / 1e6:.2f} M parameters. Times are wall-clock medians; the CPU-time column is the same "
        f"comparison in this process's CPU seconds. Target ≥ {TARGET:.0f}× at 256 tokens: {verdict}."])
