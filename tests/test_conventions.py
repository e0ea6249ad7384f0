"""The course's conventions, stated once in ``decoder_course``'s docstring, and the rule that the package
never holds an exercise's answer.

The polarity the docstring states is checked against PyTorch itself: ``F.scaled_dot_product_attention`` takes
True = may attend, ``nn.MultiheadAttention`` takes True = blocked.
"""

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import decoder_course
from autograder.course import lessons
from decoder_course import conventions, data

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = Path(decoder_course.__file__).resolve().parent
REFERENCE_DIR = ROOT / "autograder" / "course" / "reference"
SPEC = ROOT.parent / "shared" / "SPEC.md"  # the course contract, beside the repository when it is there
DOC = decoder_course.__doc__ or ""

# The graded exercises of SPEC.md's lesson table (its `names are part of the contract` column).
SPEC_EXERCISES = {
    "causal_mask", "padding_mask", "combine_masks", "mask_to_bias",
    "softmax", "masked_softmax", "scaled_dot_product_attention",
    "split_heads", "merge_heads", "MultiHeadAttention",
    "cross_attention_mask", "CrossAttention", "project_memory",
    "FeedForward", "DecoderLayer",
    "PositionalEncoding", "Decoder", "Seq2SeqTransformer",
    "shift_right", "sequence_loss",
    "greedy_decode", "sample", "beam_search",
    "KVCache", "decode_step", "greedy_decode_cached",
}  # fmt: skip
# Names the table mentions that are not exercises: methods of every module (a tokenizer's encode/decode, which the
# toy vocabularies of decoder_course.data also have), PyTorch's modules, einops.
NOT_EXERCISES = {"forward", "update", "encode", "decode", "nn", "F", "torch", "finfo", "rearrange", "einops"}


def _spec_table_names() -> set[str]:
    """Identifiers in backticks in the exercise column of SPEC.md's lesson table (empty if SPEC is absent)."""
    if not SPEC.exists():
        return set()
    names = set()
    for line in SPEC.read_text().splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) >= 5 and re.fullmatch(r"\d\d-[\w-]+", cells[1]):
            names |= set(re.findall(r"`([A-Za-z_]\w*)", cells[3]))
    return names - NOT_EXERCISES


def _reference_exercises() -> set[str]:
    """Every exercise of the hidden reference modules (autograder.course.lessons: read with ast, nothing runs)."""
    return {name for lesson in lessons.ids() for name in lessons.exercises(lesson)}


GRADED = SPEC_EXERCISES | _spec_table_names() | _reference_exercises()
PACKAGE_FILES = sorted(PACKAGE_DIR.rglob("*.py"))


# ----------------------------------------------------------------------------------------------------
# The docstring states the conventions
# ----------------------------------------------------------------------------------------------------
def test_docstring_states_mask_polarity():
    assert '``True`` means **"this query may attend to this key"**' in DOC
    assert "``allowed``" in DOC and "(B, H, T, S)" in DOC
    assert "opposite polarity" in DOC and "nn.MultiheadAttention" in DOC and "blocked = ~allowed" in DOC


def test_docstring_states_padding_and_fully_masked_rows():
    assert "``is_real``" in DOC and "``True`` for real tokens" in DOC
    assert "returns **zeros**" in DOC and "never NaN" in DOC and "never a uniform average" in DOC


def test_docstring_states_every_dimension_letter():
    meanings = {"B": "batch", "T": "target/query length", "S": "source/key length", "H": "heads",
                "D": "model width", "Dh": "head width", "F": "feed-forward width", "V": "vocabulary"}
    assert set(meanings) == set(conventions.DIMENSIONS)
    for letter, meaning in meanings.items():
        assert f"``{letter}" in DOC, letter
        words = meaning.split("/")[0].split()[0]
        assert words in DOC, meaning
    assert "``Dh = D // H``" in DOC


def test_docstring_names_the_special_tokens():
    for name in ("PAD", "BOS", "EOS"):
        assert f"``{name}``" in DOC


def test_special_token_constants():
    ids = [conventions.PAD, conventions.BOS, conventions.EOS]
    assert all(type(i) is int and i >= 0 for i in ids)  # plain ints, not bools or numpy scalars
    assert len(set(ids)) == 3
    assert conventions.SPECIAL_TOKENS == {"PAD": ids[0], "BOS": ids[1], "EOS": ids[2]}
    assert (decoder_course.PAD, decoder_course.BOS, decoder_course.EOS) == tuple(ids)
    assert conventions.MASK_ALLOWED is True


