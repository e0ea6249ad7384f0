"""Static policy: an exercise that asks you to write X fails when its submitted cell calls PyTorch's X."""

import nbformat

from autograder import verdicts
from autograder.checks.framework import Case, Exercise, Verdict

FORBIDDEN = ("F.scaled_dot_product_attention", "nn.MultiheadAttention")


def test_aliases_attributes_and_imports_are_found():
    assert verdicts.forbidden_uses(
        "import torch.nn.functional as Fn\ndef f(q, k, v):\n    return Fn.scaled_dot_product_attention(q, k, v)",
        FORBIDDEN) == ["F.scaled_dot_product_attention"]
    assert verdicts.forbidden_uses("from torch.nn import MultiheadAttention as M", FORBIDDEN) == \
        ["nn.MultiheadAttention"]
    assert verdicts.forbidden_uses("%time x = nn.MultiheadAttention(4, 2)", FORBIDDEN) == ["nn.MultiheadAttention"]


def test_honest_code_is_not_flagged():
    honest = "def attention(q, k, v):\n    scores = q @ k.transpose(-2, -1)  # scaled dot product\n    return scores"
    assert verdicts.forbidden_uses(honest, FORBIDDEN) == []
    assert verdicts.forbidden_uses("x = nn.MultiheadAttention(4, 2)", ()) == []
    # The student's own function of the same short name is not PyTorch's.
    own = "def scaled_dot_product_attention(q, k, v):\n    return q\n\nscaled_dot_product_attention(1, 2, 3)"
    assert verdicts.forbidden_uses(own, FORBIDDEN) == []


class _Passing(Exercise):
    name = "attention"
    forbidden = FORBIDDEN

    def cases(self, rng):
        return [Case("c0", "B=2")]

    def judge(self, result):  # would pass if reached: the policy must decide first
        return None


def test_policy_verdict_comes_before_values(tmp_path, monkeypatch):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("def attention(q, k, v):\n    return F.scaled_dot_product_attention(q, k, v)")
    cell.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "attention_solution"}
    nb.cells.append(cell)
    plan = verdicts.Plan("02-attention", tmp_path, {"attention": (_Passing(), [Case("c0", "B=2")])},
                         verdicts.solution_sources(nb))
    monkeypatch.setattr(verdicts, "run_judge", lambda *a: Verdict(True, "values fine"))
    decided = verdicts.decide(plan)
    assert not decided["attention"].passed
    assert "write it yourself" in decided["attention"].message
    # The same plan without the forbidden call is judged on its values.
    cell.source = "def attention(q, k, v):\n    return q @ k.T @ v"
    plan.sources = verdicts.solution_sources(nb)
    assert verdicts.decide(plan)["attention"].passed
