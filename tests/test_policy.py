"""Static policy: an exercise that asks you to write X fails when its submitted cell calls PyTorch's X."""

import subprocess
import sys

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.course import notebooks, samples
from autograder.course.checks.framework import Case, Exercise, Verdict
from autograder.grading import grade_class, pipeline
from autograder.judge import policy, verdicts
from decoder_course import guard, harvest

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


def test_the_source_reader_warns_and_what_ran_decides(tmp_path, monkeypatch):
    """Issue 36: the source reader's finding is a warning in the message, never the verdict; the run-time guard's
    report (what ran on the hidden cases) fails the item before its values are judged."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("def attention(q, k, v):\n    return F.scaled_dot_product_attention(q, k, v)")
    cell.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "attention_solution"}
    nb.cells.append(cell)
    plan = verdicts.Plan("02-attention", tmp_path, {"attention": (_Passing(), [Case("c0", "B=2")])},
                         verdicts.solution_sources(nb))
    monkeypatch.setattr(verdicts, "run_judge", lambda *a: Verdict(True, "values fine"))
    decided = verdicts.decide(plan)
    assert decided["attention"].passed, decided["attention"].message
    assert "A warning, which cost nothing" in decided["attention"].message
    assert "`F.scaled_dot_product_attention`" in decided["attention"].message
    # the guard reported the rule: the item fails, whatever its values, with the policy's message
    harvest._write_results(tmp_path / "outputs", "attention", ["c0"], {}, "PolicyViolation: reached",
                           ["F.scaled_dot_product_attention"])
    decided = verdicts.decide(plan)
    assert not decided["attention"].passed
    assert "write it yourself" in decided["attention"].message and verdicts.RUNTIME_HOW in decided["attention"].message
    assert "A warning" not in decided["attention"].message
    # the same plan without the forbidden name and without a report is judged on its values, with no warning
    cell.source = "def attention(q, k, v):\n    return q @ k.T @ v"
    plan.sources = verdicts.solution_sources(nb)
    for path in (tmp_path / "outputs").iterdir():
        path.unlink()
    assert verdicts.decide(plan)["attention"] == Verdict(True, "values fine")


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
    for lesson in notebooks.lessons():
        nb = nbformat.read(notebooks.solution_path(lesson), as_version=4)
        cells = [c.source for c in nb.cells if c.cell_type == "code"]
        sources = verdicts.solution_sources(nb)
        for item, ex in verdicts.exercises_for(lesson).items():
            broken = policy.violations(cells, [sources.get(item, "")], [item], tuple(ex.forbidden))
            assert broken == {}, f"{lesson}/{item}: the reference breaks its own policy: {broken}"


# -- the run-time guard (issue 30, point 3) -----------------------------------------------------------------------
# Each attack below is the reference answer plus a use of what the item must be written without, reached a way
# the source reader cannot follow, its result thrown away and any exception swallowed: its values are right, so
# only the run-time guard (decoder_course.guard, armed in the harvest's child) can fail it. judge_namespace reads
# no source at all: the verdicts here are the guard's alone, and each attack passes with the guard turned off.
BY_HAND = "_by_hand = robust_attention\n"  # the reference, kept under another name
CHEAT = BY_HAND + """
def robust_attention(q, k, v, allowed=None):
    try:
        {use}
    except BaseException:
        pass
    return _by_hand(q, k, v, allowed)
