"""Reference for lesson 12-modern (PyTorch): the decoder block of today's open models, piece by piece.

Lesson 11's block is GPT-2's (LayerNorm, learned positions, a ReLU feed-forward, one key/value head per query
head). The block of LLaMA, Mistral and most open models since swaps each part:

- ``RMSNorm`` (Zhang & Sennrich 2019): rescale by the root mean square, no mean subtracted, no bias;
- ``rotary_embedding`` (RoPE, Su et al. 2021): positions as rotations of query/key pairs of dimensions, so the
  score of a query at position m and a key at n depends only on m - n; no position table to learn or run out of.
  Pairs are *interleaved*, (0, 1), (2, 3), ..., as in the paper's complex-number form (GPT-NeoX and Hugging Face's
  LLaMA pair dimension i with i + Dh/2 instead: the same idea, a permuted layout);
- ``SwiGLUFeedForward`` (Shazeer 2020): a SiLU-gated feed-forward with three bias-free matrices, its width cut
  to about 2/3 so that the parameters match the ReLU one's;
- ``GroupedQueryAttention`` (Ainslie et al. 2023): fewer key/value heads than query heads, each shared by a group
  of query heads: the KV cache shrinks by ``n_heads / n_kv_heads``. ``n_kv_heads = 1`` is multi-query attention
  (Shazeer 2019), ``n_kv_heads = n_heads`` is plain multi-head attention;
- ``sliding_window_mask`` (Mistral): each query sees only the last ``window`` positions;
- ``ModernBlock``: pre-norm with RMSNorm, RoPE inside the attention, SwiGLU; ``ModernGPT`` stacks it;
- ``mha_to_gqa``, a find-the-bug exercise (autograder.course.bugs): given code that turns the student's multi-head
  ``GroupedQueryAttention`` into one with fewer key/value heads by mean-pooling groups (Ainslie et al. 2023),
  with one mistake in which heads it pools together.

Departures, marked: no bias anywhere (as LLaMA), and the attention's fully masked rows give zeros (the course's
convention), where SDPA gives NaN.
"""

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from autograder.course.reference.kv_cache import KVCache, cached_causal_mask  # noqa: F401 - given in the lesson
from autograder.course.reference.multi_head import attention, merge_heads, split_heads  # noqa: F401 - given


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last axis: ``x / sqrt(mean(x², -1) + eps) * weight``.

    No mean is subtracted and there is no bias (unlike LayerNorm); ``eps`` is added *inside* the square root.
    One parameter, ``weight`` (D,), starting at ones. Computed in float32, returned in ``x``'s dtype; ``x`` is
    unchanged. Equal to ``torch.nn.RMSNorm(d, eps)`` with the same weight, but written by hand: ``nn.RMSNorm`` and
    ``F.rms_norm`` are not to be used (the checks refuse them).

    Shape:
        x: (..., D) -> (..., D)
    """

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        ### BEGIN SOLUTION
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))  # (D,): a learned gain per feature, no bias
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise every position's D features by their root mean square, then scale by ``weight``.

        Shape:
            x: (..., D) -> (..., D)
        """
        ### BEGIN SOLUTION
        h = x.float()  # in float32: squares of bfloat16 values lose too much
        rms = torch.sqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1): one scale per position
        return (h / rms * self.weight).to(x.dtype)  # (..., D), in x's dtype
        ### END SOLUTION


