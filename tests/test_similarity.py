"""Similarity of submissions (autograder/pages/similarity.py): planted copies rank first, independent work is not
flagged,
given code never counts. No grading: the code of each cell is handed in as the report reads it."""

import json
import os
import re
import subprocess
import sys

from autograder.course import notebooks
from autograder.pages import similarity

LESSON = "02-attention"
ITEMS = ("softmax", "masked_softmax", "scaled_dot_product_attention")


def _released(lesson: str) -> str:
    nb = json.loads((notebooks.ROOT / "lessons" / lesson / f"{lesson}.ipynb").read_text())
    return "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def _reference(item: str) -> str:
    return notebooks.reference_source(LESSON, item, keep_markers=False)


# Independent correct answers, written otherwise than the reference, as two other students would.
INDEPENDENT = {
    "ann": {
        "softmax": '''def softmax(x, axis=-1):
    """Softmax along axis."""
    top = np.max(x, axis=axis, keepdims=True)   # for stability
    e = np.exp(x - top)
    total = np.sum(e, axis=axis, keepdims=True)
    return e / total
''',
        "masked_softmax": '''def masked_softmax(scores, allowed=None, axis=-1):
    """Softmax over the allowed entries; rows with none give zeros."""
    if allowed is None:
        return softmax(scores, axis=axis)
    filled = np.where(allowed, scores, -np.inf)
    biggest = np.max(filled, axis=axis, keepdims=True)
    biggest = np.where(np.isfinite(biggest), biggest, 0.0)
    weights = np.where(allowed, np.exp(filled - biggest), 0.0)
    norm = weights.sum(axis=axis, keepdims=True)
    return np.divide(weights, norm, out=np.zeros_like(weights), where=norm > 0)
''',
        "scaled_dot_product_attention": '''def scaled_dot_product_attention(q, k, v, allowed=None):
    """Attention."""
    d = q.shape[-1]
    s = (q @ np.swapaxes(k, -1, -2)) / np.sqrt(d)
    w = masked_softmax(s, allowed)
    return w @ v, w
''',
    },
    "bob": {
        "softmax": '''def softmax(x, axis=-1):
    shifted = x - x.max(axis=axis, keepdims=True)
    ex = np.exp(shifted)
    return ex / ex.sum(axis=axis, keepdims=True)
''',
        "masked_softmax": '''def masked_softmax(scores, allowed=None, axis=-1):
    if allowed is None:
        allowed = np.ones(scores.shape, dtype=bool)
    allowed = np.broadcast_to(allowed, scores.shape)
    out = np.zeros(scores.shape, dtype=scores.dtype)
    m = np.max(np.where(allowed, scores, np.finfo(scores.dtype).min), axis=axis, keepdims=True)
    ex = np.exp(np.where(allowed, scores - m, 0)) * allowed
    s = ex.sum(axis=axis, keepdims=True)
    ok = np.broadcast_to(s > 0, scores.shape)
    out[ok] = (ex / np.where(s > 0, s, 1))[ok]
    return out
''',
        "scaled_dot_product_attention": '''def scaled_dot_product_attention(q, k, v, allowed=None):
    scale = 1.0 / np.sqrt(k.shape[-1])
    logits = np.einsum("...td,...sd->...ts", q, k) * scale
    attn = masked_softmax(logits, allowed, axis=-1)
    return np.einsum("...ts,...sd->...td", attn, v), attn
''',
    },
}


def _disguised(source: str) -> str:
    """A copy made to look like one's own: every name the body assigns changed, comments rewritten, the first two
    statements swapped (the signature and docstring are the release's: left as they are)."""
    close = source.index('"""', source.index('"""') + 3) + 3
    head, body = source[:close], source[close:]
    names = {}
    for name in re.findall(r"^\s+([A-Za-z_]\w*)\s*=(?!=)", body, re.M):
        names.setdefault(name, f"my_{name.lower()}_{len(names)}")
    body = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: names.get(m[0], m[0]), body)
    lines = [re.sub(r"#.*", "# my own idea", line) for line in body.splitlines()]
    statements = [i for i, line in enumerate(lines) if re.match(r"\s+\w+ = ", line)]
    if len(statements) >= 2:
        first, second = statements[:2]
        lines[first], lines[second] = lines[second], lines[first]
    return head + "\n".join(lines) + "\n"