"""
SDPA_ATTACKS = {
    "a name built at run time": ("import torch.nn.functional as _Fn",
                                 'getattr(_Fn, "scaled_" + "dot_product_attention")(q, k, v)'),
    "another module's attribute": ("import torch.nn.modules.activation as _act",
                                   "_act.F.scaled_dot_product_attention(q, k, v)"),
    "sys.modules and a module's __dict__": ("import sys",
                                            'sys.modules["torch.nn." + "functional"].__dict__["scaled_dot_product_'
                                            'attention"](q, k, v)'),
    "the companion package's namespace": ("import decoder_course.visible.l03_multi_head as _l03",
                                          "_l03.F.scaled_dot_product_attention(q, k, v)"),
    "the C function itself": ("import torch", "torch._C._nn.scaled_dot_product_attention(q, k, v)"),
    "a private kernel behind it": ("import torch", "torch._scaled_dot_product_attention_math(q, k, v)"),
    "an aten operator": ("import torch", "torch.ops.aten.scaled_dot_product_attention.default(q, k, v)"),
    "an aten operator packet": ("import torch", "getattr(torch.ops.aten, 'scaled_dot_product_attention')(q, k, v)"),
    "a binding of an earlier cell": ("import torch\n_attend = torch.nn.functional.scaled_dot_product_attention",
                                     "_attend(q, k, v)"),
    "a binding made in a loop, in a try block": (
        "import torch\n_found = []\nfor _name in ('softmax', 'scaled_dot_product_attention'):\n    try:\n"
        "        _found.append(getattr(torch.nn.functional, _name))\n    except AttributeError:\n        pass",
        "_found[-1](q, k, v)"),
    "a default argument bound in a loop": (
        "import torch\nfor _name in ['scaled_dot_product_attention']:\n"
        "    def _helper(q, k, v, _f=getattr(torch.nn.functional, _name)):\n        return _f(q, k, v)",
        "_helper(q, k, v)"),
    "a closure": ("import torch\ndef _make():\n    f = vars(torch.nn.functional)['scaled_dot_product_attention']\n"
                  "    return lambda *a: f(*a)\n_closed = _make()", "_closed(q, k, v)"),
    "code written to a file and imported": (
        "import importlib, sys, tempfile, pathlib\n_dir = tempfile.mkdtemp()\n"
        "pathlib.Path(_dir, 'helper_sdpa.py').write_text("
        "'from torch.nn.functional import scaled_dot_product_attention as attend\\n')\n"
        "sys.path.insert(0, _dir)\n_helper = importlib.import_module('helper_sdpa')", "_helper.attend(q, k, v)"),
    "code compiled from a string (as an input transformer gives it)": (
        "exec(compile('import torch\\ndef _from_text(q, k, v):\\n    return torch.nn.functional.'"
        " + 'scaled_dot_product_attention(q, k, v)', '<transformed cell>', 'exec'))", "_from_text(q, k, v)"),
    "a thread": ("import threading, torch",
                 "t = threading.Thread(target=torch.nn.functional.scaled_dot_product_attention, args=(q, k, v)); "
                 "t.start(); t.join()"),
    "a raw thread": ("import _thread, time, torch",
                     "_thread.start_new_thread(torch.nn.functional.scaled_dot_product_attention, (q, k, v)); "
                     "time.sleep(0.5)"),
}


def _attack(lesson: str, source: str, item: str, guarded: bool = True, monkeypatch=None) -> verdicts.Verdict:
    namespace = samples.notebook_namespace(lesson)
    exec(compile(source, "<attack cells>", "exec"), namespace)  # noqa: S102 - the test's own attack
    if not guarded:
        monkeypatch.setattr(guard.Guard, "install", lambda self, namespace: None)
    try:
        return verdicts.judge_namespace(lesson, namespace, items=[item])[item]
    finally:  # hooks cannot be unregistered: an attack's own (AT_FORK_HELPER) do nothing from now on
        namespace.get("_helping", [False])[0] = False


def _stopped_by_guard(verdict: verdicts.Verdict, rule: str) -> bool:
    return not verdict.passed and f"`{rule.rstrip('.')}` ({verdicts.RUNTIME_HOW})" in verdict.message


@pytest.mark.parametrize("how", list(SDPA_ATTACKS))
def test_the_guard_stops_sdpa_however_it_is_reached(how, monkeypatch):
    before, use = SDPA_ATTACKS[how]
    source = before + "\n" + CHEAT.format(use=use)
    verdict = _attack("10-numerics", source, "robust_attention")
    assert _stopped_by_guard(verdict, "F.scaled_dot_product_attention"), verdict.message
    assert "write it yourself" in verdict.message  # the source reader's words
    if how in ("a name built at run time", "a binding of an earlier cell"):  # the guard decides: off, it passes
        assert _attack("10-numerics", source, "robust_attention", False, monkeypatch).passed


def test_turning_the_guard_off_is_reported():
    for use in ("sys.setprofile(None)", "__import__('threading').setprofile(print); sys.setprofile(print)",
                "__import__('subprocess').run([sys.executable, '-c', 'import torch'])", "os.system('true')"):
        verdict = _attack("10-numerics", "import os, sys\n" + CHEAT.format(use=use), "robust_attention")
        assert _stopped_by_guard(verdict, guard.TAMPER) and "leave the grader's tools alone" in verdict.message


MHA = "_ByHand = MultiHeadAttention\n"
MHA_ATTACKS = {
    "subclassed": "import torch\nclass MultiHeadAttention(_ByHand):\n    def __init__(self, d_model, n_heads, "
                  "dropout=0.0):\n        super().__init__(d_model, n_heads, dropout)\n        try:\n"
                  "            self._shadow = torch.nn.MultiheadAttention(d_model, n_heads, batch_first=True)\n"
                  "        except BaseException:\n            pass\n"
                  "        self.__dict__['_modules'].pop('_shadow', None)",
    "a subclass of PyTorch's": "import torch\nclass _Mine(torch.nn.MultiheadAttention):\n    pass\n"
                               "class MultiHeadAttention(_ByHand):\n    def forward(self, query, key, value, "
                               "allowed=None):\n        try:\n            _Mine(4, 2)\n        except BaseException:\n"
                               "            pass\n        return super().forward(query, key, value, allowed)",
    "aliased through another module": "import torch.nn.modules.transformer as _tr\n_Alias = _tr.MultiheadAttention\n"
                                      "class MultiHeadAttention(_ByHand):\n    def forward(self, query, key, value, "
                                      "allowed=None):\n        try:\n            _Alias(4, 2)\n        except "
                                      "BaseException:\n            pass\n        return super().forward(query, key, "
                                      "value, allowed)",
}


@pytest.mark.parametrize("how", list(MHA_ATTACKS))
def test_the_guard_stops_pytorchs_multi_head_attention(how):
    verdict = _attack("03-multi-head", MHA + MHA_ATTACKS[how], "MultiHeadAttention")
    assert _stopped_by_guard(verdict, "nn.MultiheadAttention"), verdict.message


NUMPY_ATTACKS = {
    "np.asarray of a tensor": "import torch\n_by_hand = numpy_decoder_layer\ndef numpy_decoder_layer(*a, **k):\n"
                              "    return np.asarray(torch.from_numpy(_by_hand(*a, **k)))",
    "a tensor of an earlier cell": "import torch\n_by_hand = numpy_decoder_layer\n_one = torch.ones(())\n"
                                   "def numpy_decoder_layer(*a, **k):\n    return _by_hand(*a, **k) * np.asarray(_one)",
    "torch imported by a name built at run time": "import importlib\n_by_hand = numpy_decoder_layer\n"
                                                  "def numpy_decoder_layer(*a, **k):\n    importlib.import_module("
                                                  "'to' + 'rch').manual_seed(0)\n    return _by_hand(*a, **k)",
}


@pytest.mark.parametrize("how", list(NUMPY_ATTACKS))
def test_a_numpy_only_item_may_not_call_torch_at_run_time(how):
    verdict = _attack("05-decoder-layer", "import numpy as np\n" + NUMPY_ATTACKS[how], "numpy_decoder_layer")
    assert _stopped_by_guard(verdict, "torch."), verdict.message
    assert "written without torch" in verdict.message


def test_a_by_hand_item_may_not_call_the_library_it_replaces():
    source = ("import importlib\n_by_hand = split_heads_reshape\ndef split_heads_reshape(x, H):\n"
              "    return importlib.import_module('ein' + 'ops').rearrange(x, 'b t (h d) -> b h t d', h=H)")
    verdict = _attack("03-multi-head", source, "split_heads_reshape")
    assert not verdict.passed and verdicts.RUNTIME_HOW in verdict.message and "einops" in verdict.message


def test_honest_answers_keep_their_marks_under_the_guard():
    # a comparison cell may use what the item may not, the item's own code uses PyTorch's other functions, and
    # a forbidden function bound in the notebook but never called by the item costs nothing
    honest = ("import torch\n_attend = torch.nn.functional.scaled_dot_product_attention\n_by_hand = "
              "robust_attention\n_check = _attend(torch.ones(1, 2, 4), torch.ones(1, 3, 4), torch.ones(1, 3, 4))\n"
              "def robust_attention(q, k, v, allowed=None):\n    torch.nn.functional.softmax(q, dim=-1)\n"
              "    return _by_hand(q, k, v, allowed)")
    assert _attack("10-numerics", honest, "robust_attention").passed
    # a wrong answer that breaks no rule is judged on its values, not by the guard
    wrong = BY_HAND + "def robust_attention(q, k, v, allowed=None):\n    out, w = _by_hand(q, k, v, allowed)\n" \
                      "    return out * 2, w"
    verdict = _attack("10-numerics", wrong, "robust_attention")
    assert not verdict.passed and verdicts.RUNTIME_HOW not in verdict.message
    for lesson, item in (("05-decoder-layer", "numpy_decoder_layer"), ("03-multi-head", "MultiHeadAttention"),
                         ("03-multi-head", "split_heads_reshape")):
        assert _attack(lesson, "", item).passed, (lesson, item)


# -- the dispatcher decides (issue 36, point 4) --------------------------------------------------------------------
# Routes the profile function cannot see: a C function calling the forbidden one (partial, map, operator.call),
# TorchScript, the JIT's operator table, and threads that run without the profile function because they started
# before the guard was armed (an os.register_at_fork hook, an audit hook on the child's first file read). PyTorch's
# dispatcher refuses the forbidden operator for the whole process, whoever calls it. The hooks stay registered in
# this process after the test (neither kind can be removed): each does its work only while `_helping` holds True.
# a helper thread's loop: it runs each job the attack's cell puts in _jobs and puts its answer in _answers
HELPER_LOOP = """
def _helper():
    while True:
        job = _jobs.get()
        try:
            _answers.put(job())
        except BaseException as exc:
            _answers.put(exc)
