"""The static policy: an exercise that asks you to write X must not reach PyTorch's X (or, NumPy-only, torch at all).

A rule is a dotted name as the checks write it: ``"F.scaled_dot_product_attention"``, ``"nn.MultiheadAttention"``
(a function or class of a library: any path to it counts, ``torch.nn.modules.activation.MultiheadAttention``
included), or a bare module root, ``"torch"`` / ``"torch."`` / ``"einops"`` (anything reaching that library).

What is judged is the exercise's code and everything it can reach, across **every code cell** of the notebook:
the definitions of the exercise's names wherever they are, the module-level statements of its solution cells, and,
transitively, every function, class or variable of the notebook they name. So a forbidden import in another cell
counts when the exercise uses it (``from torch.nn.functional import scaled_dot_product_attention as _attend`` in a
scratch cell, ``_attend(...)`` in the answer), and never when it does not (a cell that compares the answer with
PyTorch's is fine). Found, in the code reached:

- imports of a forbidden name or module, under any alias, ``from M import *`` included;
- names and attribute chains that resolve, through the notebook's imports and assignments, to a forbidden name
  (``Fn = torch.nn.functional`` … ``Fn.scaled_dot_product_attention``), and any attribute spelled like a forbidden
  function (``anything.scaled_dot_product_attention``);
- constant strings that name one: ``getattr(F, "scaled_dot_product_attention")``, ``vars(F)["…"]``,
  ``F.__dict__["…"]``, ``importlib.import_module("torch")``, ``__import__("torch")``, ``sys.modules["torch"]``,
  ``globals()["_attend"]``;
- ``eval``, ``exec`` and ``compile``, which would hide code from this check.

IPython magics are turned into Python first (``%time x = nn.MultiheadAttention(4, 2)`` is read as the code it
runs). The reference solutions are graded by the same policy (the canary), so a rule that flags honest code stops
grading before any student is judged.

This reading gives an early warning, which names how the use was found; it never decides a grade (an unused
``import torch`` in a NumPy-only answer's cell costs nothing). What decides is the run-time guard
(:mod:`decoder_course.guard`), which refuses the forbidden operators at torch's dispatcher and reports the forbidden
objects while the hidden cases run, however they were reached: only what ran counts. The rules' grammar is the
guard's (:func:`decoder_course.guard.parse_rule`).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field

from decoder_course.guard import Rule, parse_rule

__all__ = ["DYNAMIC", "Rule", "parse_rule", "violations"]

DYNAMIC = {"eval", "exec", "compile"}
_IDENT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def _python(source: str) -> str:
    """A cell's source as Python: IPython magics become the calls they stand for."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:  # no IPython, or a source it cannot read: use it as it is
        return source


