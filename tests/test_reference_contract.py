"""Every reference module keeps the contract the notebook builder relies on.

Top level: only imports and definitions, so each definition is a self-contained cell;
every public object has a docstring with a Shape section; graded objects mark the student's part, and the stub
nbgrader makes of it compiles and raises NotImplementedError before doing anything else.
"""

import ast
import inspect
import textwrap

import pytest

from autograder.course import bugs, lessons
from autograder.course.notebooks import _MARKERS


# ----------------------------------------------------------------------------------------------------
# Module contract: what the notebook sync (inspect.getsource) relies on
# ----------------------------------------------------------------------------------------------------
def _stub(src: str) -> str:
    """nbgrader's ClearSolutions, in short: each marked region becomes ``raise NotImplementedError()``."""
    out, inside = [], False
    for line in src.splitlines():
        stripped = line.strip()
        if stripped == "### BEGIN SOLUTION":
            indent = line[: len(line) - len(line.lstrip())]
            out += [indent + "# YOUR CODE HERE", indent + "raise NotImplementedError()"]
            inside = True
        elif stripped == "### END SOLUTION":
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out) + "\n"


def _call_with_nones(func, self_obj=None):
    params = [
        p
        for p in inspect.signature(func).parameters.values()
        if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD and p.name != "self"
    ]
    args = [None] * len(params)
    return func(self_obj, *args) if self_obj is not None else func(*args)


_DATA = (ast.Constant, ast.Tuple, ast.List, ast.Dict, ast.Name, ast.Load, ast.Store, ast.BinOp, ast.Add, ast.Starred,
         ast.JoinedStr, ast.FormattedValue, ast.Attribute)


def _is_data(node: ast.AST) -> bool:
    """``NAME = <strings, tuples and lists of them, names of such>`` (``str.replace`` allowed): a constant of the
    known mistakes, no code."""
    targets = node.targets[0].elts if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple) else (
        node.targets if isinstance(node, ast.Assign) else [])
    return bool(targets) and len(node.targets) == 1 and all(
        isinstance(t, ast.Name) and t.id.lstrip("_").isupper() for t in targets) and all(
        isinstance(n, _DATA) or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                                 and n.func.attr == "replace") for n in ast.walk(node.value))


def check_module_contract(lesson):
    """Top level: only imports and definitions, so each definition is a self-contained cell, then the known mistakes
    (``MISTAKES``) and the helpers that port an earlier answer (``PORTS``, autograder.term.integrity) as plain data; the
    exercises are those that mark the student's part (autograder.course.lessons), the
    rest is given code."""
    module = lessons.module(lesson, "reference")
    exercises, given = lessons.exercises(lesson), lessons.given(lesson)
    names = exercises + given
    assert len(set(names)) == len(names), "a name is defined twice"
    tree = ast.parse(inspect.getsource(module))
    assert ast.get_docstring(tree), f"{module.__name__} has no module docstring"
    defined, data = [], []
    for node in tree.body[1:]:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if _is_data(node):  # the known mistakes, after every definition: patches as plain data, no code
            data.append(node)
            continue
        assert not data, f"a definition after the known mistakes: {ast.unparse(node)[:80]}"
        assert isinstance(node, ast.FunctionDef | ast.ClassDef), f"top-level code or state: {ast.unparse(node)}"
        defined.append(node.name)
    assert not data or ast.unparse(data[-1].targets[0]) == "MISTAKES", "the data at the end is the MISTAKES table"

    for name in names:
        obj = getattr(module, name)
        doc = inspect.getdoc(obj)
        assert doc and doc.splitlines()[0].strip(), f"{name}: docstring must start with one line of what"
        assert "Shape" in doc, f"{name}: docstring needs a Shape section"
        src = inspect.getsource(obj)
        n_begin, n_end = src.count("### BEGIN SOLUTION"), src.count("### END SOLUTION")
        assert n_begin == n_end, f"{name}: unbalanced solution markers"
        if name in given:
            assert n_begin == 0, f"{name} is given code: it must not carry solution markers"
            continue
        assert n_begin >= 1, f"{name} is graded but has no ### BEGIN SOLUTION region"
        if bugs.regions(src) is not None:
            # find the bug: the release shows the buggy version, not a stub; it must be a complete definition
            buggy = bugs.buggy_source(textwrap.dedent(src))
            assert buggy != bugs.strip(_MARKERS.sub("", textwrap.dedent(src))), f"{name}: the bug changes nothing"
            namespace = dict(vars(module))
            exec(compile(buggy, f"<buggy {name}>", "exec"), namespace)
            assert namespace[name] is not obj and callable(namespace[name]), f"{name}: the buggy version"
            continue
        # the student's stub must compile and raise NotImplementedError before doing anything else
        namespace = dict(vars(module))
        exec(compile(_stub(src), f"<stub of {name}>", "exec"), namespace)
        stub = namespace[name]
        if inspect.isclass(obj):
            cls_node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
            for meth in [n for n in cls_node.body if isinstance(n, ast.FunctionDef)]:
                meth_src = ast.get_source_segment(inspect.getsource(module), meth)
                assert "### BEGIN SOLUTION" in meth_src, f"{name}.{meth.name}: method body is not marked"
                with pytest.raises(NotImplementedError):
                    attr = inspect.getattr_static(stub, meth.name)
                    method = attr.fget if isinstance(attr, property) else getattr(stub, meth.name)
                    if isinstance(attr, staticmethod):  # no instance to pass
                        _call_with_nones(method)
                    else:
                        _call_with_nones(method, self_obj=stub.__new__(stub))
        else:
            with pytest.raises(NotImplementedError):
                _call_with_nones(stub)


@pytest.mark.parametrize("lesson", lessons.ids())
def test_module_contract(lesson):
    check_module_contract(lesson)


@pytest.mark.parametrize("source,data", [
    ('MISTAKES = [("item", "what", ("old", "new"))]', True),
    ("_OLD, NEW = 'a', f'b {1}'", True),
    ("MISTAKES = [(X.replace('a', 'b'), *Y)]", True),
    ("MISTAKES = [open('secret').read()]", False),
    ("MISTAKES = [x for x in 'ab']", False),
    ("cache = {}", False),
    ("MISTAKES: list = []", False),
])
def test_only_plain_data_may_follow_the_definitions(source, data):
    assert _is_data(ast.parse(source).body[0]) is data