def rotary_embedding(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (RoPE): rotate each pair of dimensions of ``x`` by an angle set by the position.

    Pairs are interleaved: dimensions (2i, 2i + 1) for i = 0 .. Dh/2 - 1, read as the complex number
    ``x[2i] + 1j·x[2i+1]``. At position p, pair i is rotated by the angle ``p · θ_i`` with
    ``θ_i = base ** (-2i / Dh)`` (pair 0 turns fastest, one radian per position):
    ``(a, b) -> (a·cos - b·sin, a·sin + b·cos)``. Rotations keep lengths, and the dot product of a query rotated
    at position m with a key rotated at n depends only on m - n. ``positions`` are the absolute positions of
    ``x``'s T rows (any integers, e.g. ``cache.length ..`` with a cache). An odd ``Dh`` raises ``ValueError``.
    The output has ``x``'s dtype; ``x`` and ``positions`` are unchanged.

    Shape:
        x: (B, H, T, Dh) with Dh even, positions: (T,) int -> (B, H, T, Dh)
    """
    ### BEGIN SOLUTION
    Dh = x.shape[-1]
    if Dh % 2:
        raise ValueError(f"rotary embedding rotates pairs of dimensions: Dh = {Dh} is odd")
    i = torch.arange(Dh // 2, device=x.device, dtype=torch.float32)  # (Dh/2,): pair index
    theta = base ** (-2 * i / Dh)  # (Dh/2,): pair 0 turns fastest
    angles = positions.to(x.device, torch.float32)[:, None] * theta  # (T, Dh/2)
    cos, sin = angles.cos(), angles.sin()  # (T, Dh/2), broadcast over B and H
    a, b = x[..., 0::2].float(), x[..., 1::2].float()  # (B, H, T, Dh/2): the pairs' two coordinates
    rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)  # (B, H, T, Dh/2, 2)
    return rotated.flatten(-2).to(x.dtype)  # (B, H, T, Dh): pairs interleaved again
    ### END SOLUTION


class SwiGLUFeedForward(nn.Module):
    """SwiGLU feed-forward: ``down_proj(silu(gate_proj(x)) * up_proj(x))`` at every position.

    Three ``nn.Linear`` without bias: ``gate_proj`` (D -> F), ``up_proj`` (D -> F), ``down_proj`` (F -> D). SiLU
    (``x · sigmoid(x)``) of the gate multiplies the up projection element-wise. With three matrices instead of
    two, F is about 2/3 of the ReLU feed-forward's width for the same parameter count. ``x`` is unchanged.

    Shape:
        x: (B, T, D) -> (B, T, D)
    """

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        ### BEGIN SOLUTION
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)  # D -> F: the gate, through SiLU
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)  # D -> F: the values the gate lets through
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)  # F -> D
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Gate, multiply, project back.

        Shape:
            x: (B, T, D) -> (B, T, D)
        """
        ### BEGIN SOLUTION
        hidden = F.silu(self.gate_proj(x)) * self.up_proj(x)  # (B, T, F)
        return self.down_proj(hidden)  # (B, T, D)
        ### END SOLUTION


class GroupedQueryAttention(nn.Module):
    """Self-attention with ``n_heads`` query heads sharing ``n_kv_heads`` key/value heads.

    Four ``nn.Linear`` without bias: ``q_proj`` (D -> D), ``k_proj`` and ``v_proj`` (D -> n_kv_heads·Dh),
    ``out_proj`` (D -> D), with ``Dh = D // n_heads``. Query head h uses key/value head ``h // (n_heads //
    n_kv_heads)``: consecutive query heads form a group (``repeat_interleave`` of the key/value heads, as
    ``F.scaled_dot_product_attention(..., enable_gqa=True)``). ``n_kv_heads = 1`` is multi-query attention,
    ``n_kv_heads = n_heads`` multi-head attention. ``D`` not divisible by ``n_heads``, or ``n_heads`` not by
    ``n_kv_heads``, raises ``ValueError``. Written by hand: ``F.scaled_dot_product_attention`` (with or without
    ``enable_gqa``) and ``nn.MultiheadAttention`` are what it is compared with, not to be used (the checks refuse
    them).

    ``forward(x, positions=None, allowed=None, cache=None, layer_idx=0)``: with ``positions`` (the absolute
    positions of x's T rows) queries and keys are rotated by ``rotary_embedding`` before the scores; without,
    no position enters. ``allowed`` (True = may attend) broadcasts to (B, H, T, S); a fully masked query row gives
    zeros before ``out_proj``; scores are scaled by 1/sqrt(Dh). With a lesson 09 ``KVCache``, the new keys
    (already rotated) and values, (B, n_kv_heads, T, Dh), are appended with ``cache.update(k, v, layer_idx)`` and
    the queries attend over everything cached (S = cached positions): the cache holds only the n_kv_heads heads.
    ``x`` is unchanged.

    Shape:
        x: (B, T, D), positions: (T,) int or None, allowed: broadcastable to (B, H, T, S) or None -> (B, T, D)
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int):
        super().__init__()
        ### BEGIN SOLUTION
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"need D % n_heads == 0 and n_heads % n_kv_heads == 0, got D={d_model}, "
                             f"n_heads={n_heads}, n_kv_heads={n_kv_heads}")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.d_head = d_model // n_heads  # Dh
        self.q_proj = nn.Linear(d_model, d_model, bias=False)  # D -> H·Dh
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)  # D -> H_kv·Dh: fewer heads
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        ### END SOLUTION

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, allowed: torch.Tensor | None = None,
                cache: KVCache | None = None, layer_idx: int = 0) -> torch.Tensor:
        """Grouped-query self-attention over ``x`` (and the cached past, with a cache).

        Shape:
            x: (B, T, D) -> (B, T, D)
        """
        ### BEGIN SOLUTION
        q = split_heads(self.q_proj(x), self.n_heads)  # (B, H, T, Dh)
        k = split_heads(self.k_proj(x), self.n_kv_heads)  # (B, H_kv, T, Dh)
        v = split_heads(self.v_proj(x), self.n_kv_heads)  # (B, H_kv, T, Dh)
        if positions is not None:
            q, k = rotary_embedding(q, positions), rotary_embedding(k, positions)  # positions as rotations
        if cache is not None:
            k, v = cache.update(k, v, layer_idx)  # (B, H_kv, S, Dh): the cache stores H_kv heads only
        group = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(group, dim=1)  # (B, H, S, Dh): kv head j serves query heads j·group .. +group-1
        v = v.repeat_interleave(group, dim=1)
        out, _ = attention(q, k, v, allowed)  # (B, H, T, Dh), scaled by 1/sqrt(Dh), masked rows -> zeros
        return self.out_proj(merge_heads(out))  # (B, T, D)
        ### END SOLUTION


def sliding_window_mask(T: int, window: int) -> torch.Tensor:
    """Causal mask with a sliding window: query t may attend to keys s with ``t - window < s <= t``.

    Each query sees itself and the ``window - 1`` positions before it (``window`` keys at most); ``window >= T``
    is the plain causal mask. ``window < 1`` raises ``ValueError``.

    Shape:
        -> (T, T) bool, True = may attend
    """
    ### BEGIN SOLUTION
    if window < 1:
        raise ValueError(f"window must be at least 1 (the query itself), got {window}")
    t = torch.arange(T)[:, None]  # (T, 1): query positions
    s = torch.arange(T)[None, :]  # (1, T): key positions
    return (s <= t) & (t - s < window)  # (T, T): causal, and at most window - 1 positions back
    ### END SOLUTION


class ModernBlock(nn.Module):
    """A pre-norm decoder block of today's models: RMSNorm, grouped-query attention with RoPE, SwiGLU.

    Submodules: ``attn_norm`` and ``ffn_norm`` (``RMSNorm(D, eps)``: both with the block's ``eps``), ``attn``
    (``GroupedQueryAttention(D, n_heads, n_kv_heads)``), ``feed_forward`` (``SwiGLUFeedForward(D, d_ff)``).
    ``x = x + attn(attn_norm(x), positions, allowed, cache, layer_idx)``, then ``x = x + feed_forward(ffn_norm(x))``:
    each sublayer reads a normalised copy and adds to the unnormalised stream (the stack needs a final norm).
    ``positions`` are passed to the attention (RoPE), ``allowed`` and the cache too. ``x`` is unchanged.

    Shape:
        x: (B, T, D), positions: (T,) int -> (B, T, D)
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int, eps: float = 1e-6):
        super().__init__()
        ### BEGIN SOLUTION
        self.attn_norm = RMSNorm(d_model, eps)
        self.attn = GroupedQueryAttention(d_model, n_heads, n_kv_heads)
        self.ffn_norm = RMSNorm(d_model, eps)
        self.feed_forward = SwiGLUFeedForward(d_model, d_ff)
        ### END SOLUTION

    def forward(self, x: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor | None = None,
                cache: KVCache | None = None, layer_idx: int = 0) -> torch.Tensor:
        """Attention then feed-forward, each on a normalised copy, each added to the stream.

        Shape:
            x: (B, T, D) -> (B, T, D)
        """
        ### BEGIN SOLUTION
        x = x + self.attn(self.attn_norm(x), positions, allowed, cache, layer_idx)  # (B, T, D)
        return x + self.feed_forward(self.ffn_norm(x))  # (B, T, D)
        ### END SOLUTION


class ModernGPT(nn.Module):
    """Lesson 11's GPT with the modern block: no position table (RoPE inside every attention), RMSNorm at the end.

    ``tok_embed`` (N(0, 0.02²)), ``layers`` (``ModernBlock``), ``norm`` (``RMSNorm``), ``out_proj`` tied to
    ``tok_embed``. ``forward(ids, cache=None)``: the new tokens sit at positions ``cache.length ..``; the mask is
    causal, aligned to absolute positions. ``max_len`` only bounds the positions (nothing is learned per position).

    Shape:
        ids: (B, T) int64 -> logits (B, T, V)
    """

    def __init__(self, vocab: int, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int, n_layers: int,
                 max_len: int):
        super().__init__()
        self.max_len = max_len
        self.tok_embed = nn.Embedding(vocab, d_model)  # (V, D); no pos_embed: RoPE rotates q and k instead
        self.layers = nn.ModuleList(ModernBlock(d_model, n_heads, n_kv_heads, d_ff) for _ in range(n_layers))
        self.norm = RMSNorm(d_model)  # the final norm pre-norm stacks need
        self.out_proj = nn.Linear(d_model, vocab, bias=False)
        self.out_proj.weight = self.tok_embed.weight  # tied, as lesson 11's GPT
        nn.init.normal_(self.tok_embed.weight, std=0.02)

    def forward(self, ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits of the next token at every (new) position.

        Shape:
            ids: (B, T) -> logits (B, T, V)
        """
        start = 0 if cache is None else cache.length  # read before the first layer appends to the cache
        T = ids.shape[1]
        if start + T > self.max_len:
            raise ValueError(f"{start + T} positions, more than max_len={self.max_len}")
        positions = torch.arange(start, start + T, device=ids.device)  # (T,) absolute
        allowed = cached_causal_mask(positions, start + T)  # (T, S): key s allowed when s <= the query's position
        x = self.tok_embed(ids)  # (B, T, D)
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, allowed, cache, i)
        return self.out_proj(self.norm(x))  # (B, T, V)


def cache_bytes_per_token(cache: KVCache, batch: int) -> float:
    """Bytes a ``KVCache`` holds per cached token of one sequence: every layer's keys and values, counted from
    the tensors themselves (``nbytes``), divided by ``batch × cache.length``.

    Shape:
        cache with every layer's k, v: (B, H_kv, S, Dh) -> float
    """
    held = sum(k.nbytes + v.nbytes for k, v in zip(cache.keys, cache.values, strict=True) if k is not None)
    return held / (batch * cache.length)


def mha_to_gqa(mha: GroupedQueryAttention, n_heads: int, n_kv_heads: int) -> GroupedQueryAttention:
    """Turn multi-head attention into grouped-query attention by mean-pooling key/value heads (find the bug).

    As Ainslie et al. (2023) convert a trained multi-head checkpoint (then train it briefly): ``mha`` is a
    ``GroupedQueryAttention(D, n_heads, n_heads)``; the result is a new ``GroupedQueryAttention(D, n_heads,
    n_kv_heads)`` whose ``q_proj`` and ``out_proj`` are copies of ``mha``'s, and whose key (and value) head j is
    the mean of ``mha``'s key (value) heads ``j·g .. j·g + g - 1``, g = n_heads // n_kv_heads: exactly the query
    heads it will serve. So an ``mha`` whose heads already agree within each group converts exactly (the same
    outputs). ``mha`` is unchanged.

    Shape:
        k_proj, v_proj weights (n_heads·Dh, D) -> (n_kv_heads·Dh, D); q_proj, out_proj (D, D) copied
    """
    D = mha.q_proj.in_features
    Dh, group = D // n_heads, n_heads // n_kv_heads
    gqa = GroupedQueryAttention(D, n_heads, n_kv_heads)
    with torch.no_grad():
        gqa.q_proj.weight.copy_(mha.q_proj.weight)
        gqa.out_proj.weight.copy_(mha.out_proj.weight)
        for name in ("k_proj", "v_proj"):
            w = getattr(mha, name).weight  # (H·Dh, D): head h owns rows h·Dh .. (h+1)·Dh - 1
            ### BEGIN SOLUTION
            heads = w.reshape(n_kv_heads, group, Dh, D)  # (H_kv, g, Dh, D): group j holds heads j·g .. j·g + g - 1
            ### END SOLUTION
            ### BEGIN BUG
            # heads = w.reshape(group, n_kv_heads, Dh, D).transpose(0, 1)  # (H_kv, g, Dh, D)
            ### END BUG
            pooled = heads.mean(dim=1)  # (H_kv, Dh, D): each group's heads averaged
            getattr(gqa, name).weight.copy_(pooled.reshape(n_kv_heads * Dh, D))
    return gqa


# -- known mistakes ------------------------------------------------------------------------------------------------
# Realistic wrong answers, each this module's code with a few lines changed: (item, what is wrong, (old, new), ...),
# applied by autograder.course.mutants.patched (each old must occur exactly once in the item's code, so an edit above
# that
# moves a line breaks its mistake loudly). (item, what is wrong) alone is the bug a find-the-bug exercise's release
# shows. Every one must cost its own item and no other, in both layers of checks (tests/test_hidden_checks.py,
# tests/test_visible_catch_rate.py); whole wrong answers of another structure live in autograder/course/mutants/.
MISTAKES = [
    ("RMSNorm", "subtracts the mean first (LayerNorm without a bias)",
     ("rms = torch.sqrt(", "h = h - h.mean(dim=-1, keepdim=True)\n        rms = torch.sqrt(")),
    ("RMSNorm", "eps added outside the square root",
     ("torch.sqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.eps)",
      "h.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.eps")),
    ("RMSNorm", "no eps inside the square root: a tiny position is blown up, an all-zero one is 0 / 0 (NaN)",
     ("torch.sqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.eps)", "torch.sqrt(h.pow(2).mean(dim=-1, keepdim=True))")),
    ("RMSNorm", "a bfloat16 input comes back float32 (the float32 weight promotes it)",
     ("return (h / rms * self.weight).to(x.dtype)", "return h / rms * self.weight")),
    ("rotary_embedding", "pairs dimension i with i + Dh/2 (rotate-half) instead of (2i, 2i+1)",
     ("a, b = x[..., 0::2].float(), x[..., 1::2].float()",
      "a, b = x[..., : Dh // 2].float(), x[..., Dh // 2:].float()"),
     ("rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)",
      "rotated = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)"),
     ("return rotated.flatten(-2).to(x.dtype)", "return rotated.to(x.dtype)")),
    ("rotary_embedding", "the rotated pairs' halves concatenated (torch.cat), not put back in pairs: right angles, "
                         "wrong order",
     ("rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)",
      "rotated = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)"),
     ("return rotated.flatten(-2).to(x.dtype)", "return rotated.to(x.dtype)")),
    ("rotary_embedding", "ignores positions: rotates row t by t",
     ("angles = positions.to(x.device, torch.float32)[:, None] * theta",
      "angles = torch.arange(x.shape[-2], device=x.device, dtype=torch.float32)[:, None] * theta")),
    ("rotary_embedding", "frequencies base^(-i/Dh) instead of base^(-2i/Dh)",
     ("theta = base ** (-2 * i / Dh)", "theta = base ** (-i / Dh)")),
    ("rotary_embedding", "rotates the wrong way: (a, b) -> (a cos + b sin, -a sin + b cos)",
     ("rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)",
      "rotated = torch.stack([a * cos + b * sin, -a * sin + b * cos], dim=-1)")),
    ("SwiGLUFeedForward", "ReLU instead of SiLU on the gate",
     ("hidden = F.silu(self.gate_proj(x)) * self.up_proj(x)",
      "hidden = torch.relu(self.gate_proj(x)) * self.up_proj(x)")),
    ("SwiGLUFeedForward", "SiLU on the up projection, not on the gate",
     ("hidden = F.silu(self.gate_proj(x)) * self.up_proj(x)",
      "hidden = self.gate_proj(x) * F.silu(self.up_proj(x))")),
    ("SwiGLUFeedForward", "a sigmoid gate (GLU) instead of SiLU",
     ("hidden = F.silu(self.gate_proj(x)) * self.up_proj(x)",
      "hidden = torch.sigmoid(self.gate_proj(x)) * self.up_proj(x)")),
    ("GroupedQueryAttention", "tiles the key/value heads (repeat) instead of repeat_interleave",
     ("k = k.repeat_interleave(group, dim=1)", "k = k.repeat(1, group, 1, 1)"),
     ("v = v.repeat_interleave(group, dim=1)", "v = v.repeat(1, group, 1, 1)")),
    ("GroupedQueryAttention", "rotates the queries only, not the keys",
     ("q, k = rotary_embedding(q, positions), rotary_embedding(k, positions)", "q = rotary_embedding(q, positions)")),
    ("sliding_window_mask", "off by one: window + 1 keys (t - s <= window)",
     ("(t - s < window)", "(t - s <= window)")),
    ("sliding_window_mask", "off by one: window - 1 keys (t - s < window - 1), the oldest key of the window dropped",
     ("(t - s < window)", "(t - s < window - 1)")),
    ("sliding_window_mask", "not causal: |t - s| < window",
     ("return (s <= t) & (t - s < window)", "return (t - s).abs() < window")),
    ("ModernBlock", "post-norm: normalises after each residual addition",
     ("x = x + self.attn(self.attn_norm(x), positions, allowed, cache, layer_idx)",
      "x = self.attn_norm(x + self.attn(x, positions, allowed, cache, layer_idx))"),
     ("return x + self.feed_forward(self.ffn_norm(x))", "return self.ffn_norm(x + self.feed_forward(x))")),
    ("ModernBlock", "positions not passed to the attention (no RoPE at all)",
     ("x = x + self.attn(self.attn_norm(x), positions, allowed, cache, layer_idx)",
      "x = x + self.attn(self.attn_norm(x), allowed=allowed, cache=cache, layer_idx=layer_idx)")),
    ("ModernBlock", "RMSNorm(d_model) built without the block's eps: the argument is silently ignored",
     ("self.attn_norm = RMSNorm(d_model, eps)", "self.attn_norm = RMSNorm(d_model)"),
     ("self.ffn_norm = RMSNorm(d_model, eps)", "self.ffn_norm = RMSNorm(d_model)")),
    ("ModernBlock", "the cache not passed on to the attention: a cached step sees only its own new tokens",
     ("self.attn(self.attn_norm(x), positions, allowed, cache, layer_idx)",
      "self.attn(self.attn_norm(x), positions, allowed)")),
    ("ModernBlock", "one norm for both sublayers (attn_norm before the feed-forward too)",
     ("return x + self.feed_forward(self.ffn_norm(x))", "return x + self.feed_forward(self.attn_norm(x))")),
    ("mha_to_gqa",
     "pools heads j, j + n_kv_heads, ... (repeat's layout), not the consecutive heads kv head j serves"),
    ("mha_to_gqa", "a wrong fix: keeps the first head of each group instead of the mean",
     ("pooled = heads.mean(dim=1)", "pooled = heads[:, 0]")),
    ("mha_to_gqa", "a wrong fix: sums each group's heads instead of averaging them",
     ("pooled = heads.mean(dim=1)", "pooled = heads.sum(dim=1)")),
    ("mha_to_gqa",
     "a wrong fix: (n_kv_heads, Dh, g, D): averages rows across a group's heads, not whole heads",
     ("heads = w.reshape(n_kv_heads, group, Dh, D)", "heads = w.reshape(n_kv_heads, Dh, group, D).transpose(1, 2)")),
]