"""
AT_FORK_HELPER = """
import os, queue, threading, torch
_jobs, _answers, _helping = queue.Queue(), queue.Queue(), [True]
""" + HELPER_LOOP + """
def _start_helper():
    if _helping[0]:
        threading.Thread(target=_helper, daemon=True).start()

os.register_at_fork(after_in_child=_start_helper)
"""
KEPT = "\n_kept = (torch.nn.functional.scaled_dot_product_attention,)  # a tuple: no stand-in reaches into one"
AUDIT_HELPER = """
import os, sys, queue, _thread, torch
_jobs, _answers, _helping, _started = queue.Queue(), queue.Queue(), [True], []
""" + HELPER_LOOP + """
def _on_event(event, args):
    if _helping[0] and event == "open" and os.getpid() not in _started:  # the child's first read of its cases
        _started.append(os.getpid())
        _thread.start_new_thread(_helper, ())

_started.append(os.getpid())
sys.addaudithook(_on_event)
"""
DISPATCHER_SDPA_ATTACKS = {
    "functools.partial": ("import functools, torch\n_attend = functools.partial("
                          "torch.nn.functional.scaled_dot_product_attention)", "_attend(q, k, v)"),
    "map": ("import torch" + KEPT, "list(map(_kept[0], [q], [k], [v]))"),
    "operator.call": ("import operator, torch" + KEPT, "operator.call(_kept[0], q, k, v)"),
    "TorchScript of an earlier cell": (
        "import torch\n_scripted = torch.jit.CompilationUnit('def attend(q, k, v):\\n    return torch.nn.functional."
        "scaled_dot_product_attention(q, k, v)\\n').attend", "_scripted(q, k, v)"),
    "torch._C._jit_get_operation": (
        "import torch\n_op = torch._C._jit_get_operation('aten::scaled_' + 'dot_product_attention')\n"
        "_op = _op[0] if isinstance(_op, tuple) else _op", "_op(q, k, v)"),
    "torch.ops.aten through map": ("import torch\n_op = (torch.ops.aten.scaled_dot_product_attention.default._op,)",
                                   "list(map(_op[0], [q], [k], [v]))"),
    "a thread an os.register_at_fork hook starts": (
        AT_FORK_HELPER + KEPT, "_jobs.put(lambda: _kept[0](q, k, v)); _answers.get(timeout=30)"),
    "a thread started before arming (an audit hook)": (
        AUDIT_HELPER + KEPT, "_jobs.put(lambda: _kept[0](q, k, v)); _answers.get(timeout=30)"),
}


def _without_dispatcher(monkeypatch) -> None:
    """The guard as it was before the dispatcher decided: the profile function and the stand-ins only."""
    monkeypatch.setattr(guard.Guard, "arm_dispatcher", lambda self: None)


@pytest.mark.parametrize("how", list(DISPATCHER_SDPA_ATTACKS))
def test_the_dispatcher_refuses_sdpa_from_any_caller_or_thread(how, monkeypatch):
    before, use = DISPATCHER_SDPA_ATTACKS[how]
    source = before + "\n" + CHEAT.format(use=use)
    verdict = _attack("10-numerics", source, "robust_attention")
    assert _stopped_by_guard(verdict, "F.scaled_dot_product_attention"), verdict.message
    assert "write it yourself" in verdict.message


@pytest.mark.parametrize("how", ["functools.partial", "TorchScript of an earlier cell",
                                 "a thread an os.register_at_fork hook starts"])
def test_without_the_dispatcher_these_routes_pass(how, monkeypatch):
    """The attacks above are real: with only the profile function and the stand-ins, they keep full marks."""
    _without_dispatcher(monkeypatch)
    before, use = DISPATCHER_SDPA_ATTACKS[how]
    assert _attack("10-numerics", before + "\n" + CHEAT.format(use=use), "robust_attention").passed


MHA_FORWARD = """
class MultiHeadAttention(_ByHand):
    def forward(self, query, key, value, allowed=None):
        try:
            {use}
        except BaseException:
            pass
        return super().forward(query, key, value, allowed)