@pytest.mark.parametrize("name", data.TASKS)
def test_every_toy_vocabulary_uses_the_special_ids(name):
    task = data.get_task(name)
    for vocab in (task.src_vocab, task.tgt_vocab):
        assert vocab.tokens[conventions.PAD] == "<pad>"
        assert vocab.tokens[conventions.BOS] == "<bos>"
        assert vocab.tokens[conventions.EOS] == "<eos>"
        assert [vocab.pad_id, vocab.bos_id, vocab.eos_id] == [*conventions.SPECIAL_TOKENS.values()]


def test_stated_polarity_is_pytorchs():
    """SDPA takes True = may attend; nn.MultiheadAttention takes True = blocked, so it gets ~allowed."""
    torch.manual_seed(0)
    B, T, S, D = 2, 3, 5, 8
    q, k = torch.randn(B, T, D), torch.randn(B, S, D)
    allowed = torch.rand(B, T, S) > 0.4
    allowed[..., 0] = True  # no fully masked row: both functions must be defined everywhere
    # By hand: scores of blocked keys become -inf before the softmax.
    scores = (q @ k.transpose(1, 2)) / D**0.5  # (B, T, S)
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, k, attn_mask=allowed), weights @ k)
    mha = nn.MultiheadAttention(D, 1, batch_first=True, bias=False).eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.eye(D).repeat(3, 1))
        mha.out_proj.weight.copy_(torch.eye(D))
        out, _ = mha(q, k, k, attn_mask=~allowed)  # PyTorch's polarity: True = blocked
    torch.testing.assert_close(out, weights @ k)


# ----------------------------------------------------------------------------------------------------
# The package never holds an exercise
# ----------------------------------------------------------------------------------------------------
def test_graded_names_are_known():
    # A parser that found nothing would make the tests below pass vacuously.
    assert SPEC_EXERCISES <= GRADED
    assert len(GRADED) >= len(SPEC_EXERCISES)
    if SPEC.exists():
        assert {"causal_mask", "beam_search", "KVCache"} <= _spec_table_names()


def _module_scope(tree: ast.Module):
    """Every node executed at module level (inside if/try/with too), not inside functions or classes."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stack.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))


def _defined_names(path: Path) -> set[str]:
    """Functions and classes defined anywhere in the file, plus every name bound at module level."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = {node.name for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in _module_scope(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def test_package_files_are_found():
    names = {path.name for path in PACKAGE_FILES}
    assert {"__init__.py", "conventions.py", "data.py", "plots.py", "checks.py"} <= names


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_no_module_defines_a_graded_exercise(path):
    found = (_defined_names(path) - NOT_EXERCISES) & GRADED
    assert not found, f"{path.name} defines graded exercise(s) {sorted(found)}: the package is public"


def test_the_static_scan_sees_definitions(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import numpy as np\nfrom x import causal_mask\n"
                      "class A:\n    def beam_search(self): pass\n"
                      "try:\n    sample = 1\nexcept ImportError:\n    pass\n")
    assert {"np", "causal_mask", "A", "beam_search", "sample"} <= _defined_names(sample)


def test_no_imported_module_exposes_a_graded_exercise():
    modules = [decoder_course] + [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(decoder_course.__path__, prefix="decoder_course.")
    ]
    assert len(modules) >= 5
    for module in modules:
        exposed = (set(vars(module)) - NOT_EXERCISES) & GRADED
        assert not exposed, f"{module.__name__} exposes graded exercise(s) {sorted(exposed)}"


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_package_never_imports_the_autograder_nor_holds_solutions(path):
    source = path.read_text()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(alias.name.split(".")[0] == "autograder" for alias in node.names), path
        elif isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] != "autograder" or node.level, path
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__"):
            literal = node.args[0] if node.args else None
            if isinstance(literal, ast.Constant) and isinstance(literal.value, str):
                assert not literal.value.startswith("autograder"), path
    assert "### BEGIN SOLUTION" not in source and "### BEGIN HIDDEN TESTS" not in source, path
