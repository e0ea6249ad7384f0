"""The visible side of the grader's policy: MultiHeadAttention and CrossAttention written with PyTorch's attention
pass every other visible check, so their last check watches the student's module run and names the call the grader
refuses (``decoder_course.spec.refuse_forbidden``, ``decoder_course.guard.watching``). Several ways of reaching
it, each caught; the reference passes; the profile function in place before is put back."""

import sys

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling
from torch import nn

from autograder.course.reference import cross_attention as xref
from autograder.course.reference import multi_head as ref
from decoder_course.checks import CheckFailed
from decoder_course.guard import watching
from decoder_course.visible import l03_multi_head, l04_cross_attention

sdpa = F.scaled_dot_product_attention  # bound before any check runs, as a student's import would be


def _heads(mha, query, key, value):
    return (ref.split_heads(mha.q_proj(query), mha.n_heads), ref.split_heads(mha.k_proj(key), mha.n_heads),
            ref.split_heads(mha.v_proj(value), mha.n_heads))


def on_pytorchs_attention(attend):
    """A MultiHeadAttention whose output comes from ``attend`` (PyTorch's SDPA, reached one way or another) wherever
    its result equals the course's (no mask, eval mode): every other visible check passes."""

    class OnPyTorchsAttention(ref.MultiHeadAttention):
        def forward(self, query, key, value, allowed=None):
            out, weights = super().forward(query, key, value, allowed)
            if allowed is None and not self.training:
                q, k, v = _heads(self, query, key, value)
                out = self.out_proj(ref.merge_heads(attend(q, k, v)))
            return out, weights

    return OnPyTorchsAttention


ThroughF = on_pytorchs_attention(lambda q, k, v: F.scaled_dot_product_attention(q, k, v))
ThroughAlias = on_pytorchs_attention(sdpa)  # a name bound at import: from torch.nn.functional import ... as sdpa
# a name built at run time
ThroughGetattr = on_pytorchs_attention(lambda q, k, v: getattr(F, "scaled_dot_" + "product_attention")(q, k, v))


class WrapsTorchModule(ref.MultiHeadAttention):
    """Builds nn.MultiheadAttention beside its own projections (and never uses its result)."""

    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__(d_model, n_heads, dropout)
        self._unused = [nn.MultiheadAttention(d_model, n_heads, batch_first=True)]


class CrossThroughF(xref.CrossAttention):
    def forward(self, query, memory=None, allowed=None, memory_kv=None):
        out, weights = super().forward(query, memory=memory, allowed=allowed, memory_kv=memory_kv)
        if allowed is None and not self.training:
            k, v = memory_kv if memory_kv is not None else self.project_memory(memory)
            q = ref.split_heads(self.q_proj(query), self.n_heads)
            out = self.out_proj(ref.merge_heads(F.scaled_dot_product_attention(q, k, v)))
        return out, weights


@pytest.mark.parametrize(("cls", "called"), [
    (ThroughF, "F.scaled_dot_product_attention"), (ThroughAlias, "F.scaled_dot_product_attention"),
    (ThroughGetattr, "F.scaled_dot_product_attention"), (WrapsTorchModule, "nn.MultiheadAttention")])
def test_multi_head_attention_on_pytorchs_attention_fails_its_last_visible_check(cls, called, capsys):
    with pytest.raises(CheckFailed) as failed:
        l03_multi_head.check_multi_head_attention(cls)
    message = str(failed.value)
    assert f"your MultiHeadAttention calls {called}" in message and "the grader refuses it here" in message
    printed = capsys.readouterr().out
    assert "✓ MultiHeadAttention refuses to be built with d_model=10" in printed, "every other check passed first"
    assert sys.getprofile() is None


def test_cross_attention_on_pytorchs_attention_fails_its_last_visible_check(capsys):
    with pytest.raises(CheckFailed, match="your CrossAttention calls F.scaled_dot_product_attention"):
        l04_cross_attention.check_cross_attention(CrossThroughF)


def test_the_references_pass_and_are_told_so(capsys):
    l03_multi_head.check_multi_head_attention(ref.MultiHeadAttention)
    l04_cross_attention.check_cross_attention(xref.CrossAttention)
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == ("✓ CrossAttention is written without nn.MultiheadAttention, "
                           "F.scaled_dot_product_attention, F.multi_head_attention_forward")
    assert sum(line.startswith("✓ MultiHeadAttention is written without") for line in printed) == 1


def test_watching_reports_each_rule_once_and_puts_the_profile_function_back():
    calls = []

    def outer(frame, event, arg):
        calls.append(event)

    q = torch.randn(1, 1, 2, 4)
    sys.setprofile(outer)
    try:
        with watching(("F.scaled_dot_product_attention", "nn.MultiheadAttention")) as reached:
            sdpa(q, q, q)
            F.scaled_dot_product_attention(q, q, q)
            torch.softmax(q, -1)
        assert sys.getprofile() is outer
    finally:
        sys.setprofile(None)
    assert reached == ["F.scaled_dot_product_attention"]
    with watching(("F.scaled_dot_product_attention",)) as reached:
        torch.softmax(q, -1)
    assert reached == []