def _class() -> dict[str, dict[str, str]]:
    code: dict[str, dict[str, str]] = {}
    for item in ITEMS:
        cell = code.setdefault(f"{LESSON}/{item}", {})
        cell["ada"] = _reference(item)
        cell["copycat"] = _disguised(_reference(item))
        for student, answers in INDEPENDENT.items():
            cell[student] = answers[item]
    return code


def test_a_disguised_copy_ranks_above_every_independent_pair():
    pairs = similarity.pairs(_class(), {LESSON: _released(LESSON)})
    assert pairs, "no pair found at all"
    top = pairs[0]
    assert {top.a, top.b} == {"ada", "copycat"}, [(p.a, p.b, p.score) for p in pairs]
    assert top.flagged and len(top.matched) >= 2, top
    others = pairs[1:]
    assert all(p.score < top.score and not p.flagged for p in others), [(p.a, p.b, p.score) for p in others]


def test_the_disguise_is_really_one():
    """The copy shares no statement that assigns with the original, and their order differs: only a fingerprint
    over normalised tokens can find it."""
    for item in ITEMS:
        original = [line.strip() for line in _reference(item).splitlines() if re.match(r"\s+\w+ = ", line)]
        copy = [line.strip() for line in _disguised(_reference(item)).splitlines()]
        assert original and not set(original) & set(copy), item
        assert _disguised(_reference(item)) != _reference(item)


def test_independent_solutions_of_a_short_exercise_are_not_flagged():
    code = {"01-masks/causal_mask": {
        "ann": '''def causal_mask(T, S=None):
    S = T if S is None else S
    rows = np.arange(T)[:, None] + (S - T)
    return np.arange(S)[None, :] <= rows
''',
        "bob": '''def causal_mask(T, S=None):
    if S is None:
        S = T
    return np.tril(np.ones((T, S), dtype=bool), k=S - T)
''',
    }}
    pairs = similarity.pairs(code, {"01-masks": _released("01-masks")})
    assert all(not p.flagged and p.score == 0 for p in pairs), pairs


def test_a_pair_that_shares_only_given_code_scores_zero():
    released = _released(LESSON)
    stub = released[:2000]  # the lesson's own scaffolding, as two students might leave it in their cells
    code = {f"{LESSON}/{item}": {"ann": stub, "bob": stub} for item in ITEMS}
    pairs = similarity.pairs(code, {LESSON: released})
    assert all(p.score == 0 for p in pairs), pairs
    without_boilerplate = similarity.pairs(code, {})
    assert without_boilerplate and without_boilerplate[0].flagged, "the same code must match without boilerplate"


def test_the_matching_lines_are_located():
    code = _class()
    boilerplate = {LESSON: _released(LESSON)}
    top = similarity.pairs(code, boilerplate)[0]
    similarity.locate(top, code, boilerplate)
    for match in top.matched:
        for who, slices in zip((top.a, top.b), match.slices):
            source = code[match.cell][who]
            lines = similarity.matching_lines(source, slices)
            assert lines and max(lines) < len(source.splitlines()), (match.cell, who)


def test_the_same_class_gets_the_same_scores_in_every_process():
    """Python salts ``hash()`` anew in every process; fingerprints built on it scored the same copied cell 0.33 in
    one run and 0.54 in the next. Two processes with different salts must agree on every pair's cells."""
    program = ("import json, sys; sys.path.insert(0, 'tests'); import test_similarity as t; "
               "from autograder.pages import similarity; "
               "pairs = similarity.pairs(t._class(), {t.LESSON: t._released(t.LESSON)}); "
               "print(json.dumps([[p.a, p.b, [[c.cell, c.similarity] for c in p.cells]] for p in pairs]))")
    runs = [subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True,
                           cwd=notebooks.ROOT, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2", "3")]
    assert runs[0] == runs[1] == runs[2], runs


def test_kgram_hashes_are_the_polynomial_of_each_window():
    text = "V=V(V)+V*S\nreturn V@V.T"
    expected = []
    for start in range(len(text) - similarity.K + 1):
        value = 0
        for char in text[start:start + similarity.K]:
            value = (value * similarity._BASE + ord(char)) % 2**64
        expected.append(value - 2**64 if value >= 2**63 else value)
    assert similarity.kgram_hashes(text).tolist() == expected
