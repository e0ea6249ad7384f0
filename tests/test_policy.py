"""Static policy: an exercise that asks you to write X fails when its submitted cell calls PyTorch's X."""

import nbformat

from autograder import policy, verdicts
from autograder.checks.framework import Case, Exercise, Verdict

FORBIDDEN = ("F.scaled_dot_product_attention", "nn.MultiheadAttention")


def forbidden_uses(source: str, forbidden: tuple[str, ...]) -> list[str]:
    """The rules a cell breaks on its own (the exercise's code is the whole notebook)."""
    return sorted(policy.violations([source], [source], [], forbidden))


def test_aliases_attributes_and_imports_are_found():
    assert forbidden_uses(
        "import torch.nn.functional as Fn\ndef f(q, k, v):\n    return Fn.scaled_dot_product_attention(q, k, v)",
        FORBIDDEN) == ["F.scaled_dot_product_attention"]
    assert forbidden_uses("from torch.nn import MultiheadAttention as M", FORBIDDEN) == \
        ["nn.MultiheadAttention"]
    assert forbidden_uses("%time x = nn.MultiheadAttention(4, 2)", FORBIDDEN) == ["nn.MultiheadAttention"]


def test_honest_code_is_not_flagged():
    honest = "def attention(q, k, v):\n    scores = q @ k.transpose(-2, -1)  # scaled dot product\n    return scores"
    assert forbidden_uses(honest, FORBIDDEN) == []
    assert forbidden_uses("x = nn.MultiheadAttention(4, 2)", ()) == []
    # The student's own function of the same short name is not PyTorch's.
    own = "def scaled_dot_product_attention(q, k, v):\n    return q\n\nscaled_dot_product_attention(1, 2, 3)"
    assert forbidden_uses(own, FORBIDDEN) == []


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


# -- every form of reaching a forbidden name (issue 10, hole 7) --------------------------------------------------
SDPA = ("F.scaled_dot_product_attention",)
ANSWER = "def robust_attention(q, k, v, allowed=None):\n    return {call}\n"


def _reached(cells, answer, rules=SDPA, name="robust_attention"):
    return policy.violations([*cells, answer], [answer], [name], rules)


def test_an_alias_imported_in_another_cell_is_followed():
    cells = ["from torch.nn.functional import scaled_dot_product_attention as _attend"]
    assert "F.scaled_dot_product_attention" in _reached(cells, ANSWER.format(call="_attend(q, k, v)"))
    # the same import used by a comparison cell only, never by the answer, is fine
    assert _reached([*cells, "_attend(q, k, v)"], ANSWER.format(call="q")) == {}


def test_getattr_vars_and_dict_with_constant_strings_are_found():
    cells = ["import torch.nn.functional as Fn", "import torch"]
    for call in ('getattr(Fn, "scaled_dot_product_attention")(q, k, v)',
                 'vars(Fn)["scaled_dot_product_attention"](q, k, v)',
                 'Fn.__dict__["scaled_dot_product_attention"](q, k, v)',
                 'getattr(torch.nn.functional, "scaled_dot_" "product_attention")(q, k, v)'):
        assert "F.scaled_dot_product_attention" in _reached(cells, ANSWER.format(call=call)), call


def test_assigned_aliases_star_imports_and_globals_lookups_are_followed():
    cases = [
        (["import torch", "attend = torch.nn.functional.scaled_dot_product_attention"], "attend(q, k, v)"),
        (["import torch.nn.functional as Fn", "G = Fn"], "G.scaled_dot_product_attention(q, k, v)"),
        (["from torch.nn.functional import *"], "scaled_dot_product_attention(q, k, v)"),
        (["from torch.nn.functional import scaled_dot_product_attention as _a"], 'globals()["_a"](q, k, v)'),
        (["import torch.nn.functional as Fn",
          "def helper(q, k, v):\n    return Fn.scaled_dot_product_attention(q, k, v)"], "helper(q, k, v)"),
    ]
    for cells, call in cases:
        assert "F.scaled_dot_product_attention" in _reached(cells, ANSWER.format(call=call)), (cells, call)


def test_a_numpy_only_exercise_may_not_reach_torch_at_all():
    # the rule "torch." once matched nothing: any path to torch now counts, through the student's own classes too
    layer = ("import torch\nclass DecoderLayer(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
             "layer = DecoderLayer()")
    answer = "def numpy_decoder_layer(x, params):\n    return layer(torch.as_tensor(x)).numpy()\n"
    assert "torch." in _reached([layer], answer, ("torch.",), "numpy_decoder_layer")
    for call in ('importlib.import_module("torch").tanh(x)', '__import__("torch").tanh(x)',
                 'sys.modules["torch"].tanh(x)'):
        answer = f"import importlib, sys\ndef numpy_decoder_layer(x, params):\n    return {call}\n"
        assert "torch." in _reached([], answer, ("torch.",), "numpy_decoder_layer"), call
    # NumPy code whose parameter shares a name with a torch tensor of another cell is not flagged
    answer = "import numpy as np\ndef numpy_decoder_layer(x, params):\n    return np.tanh(x @ params['W'])\n"
    assert _reached(["import torch\nx = torch.randn(3)"], answer, ("torch.",), "numpy_decoder_layer") == {}


def test_code_run_from_strings_cannot_hide():
    answer = ANSWER.format(call='eval("F.scaled_" + "dot_product_attention")(q, k, v)')
    assert "eval" in _reached(["import torch.nn.functional as F"], answer)
    message = verdicts.policy_message("robust_attention", {"eval": "code run from a string cannot be checked"})
    assert "eval, exec, compile" in message


def test_the_reference_solutions_break_no_rule():
    import nbformat as nbf

    from autograder import notebooks
    for lesson in notebooks.lessons():
        nb = nbf.read(notebooks.solution_path(lesson), as_version=4)
        cells = [c.source for c in nb.cells if c.cell_type == "code"]
        sources = verdicts.solution_sources(nb)
        for item, ex in verdicts.exercises_for(lesson).items():
            broken = policy.violations(cells, [sources.get(item, "")], [item], tuple(ex.forbidden))
            assert broken == {}, f"{lesson}/{item}: the reference breaks its own policy: {broken}"
