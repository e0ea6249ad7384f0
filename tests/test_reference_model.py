"""Lessons 06–07 references (model, training), proven against PyTorch and the paper's formula.

The decoder stack is compared with ``nn.TransformerDecoder`` holding the same weights; the loss with
``F.cross_entropy``; the position table with the paper's formula written out in NumPy float64.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograder.course.reference import model as ref
from autograder.course.reference import training as tr
from autograder.course.reference.decoder_layer import load_from_torch_decoder_layer
from decoder_course import twins
from decoder_course.data import get_task

BOS, EOS = 1, 2


def make_model(seed=0, **overrides):
    """A small model (D=32, 4 heads, F=64, 2+2 layers) in eval mode, deterministic per seed."""
    torch.manual_seed(seed)
    settings = dict(src_vocab=17, tgt_vocab=19, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.1)
    settings.update(overrides)
    return ref.Seq2SeqTransformer(**settings).eval()


def make_batch(B=3, S=6, T=5, src_lengths=(6, 4, 2), tgt_lengths=(5, 3, 4), seed=1, pad_id=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 17, (B, S), generator=g)
    tgt = torch.cat([torch.full((B, 1), BOS), torch.randint(3, 19, (B, T - 1), generator=g)], dim=1)
    src_is_real = torch.arange(S)[None] < torch.tensor(src_lengths)[:, None]  # (B, S)
    tgt_is_real = torch.arange(T)[None] < torch.tensor(tgt_lengths)[:, None]  # (B, T)
    return (
        src.masked_fill(~src_is_real, pad_id),
        tgt.masked_fill(~tgt_is_real, pad_id),
        src_is_real,
        tgt_is_real,
    )


# ------------------------------------------------------------------------------------------------------------
# lesson 06: positional encoding
# ------------------------------------------------------------------------------------------------------------


def paper_table(max_len, D):
    """PE[pos, 2i] = sin(pos / 10000^(2i/D)), PE[pos, 2i+1] = cos(pos / 10000^(2i/D)), entry by entry."""
    table = np.zeros((max_len, D))
    for pos in range(max_len):
        for j in range(D):
            two_i = j - j % 2
            angle = pos / 10000 ** (two_i / D)
            table[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return table


@pytest.mark.parametrize("max_len, D", [(50, 16), (30, 7), (2000, 8)])
def test_sinusoidal_table_is_the_papers_formula(max_len, D):
    table = ref.sinusoidal_table(max_len, D)
    assert table.shape == (max_len, D) and table.dtype == torch.float32
    # float32 angles of positions up to 2000: the sine of a large angle is accurate to ~1e-4 in float32
    atol = 1e-5 if max_len <= 100 else 5e-4
    np.testing.assert_allclose(table.numpy(), paper_table(max_len, D), atol=atol, rtol=0)


def test_positional_encoding_adds_the_first_T_rows_as_a_buffer():
    pe = ref.PositionalEncoding(d_model=12, max_len=40)
    assert "pe" in dict(pe.named_buffers()) and "pe" in pe.state_dict(), "the table must be a buffer"
    assert not any(True for _ in pe.parameters()), "the table must not be a trained parameter"
    assert pe.pe.shape == (40, 12)
    x = torch.randn(3, 9, 12)
    before = x.clone()
    out = pe(x)
    assert torch.equal(x, before), "PositionalEncoding changed its input"
    np.testing.assert_allclose((out - x).numpy(), np.broadcast_to(paper_table(9, 12), (3, 9, 12)), atol=1e-5)
    with pytest.raises(ValueError, match="max_len"):
        pe(torch.zeros(1, 41, 12))
    # dropout is applied after the addition, in training mode only
    dropped = ref.PositionalEncoding(12, 40, dropout=0.5).train()(torch.ones(2, 9, 12))
    assert (dropped == 0).float().mean() > 0.2


# ------------------------------------------------------------------------------------------------------------
# lesson 06: decoder stack against nn.TransformerDecoder
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_equals_torch_transformer_decoder_with_copied_weights(norm_first):
    torch.manual_seed(0)
    D, H, Fw, N = 32, 4, 48, 3
    theirs = nn.TransformerDecoder(
        nn.TransformerDecoderLayer(D, H, Fw, dropout=0.1, batch_first=True, norm_first=norm_first),
        num_layers=N,
        norm=nn.LayerNorm(D) if norm_first else None,
    ).eval()
    # distinct LayerNorm parameters per layer, so that a layer-order mix-up is visible
    with torch.no_grad():
        for p in theirs.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    ours = ref.Decoder(D, H, Fw, N, dropout=0.1, norm_first=norm_first).eval()
    assert len(ours.layers) == N and isinstance(ours.layers, nn.ModuleList)
    for mine, their_layer in zip(ours.layers, theirs.layers, strict=True):
        load_from_torch_decoder_layer(mine, their_layer)
    if norm_first:
        assert isinstance(ours.norm, nn.LayerNorm)
        ours.norm.load_state_dict(theirs.norm.state_dict())
    else:
        assert isinstance(ours.norm, nn.Identity), "post-LN ends with a LayerNorm already: no final norm"

    B, T, S = 2, 5, 7
    x, memory = torch.randn(B, T, D), torch.randn(B, S, D)
    src_is_real = torch.tensor([[True] * 5 + [False] * 2, [True] * 7])  # (B, S)
    tgt_is_real = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])  # (B, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T) allowed
    self_allowed = causal[None, None] & tgt_is_real[:, None, None, :]  # (B, 1, T, T)
    cross_allowed = src_is_real[:, None, None, :]  # (B, 1, 1, S)
    with torch.no_grad():
        got = ours(x, memory, self_allowed, cross_allowed)
        # PyTorch's masks say True = blocked: the opposite of ours
        want = theirs(
            x,
            memory,
            tgt_mask=~causal,
            tgt_key_padding_mask=~tgt_is_real,
            memory_key_padding_mask=~src_is_real,
        )
    assert got.shape == (B, T, D)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------------------
# lesson 06: the full model
# ------------------------------------------------------------------------------------------------------------


def test_spec_system_gives_logits_of_shape_2_5_1000():
    torch.manual_seed(0)
    model = ref.Seq2SeqTransformer(1000, 1000, d_model=512, n_heads=8, d_ff=2048, n_layers=4).eval()
    assert len(model.decoder.layers) == 4 and isinstance(model.decoder.norm, nn.LayerNorm)
    src = torch.randint(3, 1000, (2, 7))
    tgt = torch.randint(3, 1000, (2, 5))
    src_is_real = torch.arange(7)[None] < torch.tensor([[5], [6]])  # (2, 7): 5 and 6 real tokens
    tgt_is_real = torch.arange(5)[None] < torch.tensor([[3], [4]])  # (2, 5): 3 and 4 real tokens
    with torch.no_grad():
        logits = model(src, tgt, src_is_real, tgt_is_real)
    assert logits.shape == (2, 5, 1000) and logits.dtype == torch.float32
    assert bool(torch.isfinite(logits).all())


def test_weight_tying_shares_one_storage_and_untied_does_not():
    tied, untied = make_model(tie_weights=True), make_model(tie_weights=False)
    assert tied.out_proj.weight is tied.tgt_embed.weight
    assert tied.out_proj.weight.data_ptr() == tied.tgt_embed.weight.data_ptr()
    assert untied.out_proj.weight.data_ptr() != untied.tgt_embed.weight.data_ptr()
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == 19 * 32, "tying must save exactly one (V, D) matrix"
    # one gradient step on the output layer moves the embedding too, only when tied
    for model in (tied, untied):
        before = model.tgt_embed.weight.detach().clone()
        src, tgt, src_is_real, _ = make_batch()
        model.train()
        loss = model(src, tgt, src_is_real)[:, -1].logsumexp(-1).sum()  # touches out_proj only through logits
        loss.backward()
        with torch.no_grad():
            model.out_proj.weight -= 0.1 * model.out_proj.weight.grad
        moved = not torch.equal(model.tgt_embed.weight.detach(), before)
        assert moved == (model is tied)


@pytest.mark.parametrize("norm_first", [True, False])
def test_no_causal_leakage_through_the_whole_model(norm_first):
    model = make_model(norm_first=norm_first)
    src, tgt, src_is_real, _ = make_batch(tgt_lengths=(5, 5, 5))
    with torch.no_grad():
        base = model(src, tgt, src_is_real)
        for t in range(tgt.shape[1] - 1):
            changed = tgt.clone()
            changed[:, t + 1 :] = (changed[:, t + 1 :] + 5) % 16 + 3  # new tokens at positions > t
            out = model(src, changed, src_is_real)
            torch.testing.assert_close(
                out[:, : t + 1],
                base[:, : t + 1],
                atol=1e-5,
                rtol=0,
                msg=f"logits at positions <= {t} changed when only positions > {t} changed",
            )
            assert not torch.allclose(out[:, t + 1], base[:, t + 1]), (
                "the changed position itself must matter"
            )


def test_no_padding_leakage_from_source_or_target_padding():
    model = make_model()
    src, tgt, src_is_real, tgt_is_real = make_batch()
    with torch.no_grad():
        base = model(src, tgt, src_is_real, tgt_is_real)
        # new ids under the padding
        other_src = torch.where(src_is_real, src, torch.randint(3, 17, src.shape))
        out = model(other_src, tgt, src_is_real, tgt_is_real)
        torch.testing.assert_close(out, base, atol=1e-5, rtol=0, msg="source padding leaked into the logits")
        assert not torch.allclose(model(other_src, tgt, None, tgt_is_real), base, atol=1e-3), (
            "without src_is_real the padding must matter (else this test proves nothing)"
        )
        # target padding in the middle: only the tgt_is_real mask can hide it from later real positions
        tgt_mid = torch.tensor([[True, True, False, False, True]] * 3)  # (B, T)
        other_tgt = torch.where(tgt_mid, tgt, torch.randint(3, 19, tgt.shape))
        a = model(src, tgt, src_is_real, tgt_mid)
        b = model(src, other_tgt, src_is_real, tgt_mid)
        torch.testing.assert_close(a[:, 4], b[:, 4], atol=1e-5, rtol=0, msg="target padding leaked")
        assert not torch.allclose(
            model(src, tgt, src_is_real)[:, 4], model(src, other_tgt, src_is_real)[:, 4]
        )
        # a query whose keys are all padding (left padding at position 0) stays finite
        left = torch.tensor([[False, True, True, True, True]] * 3)
        assert bool(torch.isfinite(model(src, tgt, src_is_real, left)).all())


def test_gradients_are_finite_and_reach_every_parameter():
    model = make_model().train()
    src, tgt, src_is_real, tgt_is_real = make_batch()
    logits = model(src, tgt, src_is_real, tgt_is_real)
    F.cross_entropy(logits.reshape(-1, 19), tgt.reshape(-1), ignore_index=0).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert bool(torch.isfinite(p.grad).all()), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


def test_eval_is_deterministic_and_train_mode_uses_dropout():
    model = make_model(dropout=0.3)
    src, tgt, src_is_real, tgt_is_real = make_batch()
    with torch.no_grad():
        a, b = model(src, tgt, src_is_real, tgt_is_real), model(src, tgt, src_is_real, tgt_is_real)
        assert torch.equal(a, b), "eval mode must be deterministic"
        model.train()
        c, d = model(src, tgt, src_is_real, tgt_is_real), model(src, tgt, src_is_real, tgt_is_real)
    assert not torch.equal(c, d), "train mode with dropout 0.3 gave identical outputs: is dropout wired in?"


def test_encode_decode_forward_agree_and_embeddings_are_not_scaled_by_default():
    model = make_model()
    src, tgt, src_is_real, tgt_is_real = make_batch()
    with torch.no_grad():
        memory = model.encode(src, src_is_real)
        assert memory.shape == (3, 6, 32)
        torch.testing.assert_close(
            model.decode(tgt, memory, src_is_real, tgt_is_real), model(src, tgt, src_is_real, tgt_is_real)
        )
    seen = []
    for scale_embedding, factor in [(False, 1.0), (True, math.sqrt(32))]:
        m = make_model(scale_embedding=scale_embedding)
        hook = m.pos_encoding.register_forward_hook(lambda mod, inputs, out: seen.append(inputs[0]))
        with torch.no_grad():
            m.decode(tgt, memory)
        hook.remove()
        torch.testing.assert_close(seen[-1], m.tgt_embed(tgt) * factor)


def _torch_logits(model, src, tgt, src_is_real, tgt_is_real):
    """The model's logits with each of its layers replaced by PyTorch's own twin (decoder_course.twins)."""
    H, F_ = model.decoder.layers[0].self_attn.n_heads, model.decoder.layers[0].feed_forward.linear1.out_features
    S, T = src.shape[1], tgt.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    with torch.no_grad():
        x = model.src_embed(src) + model.pos_encoding.pe[:S]  # (B, S, D)
        for layer in model.encoder.layers:  # PyTorch's masks: True = blocked / padding
            x = twins.torch_twin(layer.state_dict(), "encoder", H, d_ff=F_, norm_first=True)(
                x, src_key_padding_mask=~src_is_real)
        x = model.encoder.norm(x)
        y = model.tgt_embed(tgt) + model.pos_encoding.pe[:T]  # (B, T, D)
        for layer in model.decoder.layers:
            y = twins.torch_twin(layer.state_dict(), "decoder", H, d_ff=F_, norm_first=True)(
                y, x, tgt_mask=~causal, tgt_key_padding_mask=~tgt_is_real, memory_key_padding_mask=~src_is_real)
        return model.out_proj(model.decoder.norm(y))  # (B, T, V)


def test_logits_from_ids_equals_torch_layers_with_the_masks_made_from_pad_id():
    model, pad_id = make_model(seed=3), 7  # a pad id other than 0
    src, tgt, src_is_real, tgt_is_real = make_batch(pad_id=pad_id)
    src = torch.where(src_is_real & (src == pad_id), 8, src)  # real tokens never hold pad_id
    tgt = torch.where(tgt_is_real & (tgt == pad_id), 8, tgt)
    before = (src.clone(), tgt.clone())
    with torch.no_grad():
        got = ref.logits_from_ids(model, src, tgt, pad_id)
        torch.testing.assert_close(got, model(src, tgt, src_is_real, tgt_is_real))
    torch.testing.assert_close(got, _torch_logits(model, src, tgt, src_is_real, tgt_is_real), atol=1e-5, rtol=1e-5)
    assert torch.equal(src, before[0]) and torch.equal(tgt, before[1])


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_equals_torch_encoder_layer_with_copied_weights(norm_first):
    torch.manual_seed(3)
    B, S, D, H, F_ = 3, 7, 32, 4, 48
    theirs = nn.TransformerEncoderLayer(D, H, F_, dropout=0.1, batch_first=True, norm_first=norm_first).eval()
    with torch.no_grad():  # LayerNorms away from the identity, so a swapped norm1/norm2 shows
        for norm in (theirs.norm1, theirs.norm2):
            norm.weight.normal_(1.0, 0.3)
            norm.bias.normal_(0.0, 0.3)
    ours = ref.load_from_torch_encoder_layer(ref.EncoderLayer(D, H, F_, norm_first=norm_first), theirs).eval()
    assert set(ours.state_dict()) == {
        f"{sub}.{p}" for sub in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
                                 "feed_forward.linear1", "feed_forward.linear2", "norm1", "norm2")
        for p in ("weight", "bias")
    }
    x = torch.randn(B, S, D) * torch.tensor([0.3, 1.0, 5.0])[:, None, None]  # rows of different scale
    is_real = torch.arange(S)[None] < torch.tensor([[7], [4], [1]])  # (B, S): one row with a single real token
    before = x.clone()
    with torch.no_grad():
        got = ours(x, is_real)
        # PyTorch's key padding mask means True = ignore: ours inverted here, at the boundary
        want = theirs(x, src_key_padding_mask=~is_real)
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    assert torch.equal(x, before), "EncoderLayer changed its input"
    # every position (padded queries too) equals PyTorch's, whose padded queries also read the real keys
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    other = x.clone()
    other[~is_real] = torch.randn(int((~is_real).sum()), D) * 3.0  # new values under the padding only
    with torch.no_grad():
        torch.testing.assert_close(ours(other, is_real)[is_real], got[is_real], rtol=1e-5, atol=1e-5)
    ours.train()
    assert not torch.allclose(ours(x, is_real), ours(x, is_real)), "dropout should act in training mode"


def test_encoder_matches_torch_with_inverted_padding_polarity():
    torch.manual_seed(3)
    enc = ref.Encoder(32, 4, 64, 2, dropout=0.0).eval()
    x = torch.randn(2, 6, 32)
    is_real = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
    theirs = nn.TransformerEncoder(layer, num_layers=2, norm=enc.norm, enable_nested_tensor=False).eval()
    for our_layer, their_layer in zip(enc.layers, theirs.layers, strict=True):
        ref.load_from_torch_encoder_layer(our_layer, their_layer)
    assert all(isinstance(layer, ref.EncoderLayer) for layer in enc.layers), "no part of the encoder is PyTorch's"
    with torch.no_grad():
        torch.testing.assert_close(enc(x, is_real), theirs(x, src_key_padding_mask=~is_real), rtol=1e-5, atol=1e-5)


def test_no_module_of_the_model_is_pytorchs_transformer():
    model = make_model()
    kinds = {type(m).__name__ for m in model.modules()}
    assert not {name for name in kinds if name.startswith("Transformer") or name == "MultiheadAttention"}, kinds


# ------------------------------------------------------------------------------------------------------------
# lesson 07: teacher forcing, loss, exact match
# ------------------------------------------------------------------------------------------------------------


def test_shift_right_by_example():
    tgt = torch.tensor([[5, 6, 7, 2, 9, 9], [8, 2, 9, 9, 9, 9]])  # pad id 9 here, EOS 2
    before = tgt.clone()
    out = tr.shift_right(tgt, bos_id=1)
    assert torch.equal(tgt, before), "shift_right changed its input"
    assert out.tolist() == [[1, 5, 6, 7, 2, 9], [1, 8, 2, 9, 9, 9]]
    assert out.dtype == tgt.dtype
    assert tr.shift_right(tgt.int(), 4).dtype == torch.int32
    assert tr.shift_right(torch.tensor([[3]]), 1).tolist() == [[1]]


@pytest.mark.parametrize("pad_id", [0, 3, -100])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.35])
def test_sequence_loss_equals_torch_cross_entropy_with_gradients(pad_id, label_smoothing):
    g = torch.Generator().manual_seed(0)
    B, T, V = 3, 6, 11
    logits = (torch.randn(B, T, V, generator=g, dtype=torch.float64) * 3).requires_grad_()
    targets = torch.randint(0, V, (B, T), generator=g)
    targets[targets == pad_id] = 4  # no accidental padding; then a different amount per row
    targets[0, 4:] = pad_id
    targets[1, 1:] = pad_id
    ours = tr.sequence_loss(logits, targets, pad_id, label_smoothing)
    (grad_ours,) = torch.autograd.grad(ours, logits)
    theirs = F.cross_entropy(
        logits.reshape(-1, V), targets.reshape(-1), ignore_index=pad_id, label_smoothing=label_smoothing
    )
    (grad_theirs,) = torch.autograd.grad(theirs, logits)
    assert ours.dim() == 0
    torch.testing.assert_close(ours, theirs, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(grad_ours, grad_theirs, atol=1e-10, rtol=1e-10)


def test_sequence_loss_without_real_tokens_is_zero_not_nan():
    loss = tr.sequence_loss(torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), pad_id=0)
    assert loss.item() == 0.0


def test_exact_match_counts_sequences_equal_up_to_and_including_eos():
    pad, eos = 9, 2
    target = torch.tensor([[5, 6, 2, 9], [7, 2, 9, 9], [4, 4, 4, 2], [3, 2, 9, 9]])
    pred = torch.tensor(
        [
            [5, 6, 2, 9, 9],  # right, longer
            [7, 2, 5, 5, 5],  # right: anything after EOS is ignored
            [4, 4, 4, 9, 9],  # wrong: no EOS where the target has one
            [3, 3, 2, 9, 9],  # wrong token before EOS
        ]
    )
    assert tr.exact_match(pred, target, pad, eos) == pytest.approx(0.5)
    assert isinstance(tr.exact_match(pred, target, pad, eos), float)
    # early EOS is wrong; a shorter prediction is padded, then compared
    assert tr.exact_match(torch.tensor([[5, 2]]), torch.tensor([[5, 6, 2]]), pad, eos) == 0.0
    assert tr.exact_match(torch.tensor([[5, 6, 2]]), torch.tensor([[5, 6, 2, 9, 9]]), pad, eos) == 1.0
    assert tr.exact_match(torch.tensor([[5, 6]]), torch.tensor([[5, 6, 2]]), pad, eos) == 0.0


def test_peeking_ablation_really_lets_the_future_leak():
    model = make_model()
    peeking = tr.PeekingSeq2SeqTransformer(17, 19, 32, 4, 64, 2).eval()
    peeking.load_state_dict(model.state_dict())
    src, tgt, src_is_real, _ = make_batch(tgt_lengths=(5, 5, 5))
    changed = tgt.clone()
    changed[:, 3:] = 3
    with torch.no_grad():
        assert torch.allclose(
            model(src, tgt, src_is_real)[:, :3], model(src, changed, src_is_real)[:, :3], atol=1e-5
        )
        assert not torch.allclose(
            peeking(src, tgt, src_is_real)[:, :3], peeking(src, changed, src_is_real)[:, :3]
        )


@pytest.mark.parametrize("clip_norm", [0.05, 1e6])
def test_train_step_equals_a_step_written_with_torch_ops(clip_norm):
    # the independent step: F.cross_entropy on the rolled target, clip_grad_norm_, SGD; on copied weights
    ours, theirs = make_model(seed=4, dropout=0.0).train(), make_model(seed=4, dropout=0.0).train()
    src, tgt, src_is_real, _ = make_batch(pad_id=0)
    batch = {"src_ids": src, "src_is_real": src_is_real, "tgt_ids": tgt}
    before = {name: t.clone() for name, t in batch.items()}
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.5)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.5)
    for p in ours.parameters():  # stale gradients from an earlier step must not leak into this one
        p.grad = torch.ones_like(p)
    loss = tr.train_step(ours, batch, opt_ours, clip_norm)
    decoder_in = torch.cat([torch.full_like(tgt[:, :1], BOS), tgt[:, :-1]], dim=1)
    logits = theirs(src, decoder_in, src_is_real=src_is_real)
    want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=0)
    want.backward()
    norm = torch.nn.utils.clip_grad_norm_(theirs.parameters(), clip_norm)
    opt_theirs.step()
    assert isinstance(loss, float) and loss == pytest.approx(want.item(), rel=1e-6)
    assert ours.training, "train_step must not change the model's mode"
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} after the step")
    grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ours.parameters()]))
    assert grad_norm <= min(clip_norm, norm.item()) * (1 + 1e-5)
    assert (clip_norm < norm.item()) == (clip_norm == 0.05), "the small clip must bite, the large one not"
    assert all(torch.equal(batch[k], before[k]) for k in batch), "train_step changed the batch"


def test_validation_loss_is_torchs_mean_over_every_real_token_whatever_the_batching():
    # PyTorch's own loss, summed over the real tokens of every batch; the same pairs batched otherwise agree;
    # the buggy version the release shows (autograder.course.bugs) is right on batches of equal token counts only
    from autograder.course import notebooks

    task = get_task("reverse")
    pairs = task.make_pairs(11, rng=3, split="test")
    model = make_model(seed=2, src_vocab=len(task.src_vocab), tgt_vocab=len(task.tgt_vocab), dropout=0.3).train()
    cuts = {"one batch": [pairs], "4 + 7": [pairs[:4], pairs[4:]], "6 + 3 + 2": [pairs[:6], pairs[6:9], pairs[9:]]}
    values = {}
    for name, groups in cuts.items():
        batches = [task.make_batch(group) for group in groups]
        before = [{k: t.clone() for k, t in batch.items()} for batch in batches]
        values[name] = tr.validation_loss(model, batches)
        assert isinstance(values[name], float)
        assert model.training, "validation_loss must put back the model's mode"
        assert all(torch.equal(b[k], a[k]) for b, a in zip(batches, before, strict=True) for k in b)
    model.eval()
    with torch.no_grad():
        batch = task.make_batch(pairs)
        tgt = batch["tgt_ids"]
        decoder_in = torch.cat([torch.full_like(tgt[:, :1], BOS), tgt[:, :-1]], dim=1)
        logits = model(batch["src_ids"], decoder_in, src_is_real=batch["src_is_real"])
        want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=0).item()
    for name, value in values.items():
        assert value == pytest.approx(want, rel=1e-5), name
    assert tr.validation_loss(model, []) == 0.0
    namespace = dict(vars(tr))
    exec(notebooks.buggy_source("07-training", "validation_loss"), namespace)  # noqa: S102 - our own code
    buggy = namespace["validation_loss"]
    assert buggy(model, [task.make_batch(pairs)]) == pytest.approx(want, rel=1e-5), "one batch: the bug is silent"
    assert abs(buggy(model, [task.make_batch(g) for g in cuts["6 + 3 + 2"]]) - want) > 1e-3, "the bug shows"


def test_quick_training_learns_to_copy_three_digits():
    # a tiny model, a few seconds on one core: proves that the loop, the loss and the masks work together
    task = get_task("copy", min_len=3, max_len=3)
    torch.manual_seed(0)
    model = ref.Seq2SeqTransformer(
        len(task.src_vocab), len(task.tgt_vocab), d_model=32, n_heads=2, d_ff=64, n_layers=1, dropout=0.0
    )
    history = tr.train(
        model,
        task,
        steps=400,
        batch_size=64,
        warmup_steps=30,
        eval_every=50,
        eval_pairs=200,
        target_exact_match=0.9,
        progress=False,
        live=False,
    )
    losses = history["loss"][1]
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10]), "the loss did not fall"
    final = history["exact_match"][1][-1]
    assert final >= 0.8, f"held-out exact match only {final:.2f} after {history['loss'][0][-1]} steps"
    # evaluate_exact_match agrees with exact_match on a decoded batch
    pairs = task.make_pairs(100, rng=5, split="test")
    batch = task.make_batch(pairs)
    from autograder.course.reference.generation import greedy_decode

    pred = greedy_decode(model.eval(), batch["src_ids"], 4, BOS, EOS, src_is_real=batch["src_is_real"])
    assert tr.evaluate_exact_match(model, pairs, task) == pytest.approx(
        tr.exact_match(pred, batch["tgt_ids"], 0, EOS)
    )