@functools.lru_cache(maxsize=1024)
def _parse(source: str) -> ast.Module | None:
    """The cell's tree, kept: every item of a notebook reads the same cells, and nothing here changes a tree."""
    try:
        return ast.parse(_python(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"], or None when the chain does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


@dataclass
class _Notebook:
    """What every code cell defines at its top level: aliases (name -> qualified names) and definitions."""

    aliases: dict[str, set[str]] = field(default_factory=dict)
    definitions: dict[str, list[ast.AST]] = field(default_factory=dict)
    stars: set[str] = field(default_factory=set)  # modules imported with *

    def add_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.aliases.setdefault(alias.asname, set()).add(alias.name)
                else:
                    head = alias.name.split(".")[0]
                    self.aliases.setdefault(head, set()).add(head)
        elif node.module and not node.level:
            for alias in node.names:
                if alias.name == "*":
                    self.stars.add(node.module)
                else:
                    self.aliases.setdefault(alias.asname or alias.name, set()).add(f"{node.module}.{alias.name}")

    def add_cell(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):  # imports anywhere (in a function too) make aliases: the kernel shares them
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.add_import(node)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.definitions.setdefault(node.name, []).append(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            self.definitions.setdefault(name.id, []).append(node)

    def resolve(self, parts: list[str], seen: frozenset = frozenset()) -> set[str]:
        """Qualified names a dotted chain may stand for, through imports and plain alias assignments."""
        head, rest = parts[0], parts[1:]
        found = set()
        for target in self.aliases.get(head, ()):
            found.add(".".join([target, *rest]))
        if head not in seen:
            for node in self.definitions.get(head, ()):
                value = getattr(node, "value", None)
                chain = _dotted(value) if value is not None else None
                if chain is not None:
                    found |= self.resolve(chain + rest, seen | {head})
        if not found and head not in self.definitions and self.stars:
            found = {".".join([module, *parts]) for module in self.stars}
        return found


class _Search:
    def __init__(self, book: _Notebook, rules: list[Rule]):
        self.book, self.rules = book, rules
        self.found: dict[str, str] = {}  # rule -> how the first use was found
        self.done: set[str] = set()
        self.todo: list[str] = []

    def add(self, rule: Rule, how: str = "") -> None:
        if not self.found.get(rule.text):
            self.found[rule.text] = how

    def flag(self, qualified: str) -> None:
        for rule in self.rules:
            if rule.matches(qualified):
                self.add(rule, f"as `{qualified}`")

    def name(self, name: str) -> None:
        for qualified in self.book.resolve([name]):
            self.flag(qualified)
        if name in self.book.definitions and name not in self.done:
            self.done.add(name)
            self.todo.append(name)

    def string(self, text: str) -> None:
        if not _IDENT_PATH.match(text):
            return
        for rule in self.rules:
            last = text.split(".")[-1]
            if (rule.leaf is not None and last == rule.leaf) or (rule.leaf is None and rule.matches(text)):
                self.add(rule, f"named in the string {text!r}")

    def node(self, node: ast.AST, local: frozenset = frozenset()) -> None:
        """Visit ``node``; ``local`` are the names of the enclosing functions (a parameter ``x`` is not the
        notebook's global ``x``), which are never followed to a definition."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for default in [*args.defaults, *args.kw_defaults]:
                if default is not None:
                    self.node(default, local)
            for decorator in getattr(node, "decorator_list", []):
                self.node(decorator, local)
            params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
            body = node.body if isinstance(node.body, list) else [node.body]
            declared = {n for stmt in body for sub in ast.walk(stmt) if isinstance(sub, (ast.Global, ast.Nonlocal))
                        for n in sub.names}
            stored = {sub.id for stmt in body for sub in ast.walk(stmt)
                      if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del))}
            stored |= {sub.name for stmt in body for sub in ast.walk(stmt)
                       if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
            inner = local | ((params | stored) - declared)
            for stmt in body:
                self.node(stmt, inner)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                self.flag(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            self.flag(node.module)
            for alias in node.names:
                self.flag(node.module if alias.name == "*" else f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Attribute):
            chain = _dotted(node)
            if chain is not None and chain[0] not in local:
                for qualified in self.book.resolve(chain):
                    self.flag(qualified)
            for rule in self.rules:
                if rule.leaf is not None and node.attr == rule.leaf:
                    self.add(rule, f"as `….{node.attr}`")
        elif isinstance(node, ast.Name):
            if node.id not in local:
                if node.id in DYNAMIC:
                    self.found.setdefault(node.id, "code run from a string cannot be checked")
                self.name(node.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("run_line_magic", "run_cell_magic"):
            for arg in node.args[1:]:  # a magic's code: %time x = nn.MultiheadAttention(4, 2)
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    tree = _parse(arg.value)
                    if tree is not None:
                        self.node(tree, local)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            self.string(node.value)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call) and \
                isinstance(node.value.func, ast.Name) and node.value.func.id in ("globals", "vars", "locals") and \
                not node.value.args and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            self.name(node.slice.value)  # globals()["_attend"]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and \
                len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            chain = _dotted(node.args[0])  # getattr(Fn, "scaled_dot_product_attention")
            if chain is not None and chain[0] not in local:
                for qualified in self.book.resolve(chain):
                    self.flag(f"{qualified}.{node.args[1].value}")
        for child in ast.iter_child_nodes(node):
            self.node(child, local)

    def run(self, roots: list[ast.AST], names: list[str]) -> None:
        for root in roots:
            self.node(root)
        for name in names:
            self.name(name)
        while self.todo:
            for definition in self.book.definitions[self.todo.pop()]:
                self.node(definition)


def violations(cells: list[str], own: list[str], names: list[str], rules: tuple[str, ...]) -> dict[str, str]:
    """The rules broken by what the exercise ``names`` (its functions or classes) and the code of its solution
    cells ``own`` can reach in a notebook whose code cells are ``cells``: rule -> how it was reached, in words
    (``eval``/``exec``/``compile`` appear as rules of their own)."""
    if not rules:
        return {}
    parsed = [parse_rule(rule) for rule in rules]
    book = _Notebook()
    for source in cells:
        tree = _parse(source)
        if tree is not None:
            book.add_cell(tree)
    search = _Search(book, parsed)
    roots = []
    for source in own:
        tree = _parse(source)
        if tree is None:  # a syntax error the kernel reports: read the text as a last resort
            for rule in parsed:
                if re.search(rf"\b{re.escape(rule.leaf or rule.root)}\b", source):
                    search.add(rule, "in a cell Python cannot parse")
            continue
        roots.append(tree)
    search.run(roots, [name for name in names if name in book.definitions])
    return dict(sorted(search.found.items()))