"""
_NATIVE_ARGS = ("_x = query.detach().float(); _d = _x.shape[-1]; _w = (torch.ones(3 * _d, _d), torch.zeros(3 * _d), "
                "torch.ones(_d, _d), torch.zeros(_d))")
DISPATCHER_MHA_ATTACKS = {  # (the rule reported, the cells before, the use)
    "nn.MultiheadAttention kept from an earlier cell, in an at-fork thread": (
        "nn.MultiheadAttention", AT_FORK_HELPER + "_kept = (torch.nn.MultiheadAttention,)",
        "_x = torch.ones(1, 3, 8); _jobs.put(lambda: _kept[0](8, 2, batch_first=True).eval()"
        ".requires_grad_(False)(_x, _x, _x, need_weights=False)); _answers.get(timeout=30)"),  # its fast path
    "F.multi_head_attention_forward through functools.partial": (
        "F.multi_head_attention_forward", "import functools, torch\n_mhaf = functools.partial("
        "torch.nn.functional.multi_head_attention_forward)",
        "_x = query.detach().float().transpose(0, 1); _d = _x.shape[-1]; _w = torch.ones(3 * _d, _d); "
        "_b = torch.zeros(3 * _d); _mhaf(_x, _x, _x, _d, 1, _w, _b, None, None, False, 0.0, _w[:_d], _b[:_d])"),
    "F.multi_head_attention_forward kept from an earlier cell, in an at-fork thread": (  # bmm and softmax only
        "F.multi_head_attention_forward",
        AT_FORK_HELPER + "_kept = (torch.nn.functional.multi_head_attention_forward,)",
        "_x = query.detach().float().transpose(0, 1); _d = _x.shape[-1]; _w = torch.ones(3 * _d, _d); "
        "_b = torch.zeros(3 * _d); _jobs.put(lambda: _kept[0](_x, _x, _x, _d, 1, _w, _b, None, None, False, 0.0, "
        "_w[:_d], _b[:_d])); _answers.get(timeout=30)"),
    "torch._native_multi_head_attention through functools.partial": (
        "nn.MultiheadAttention", "import functools, torch\n_native = functools.partial("
        "torch._native_multi_head_attention)", _NATIVE_ARGS + "; _native(_x, _x, _x, _d, 1, *_w)"),
    "aten::_native_multi_head_attention in an at-fork thread": (
        "nn.MultiheadAttention", AT_FORK_HELPER,
        _NATIVE_ARGS + "; _jobs.put(lambda: torch.ops.aten._native_multi_head_attention(_x, _x, _x, _d, 1, *_w)); "
                       "_answers.get(timeout=30)"),
}


@pytest.mark.parametrize("how", list(DISPATCHER_MHA_ATTACKS))
def test_the_dispatcher_refuses_pytorchs_multi_head_attention(how):
    rule, before, use = DISPATCHER_MHA_ATTACKS[how]
    verdict = _attack("03-multi-head", before + "\n" + MHA + MHA_FORWARD.format(use=use),
                              "MultiHeadAttention")
    assert _stopped_by_guard(verdict, rule), verdict.message


def test_without_the_reporting_code_this_thread_passes(monkeypatch):
    """A forbidden Python function run by a thread the profile function does not watch, computing with operators
    the dispatcher lets through (bmm, softmax): only its replaced code reports it."""
    monkeypatch.setattr(guard.Guard, "replace_code", lambda self: None)
    _, before, use = DISPATCHER_MHA_ATTACKS["F.multi_head_attention_forward kept from an earlier cell, in an at-fork "
                                            "thread"]
    assert _attack("03-multi-head", before + "\n" + MHA + MHA_FORWARD.format(use=use),
                           "MultiHeadAttention").passed


TENSOR_OPERATORS = ("import numpy as np, torch\n_by_hand = numpy_decoder_layer\n_ones = torch.ones(3)\n"
                    "def numpy_decoder_layer(x, *a, **k):\n    try:\n        {use}\n    except BaseException:\n"
                    "        pass\n    return _by_hand(x, *a, **k)")
NUMPY_DISPATCHER_ATTACKS = {
    "tensor operators only": "(_ones + _ones) * 2.0 - _ones",  # a tensor's operators: no call the profile sees
    "a tensor operator in an at-fork thread": "_jobs.put(lambda: torch.from_numpy(x) + 1); _answers.get(timeout=30)",
}


@pytest.mark.parametrize("how", list(NUMPY_DISPATCHER_ATTACKS))
def test_a_numpy_only_item_fails_when_any_torch_operator_runs(how, monkeypatch):
    source = (AT_FORK_HELPER if "thread" in how else "") + TENSOR_OPERATORS.format(use=NUMPY_DISPATCHER_ATTACKS[how])
    verdict = _attack("05-decoder-layer", source, "numpy_decoder_layer")
    assert _stopped_by_guard(verdict, "torch."), verdict.message
    assert "written without torch" in verdict.message
    _without_dispatcher(monkeypatch)  # the profile function sees no call in either: only the dispatcher does
    assert _attack("05-decoder-layer", source, "numpy_decoder_layer").passed


@pytest.mark.parametrize("lesson, item, source", [
    ("10-numerics", "robust_attention", DISPATCHER_SDPA_ATTACKS["a thread an os.register_at_fork hook starts"][0] +
     "\n" + CHEAT.format(use=DISPATCHER_SDPA_ATTACKS["a thread an os.register_at_fork hook starts"][1])),
    ("05-decoder-layer", "numpy_decoder_layer",
     AT_FORK_HELPER + TENSOR_OPERATORS.format(use=NUMPY_DISPATCHER_ATTACKS["a tensor operator in an at-fork thread"])),
], ids=["sdpa", "numpy-only"])
def test_a_refusal_costs_its_item_and_no_other(lesson, item, source):
    """The at-fork helper thread runs in every item's child and the refusal holds for a whole child: each item's
    cases run in a child of their own, so only the item whose code used the helper loses its point."""
    namespace = samples.notebook_namespace(lesson)
    exec(compile(source, "<attack cells>", "exec"), namespace)  # noqa: S102 - the test's own attack
    try:
        decided = verdicts.judge_namespace(lesson, namespace)
    finally:
        namespace["_helping"][0] = False
    assert _stopped_by_guard(decided[item], "torch." if "numpy" in item else "F.scaled_dot_product_attention")
    assert all(v.passed for name, v in decided.items() if name != item), \
        {name: v.message for name, v in decided.items() if not v.passed}


def test_torch_imported_during_the_cases_is_refused_as_its_import_ends():
    """A NumPy-only item whose notebook never loaded torch: a thread that imports it (unwatched) and computes with
    it is refused at the dispatcher, armed by the import itself."""
    rules = ["torch."]
    script = (AT_FORK_HELPER.replace("import os, queue, threading, torch", "import os, queue, threading")
              + "\nimport sys\nfrom decoder_course.guard import Guard\n"
              "assert 'torch' not in sys.modules\n"
              "pid = os.fork()\n"
              "if pid == 0:\n"
              "    def report(rule):\n"
              "        os.write(1, f'reported {rule}\\n'.encode())\n"
              "        os._exit(3)\n"
              f"    Guard({rules!r}, report).install({{}})\n"
              "    _jobs.put(lambda: __import__('torch').ones(2) + 1)\n"
              "    print('not refused', type(_answers.get(timeout=60)).__name__, flush=True)  # no torch here\n"
              "    os._exit(0)\n"
              "_, status = os.waitpid(pid, 0)\n"
              "print('status', os.waitstatus_to_exitcode(status))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "reported torch." in done.stdout and "status 3" in done.stdout, (done.stdout, done.stderr)


def test_an_unused_import_of_torch_costs_a_numpy_only_answer_nothing(tmp_path, monkeypatch):
    """Issue 36: an honest NumPy-only answer whose cell imports torch and never uses it keeps full marks; the
    source reader's finding is a warning in the message, never the verdict."""
    lesson, item = "05-decoder-layer", "numpy_decoder_layer"
    answer = "import torch\n" + notebooks.reference_source(lesson, item, keep_markers=False)
    nb = samples.perfect(lesson)
    cell = next(c for c in nb.cells if c.metadata.get("course", {}).get("exercise") == [item])
    cell.source = answer
    plan = verdicts.prepare(nb, lesson, "s", b"k", tmp_path)
    namespace = samples.notebook_namespace(lesson)
    exec(compile(answer, "<answer cell>", "exec"), namespace)  # noqa: S102 - the test's own answer
    monkeypatch.setenv(harvest.ENV_VAR, str(tmp_path))
    harvest.collect(item, namespace)
    plan.items = {item: plan.items[item]}
    verdict = verdicts.decide(plan)[item]
    assert verdict.passed, verdict.message
    assert "A warning, which cost nothing" in verdict.message and "`torch`" in verdict.message


