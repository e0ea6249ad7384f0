"""decoder_course.twins: the course's modules and PyTorch's own agree once the weights are renamed and packed."""

import numpy as np
import pytest
import torch
from torch import nn

from autograder.course.reference.decoder_layer import DecoderLayer
from autograder.course.reference.model import EncoderLayer
from autograder.course.reference.multi_head import MultiHeadAttention
from decoder_course import twins

D, H, F = 8, 2, 16


def _randomised(module: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + 0.1)  # biases far from 0, norms far from 1
    return module.eval()


def test_attention_twin_matches_ours():
    ours = _randomised(MultiHeadAttention(D, H), 0)
    theirs = twins.torch_twin(ours.state_dict(), "attention", H)
    q, kv = torch.randn(2, 3, D), torch.randn(2, 5, D)
    out, weights = ours(q, kv, kv)
    want, want_w = theirs(q, kv, kv, average_attn_weights=False)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(weights, want_w)


@pytest.mark.parametrize("norm_first", [False, True])
def test_layer_twins_match_ours(norm_first):
    x, memory = torch.randn(2, 4, D), torch.randn(2, 6, D)
    enc = _randomised(EncoderLayer(D, H, F, norm_first=norm_first), 1)
    theirs = twins.torch_twin(enc.state_dict(), "encoder", H, d_ff=F, norm_first=norm_first)
    torch.testing.assert_close(enc(x), theirs(x))
    dec = _randomised(DecoderLayer(D, H, F, norm_first=norm_first), 2)
    theirs = twins.torch_twin(dec.state_dict(), "decoder", H, d_ff=F, norm_first=norm_first)
    torch.testing.assert_close(dec(x, memory), theirs(x, memory))


@pytest.mark.parametrize("kind,module", [("attention", lambda: nn.MultiheadAttention(D, H, batch_first=True)),
                                         ("encoder", lambda: nn.TransformerEncoderLayer(D, H, F, batch_first=True)),
                                         ("decoder", lambda: nn.TransformerDecoderLayer(D, H, F, batch_first=True))])
def test_round_trip_on_tensors_and_arrays(kind, module):
    theirs = module().state_dict()
    ours = twins.from_torch(theirs, kind)
    assert not any("in_proj" in key for key in ours)
    back = twins.to_torch(ours, kind)
    assert back.keys() == theirs.keys()
    for key in theirs:
        torch.testing.assert_close(back[key], theirs[key])
    arrays = twins.to_torch({key: value.numpy() for key, value in ours.items()}, kind)
    for key in theirs:
        np.testing.assert_array_equal(arrays[key], theirs[key].numpy())


def test_entries_without_a_twin_are_left_out():
    ours = _randomised(MultiHeadAttention(D, H), 3)
    ours.register_buffer("scale", torch.tensor(2.0))  # a student's own extra state
    assert "scale" not in twins.to_torch(ours.state_dict(), "attention")
    twins.torch_twin(ours.state_dict(), "attention", H)  # loads strictly: nothing missing, nothing extra


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind is one of"):
        twins.to_torch({}, "decoder-only")