class _Restricted(_Passing):
    name = "robust_attention"
    forbidden = ("F.scaled_dot_product_attention",)


class _Unrestricted(_Passing):
    forbidden = ()


def test_the_trusted_side_reads_only_the_items_own_rules_from_the_report():
    ex = _Restricted()
    assert verdicts.reached_at_run_time(ex, {"policy": ["F.scaled_dot_product_attention"]}) == \
        {"F.scaled_dot_product_attention": verdicts.RUNTIME_HOW}
    for forged in ({"policy": ["<script>alert(1)</script>", "nn.Linear", 7]}, {"policy": "F.scaled_dot_product"
                                                                                         "_attention"},
                   {"policy": None}, {}, None, ["policy"]):
        assert verdicts.reached_at_run_time(ex, forged) == {}, forged
    assert verdicts.reached_at_run_time(_Unrestricted(), {"policy": ["F.scaled_dot_product_attention"]}) == {}
    # a rule broken in one run of the answer rounds stays broken in the merged outputs
    first = ({"item": "x", "cases": {"c0": {}}, "leaves": [], "policy": ["F.scaled_dot_product_attention"]}, {})
    again = ({"item": "x", "cases": {"c0": {}}, "leaves": []}, {})
    merged = verdicts._merged(first, again, [Case("c0", "B=2")])
    assert verdicts.reached_at_run_time(ex, merged[0])


def test_the_guard_decides_in_a_graded_notebook(tmp_path):
    """Through nbgrader and the sandboxed kernel: the rules travel with the cases, and the guard stops what the
    source reader cannot see (an input transformer rewrites the answer's cell as it runs; a name built at run time
    in an earlier cell). The canary (the solutions) keeps full marks under the same guard, and so does every item
    of the attacks' notebooks but the one that broke its rule."""
    lesson, item = "10-numerics", "robust_attention"
    answer = notebooks.reference_source(lesson, item, keep_markers=False)
    marker = "    weights = robust_masked_softmax(scores, allowed)"
    assert marker in answer
    used = "    __import__('torch').nn.functional.scaled_dot_product_attention(q, k, v)\n"
    attacks = {
        "transformer": ("get_ipython().input_transformers_post.append(lambda lines: [line.replace('# attend!', "
                        f"{used.strip()!r}) for line in lines])", answer.replace(marker, "    # attend!\n" + marker)),
        "runtime-name": ("import torch.nn.functional as Fn\n_attend = getattr(Fn, 'scaled_' + 'dot_product_attention')",
                         answer.replace(marker, "    _attend(q, k, v)\n" + marker)),
    }
    for student, (before, source) in attacks.items():
        nb = samples.perfect(lesson)
        index = next(i for i, cell in enumerate(nb.cells) if cell.metadata.get("course", {}).get("exercise") == [item])
        nb.cells[index].source = source
        nb.cells.insert(index, nbformat.v4.new_code_cell(before))
        assert policy.violations([c.source for c in nb.cells if c.cell_type == "code"], [source], [item],
                                 ("F.scaled_dot_product_attention",)) == {}  # the source reader is blind to it
        path = tmp_path / "incoming" / student / lesson / f"{lesson}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    outcomes = grade_class.grade(tmp_path / "incoming", tmp_path / "course", [lesson])
    with Gradebook(f"sqlite:///{tmp_path / 'course' / 'gradebook.db'}", pipeline.COURSE_ID) as gb:
        for student in attacks:
            scores = {g.name: g.score for g in gb.find_submission_notebook(lesson, lesson, student).grades}
            assert scores[item] == 0 and all(score == 1 for name, score in scores.items() if name != item), scores
            graded = nbformat.read(tmp_path / "course" / "autograded" / student / lesson / f"{lesson}.ipynb", 4)
            cell = next(c for c in graded.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == item)
            assert any(verdicts.RUNTIME_HOW in out.get("evalue", "") for out in cell.outputs), cell.outputs
    assert all(o.ok for o in outcomes), outcomes
