"""Feedback HTML is inert and its verdicts unforgeable (autograder.pages.feedback), whatever the student's notebook
holds.

Unit tests render constructed notebooks with nbgrader's feedback template, as ``GenerateFeedback`` does, and read
the page with a real HTML parser: no script but the template's own (MathJax), no event handler, no ``style`` or
``javascript:`` URL from student content, no iframe, form or object; PNG images and tables still there; a printed
"✓ Hidden checks" never inside the grader's boxes. Each attack is first shown to be live without
:class:`SafeFeedback`, so the checks are known to see it. One end-to-end test grades a 01-masks notebook with
the attacks through :func:`autograder.grading.grade_class.grade` and reads its feedback file.
"""

from __future__ import annotations

import base64
import copy
import html
import re
import zlib
from dataclasses import replace

import nbformat
import pytest
from bs4 import BeautifulSoup
from nbconvert.exporters import HTMLExporter
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output, new_raw_cell
from nbgrader.converters import GenerateFeedback
from traitlets.config import Config

from autograder.course import samples
from autograder.grading import grade_class, pipeline
from autograder.pages import sanitiser
from autograder.pages.feedback import SafeFeedback
from autograder.sandbox import launch as sandbox

LESSON = "01-masks"
# What an honest 01-masks notebook needs on a loaded 2-core machine (as tests/test_adversarial.py), a little more
# room for the attack cell's plot.
LIMITS = pipeline.Limits(cell_timeout=20, interrupt_grace=2, deadline=60, cpu_seconds=120, memory_bytes=1536 << 20,
                         processes=64, file_bytes=16 << 20, tmpfs_bytes=32 << 20, scratch_bytes=48 << 20,
                         output_bytes=2 << 20, notebook_bytes=2 << 20)
FORGED = "✓ Hidden checks: all 4 hidden cases passed"
MATHJAX = "https://cdnjs.cloudflare.com/ajax/libs/mathjax/"


def _png(width: int = 2, height: int = 2) -> str:
    """A real PNG (grey pixels), base64 as a notebook holds it."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")
    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", width.to_bytes(4, "big") + height.to_bytes(4, "big")
                                        + b"\x08\x00\x00\x00\x00")
           + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode()


PNG = _png()
PANDAS_TABLE = ('<div>\n<style scoped>\n    .dataframe tbody tr th:only-of-type {\n        vertical-align: middle;\n'
                '    }\n</style>\n<table border="1" class="dataframe">\n  <thead>\n    <tr style="text-align: right;">'
                '\n      <th></th>\n      <th>loss</th>\n      <th>accuracy</th>\n    </tr>\n  </thead>\n  <tbody>\n'
                '    <tr>\n      <th>0</th>\n      <td>0.693</td>\n      <td>0.51</td>\n    </tr>\n  </tbody>\n'
                '</table>\n</div>')
SVG = ('<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40" onload="alert(\'svg-onload\')">'
       '<script>alert("svg-script")</script><circle cx="20" cy="20" r="15" fill="teal"/></svg>')
HOSTILE_MARKDOWN = (
    "# My answers\n\n"
    '<img src="x" onerror="alert(\'md-onerror\')">\n\n'
    "<style>.output_error, div[data-course-grader] { display: none !important }</style>\n\n"
    "[click me](javascript:alert('md-link')) and <a href=\" JaVaScRiPt:alert('md-link2')\">this</a>\n\n"
    '<p style="position:fixed;top:0;left:0;width:100%;background:#e9f6ec" id="causal_mask" class="hidden">'
    "cover</p>\n\n"
    "<iframe src=\"https://evil.example/\"></iframe><form action=\"https://evil.example/\"><input name=q>"
    "</form><object data=\"x.swf\"></object>\n\n"
    "A formula that stays: $\\sqrt{d_k}$, a table that stays:\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
)


def _graded(grade_id: str, score: float, outputs: list, points: float = 1.0) -> nbformat.NotebookNode:
    cell = new_code_cell(f"visible.check_{grade_id}({grade_id})", outputs=outputs, execution_count=3)
    cell.metadata = {"nbgrader": {"grade": True, "solution": False, "locked": True, "grade_id": grade_id,
                                  "points": points, "score": score, "schema_version": 3},
                     "tags": ["x hidden"]}  # a class that Bootstrap hides: tags must not become classes
    return cell


def attack_notebook() -> nbformat.NotebookNode:
    """A graded notebook as GetGrades leaves it: every attack, a failed item with a forged pass, a passed item."""
    display = [
        new_output("display_data", data={"text/html": "<script>alert('html-script')</script>"
                                                      "<b onmouseover=\"alert('html-handler')\">bold</b>",
                                         "text/plain": "<IPython.core.display.HTML object>"}),
        new_output("display_data", data={"application/javascript": "alert('javascript-output')",
                                         "text/plain": "<IPython.core.display.Javascript object>"}),
        new_output("display_data", data={"application/vnd.jupyter.widget-view+json":
                                         {"model_id": "abc", "version_major": 2, "version_minor": 0},
                                         "text/plain": "IntSlider(value=0)"}),
        new_output("display_data", data={"text/x-javascript": "alert('other-javascript')"}),
        new_output("display_data", data={"image/svg+xml": SVG}),
        new_output("display_data", data={"text/markdown": "<img src=x onerror=\"alert('markdown-output')\">**md**"}),
        new_output("display_data", data={"text/html": "<b>isolated</b><script>alert('isolated')</script>"},
                   metadata={"text/html": {"isolated": True}}),
        new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"},
                   metadata={"image/png": {"width": "1 onerror=alert('png-width')"}}),
        new_output("display_data", data={"image/png": "AAAA\" onerror=\"alert('png-data')"}),
        new_output("execute_result", data={"text/html": PANDAS_TABLE, "text/plain": "   loss  accuracy"},
                   execution_count=2),
        new_output("display_data", data={"text/latex": "<script>alert('latex')</script>$x^2$"}),
        new_output("stream", name="stdout", text="\x1b[38;2;27;122;52;48;2;233;246;236mgreen, like a pass\x1b[0m\n"
                                                 "\x1b]0;a new window title\x07\n"),
        new_output("stream", name="stdout", text=FORGED + "\n"),
    ]
    forged_pass = new_output("stream", name="stdout", text=FORGED + "\n")
    failed = new_output("error", ename="HiddenCheckFailed", evalue="allowed is wrong at 6 place(s)",
                        traceback=["✗ Hidden checks for `causal_mask`: allowed is wrong at 6 place(s)"])
    cells = [
        new_markdown_cell(HOSTILE_MARKDOWN),
        new_code_cell("from IPython.display import HTML, Javascript, display\n"
                      "print('</pre><script>alert(\"source\")</script>')", outputs=display, execution_count=2),
        _graded("causal_mask", 0.0, [new_output("stream", name="stdout", text="[visible check] fine\n"),
                                     forged_pass, failed]),
        _graded("padding_mask", 1.0, [new_output("stream", name="stdout", text=FORGED + "\n")]),
        new_raw_cell("<script>alert('raw-html')</script><b>raw</b>", metadata={"raw_mimetype": "text/html"}),
        new_raw_cell("<img src=x onerror=\"alert('raw-plain')\">"),
    ]
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "widgets": {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2,
                                                                     "version_minor": 0}}})
    return nb


def render(nb: nbformat.NotebookNode, safe: bool = True, score: float = 1.0, max_score: float = 2.0) -> str:
    """The feedback page of ``nb`` as nbgrader's GenerateFeedback makes it (template, paths, no default steps)."""
    converter = GenerateFeedback(coursedir=None, config=Config())
    config = copy.deepcopy(converter.config)
    config.Exporter.default_preprocessors = []
    exporter = HTMLExporter(config=config)
    if safe:
        exporter.register_preprocessor(SafeFeedback(), enabled=True)
    resources = {"nbgrader": {"notebook": LESSON, "assignment": LESSON, "student": "mallory", "score": score,
                              "max_score": max_score, "late_penalty": 0}}
    page, _ = exporter.from_notebook_node(copy.deepcopy(nb), resources)
    return page


# -- reading a page --------------------------------------------------------------------------------------------
def _soup(page: str) -> BeautifulSoup:
    return BeautifulSoup(page, "html.parser")


def _in_grader(element) -> str | None:
    """The kind of grader-written box the element is in (report, verdict, student-output), or None."""
    node = element if getattr(element, "attrs", None) is not None else element.parent  # a tag, or a text node
    while node is not None and getattr(node, "attrs", None) is not None:
        if node.attrs.get("data-course-grader"):
            return node.attrs["data-course-grader"]
        node = node.parent
    return None


def _is_template_script(script) -> bool:
    """nbconvert's MathJax: its loader from cdnjs, and its inline configuration."""
    if script.get("src"):
        return script["src"].startswith(MATHJAX)
    return script.get("type") == "text/x-mathjax-config" and "MathJax.Hub.Config" in script.string \
        and "alert" not in script.string


def _url(value: str) -> str:
    return re.sub(r"[\x00-\x20]", "", html.unescape(value)).lower()


ANCHORS = ("top", "causal_mask", "padding_mask")  # the template's links: "#top" and one per graded cell


def problems(page: str) -> list[str]:
    """Everything live or student-styled in ``page``: an empty list for an inert page."""
    soup, found = _soup(page), []
    for anchor in ANCHORS:
        if len(soup.find_all(attrs={"name": anchor})) + len(soup.find_all(id=anchor)) > 1:
            found.append(f"a second anchor {anchor!r}")
    for script in soup.find_all("script"):
        if not _is_template_script(script):
            found.append(f"script: {str(script)[:80]}")
    for element in soup.find_all(True):
        for name, value in element.attrs.items():
            value = " ".join(value) if isinstance(value, list) else str(value)
            if name.lower().startswith("on"):
                found.append(f"handler {name} on <{element.name}>")
            if name.lower() in ("href", "src", "action", "data", "formaction", "xlink:href") and \
                    _url(value).startswith(("javascript:", "vbscript:", "data:text")):
                found.append(f"{name}={value[:40]} on <{element.name}>")
            if name == "style" and not _in_grader(element):
                found.append(f"style attribute on <{element.name}> outside the grader's boxes")
            if name == "id" and value in ANCHORS or name == "name" and value in ANCHORS and (
                    element.name != "a" or element.contents or element.attrs.keys() != {"name"}):
                found.append(f"{name}={value} on <{element.name}> (steals the page's anchors)")
            if name == "class" and "hidden" in value.split():
                found.append(f"class hidden on <{element.name}>")
        if element.name in ("iframe", "frame", "object", "embed", "form", "input", "button", "base", "meta",
                            "link", "svg", "math"):
            if element.name == "meta" and element.find_parent("head") and not element.get("http-equiv"):
                continue
            found.append(f"<{element.name}>")
        if element.name == "style" and not element.find_parent("head"):
            found.append("a <style> element in the body")
        if element.name == "img" and element.get("src") and not element["src"].startswith("data:image/"):
            found.append(f"remote or relative image {element['src'][:40]}")
    return found


def _boxes(page: str, kind: str) -> list:
    return _soup(page).find_all(attrs={"data-course-grader": kind})


def _texts_outside_grader(page: str, needle: str) -> list[str]:
    """Text with ``needle`` shown bare: outside the grader's boxes and frames, and not in a cell's code."""
    soup = _soup(page)
    return [str(node) for node in soup.find_all(string=lambda s: needle in s)
            if _in_grader(node) is None and not node.find_parent(class_="input_area")]


# -- unit tests ------------------------------------------------------------------------------------------------
def test_each_attack_is_live_without_the_sanitiser():
    """The checks below see every attack: without SafeFeedback the page is full of them."""
    found = "\n".join(problems(render(attack_notebook(), safe=False)))
    for marker in ("html-script", "var element", "handler onerror on <img>", "handler onmouseover",
                   "a <style> element in the body", "<iframe>", "<form>", "<object>", "class hidden",
                   "id=causal_mask", "a second anchor 'causal_mask'", "href=javascript:", "src=data:text/html",
                   "style attribute on <p>", "style attribute on <span>", "remote or relative image"):
        assert marker in found, f"{marker!r} not seen live:\n{found}"


def test_the_page_is_inert():
    page = render(attack_notebook())
    assert problems(page) == []
    for word in ("alert", "javascript:"):
        live = [str(tag)[:80] for tag in _soup(page).find_all(True)
                if any(word in str(v).lower() for v in tag.attrs.values())]
        assert not live, live
    assert "<script>alert" not in page, "a live script in the page source"


def test_code_sources_are_escaped_by_the_highlighter():
    soup = _soup(render(attack_notebook()))
    assert any('</pre><script>alert("source")</script>' in node for node in soup.find_all(string=True)), \
        "the code cell's source should be shown as text"
    assert not [s for s in soup.find_all("script") if "source" in (s.string or "")]


def test_what_is_dropped_says_so_and_what_is_kept_renders():
    page = render(attack_notebook())
    soup = _soup(page)
    text = soup.get_text()
    assert "<IPython.core.display.Javascript object>\n[not shown in the feedback: application/javascript output]" \
        in text
    assert "[not shown in the feedback: application/vnd.jupyter.widget-view+json output]" in text
    assert "[not shown in the feedback: text/x-javascript output]" in text
    pngs = [img for img in soup.find_all("img") if img.get("src", "").startswith("data:image/png;base64,")]
    assert [img["src"].split(",", 1)[1] for img in pngs] == [PNG], "the valid PNG stays, the forged one goes"
    svg = [img for img in soup.find_all("img") if img.get("src", "").startswith("data:image/svg+xml;base64,")]
    assert len(svg) == 1, "the SVG is shown as an image (no script runs in an SVG image)"
    tables = [t for t in soup.find_all("table") if t.find("th", string="loss")]
    assert len(tables) == 1 and tables[0].find("td", string="0.693"), "the pandas table renders"
    md_tables = [t for t in soup.find_all("table") if t.find("th", string="a")]
    assert md_tables and md_tables[0].find("td", string="2"), "the markdown table renders"
    assert "$\\sqrt{d_k}$" in text, "math is left for MathJax"
    assert soup.find("b", string="bold") and soup.find("strong", string="md"), "harmless markup stays"
    assert "green, like a pass" in text and "\x1b" not in page, "text stays, its terminal escapes go"
    assert soup.find("a", string="click me") is not None  # the link text stays, without its javascript: URL


def test_the_grader_report_comes_first_and_says_which_part_is_the_graders():
    page = render(attack_notebook(), score=1.0, max_score=2.0)
    soup = _soup(page)
    report, = soup.find_all(attrs={"data-course-grader": "report"})
    container = soup.find(id="notebook-container")
    first = container.find(attrs={"data-course-grader": True})
    assert first is report, "the report is the first thing in the notebook"
    seal = re.search(r"SEAL ([0-9A-F]{4}-[0-9A-F]{4})", report.get_text()).group(1)
    rows = {tr.find_all("td")[0].get_text(): [td.get_text() for td in tr.find_all("td")]
            for tr in report.find("tbody").find_all("tr")}
    assert rows["causal_mask"][1:3] == ["0 / 1", "✗ failed"]
    assert "allowed is wrong at 6 place(s)" in rows["causal_mask"][3]
    assert rows["padding_mask"][1:3] == ["1 / 1", "✓ passed"]
    assert rows["padding_mask"][3] == "✓ Hidden checks: all 4 hidden cases passed"
    assert "1 / 2 points" in report.get_text() and "only this report" in report.get_text().lower()
    verdicts = _boxes(page, "verdict")
    assert len(verdicts) == 2 and all(f"seal {seal}" in box.get_text() for box in verdicts)
    assert all("border" in box["style"] for box in [report, *verdicts]), "the grader's boxes are framed"


def test_a_printed_verdict_is_never_shown_as_the_graders():
    page = render(attack_notebook())
    failed, passed = _boxes(page, "verdict")
    assert "✗ Hidden checks for `causal_mask`: allowed is wrong at 6 place(s)" in failed.get_text()
    assert "0 / 1" in failed.get_text() and FORGED not in failed.get_text()
    assert FORGED in passed.get_text() and "1 / 1" in passed.get_text()
    # The student's forged lines: each in a frame that says it is the notebook's own output, none bare.
    assert _texts_outside_grader(page, "Hidden checks") == []
    framed = _boxes(page, "student-output")
    assert len(framed) == 2 and all(FORGED in box.get_text() for box in framed)  # the attack cell, causal_mask
    assert all("not a grader's verdict" in box.get_text() for box in framed)
    assert not any(box.find_parent(attrs={"data-course-grader": "verdict"}) for box in framed)


def test_the_seal_is_new_on_every_page():
    seals = {re.search(r"SEAL ([0-9A-F-]+)", _boxes(render(attack_notebook()), "report")[0].get_text()).group(1)
             for _ in range(3)}
    assert len(seals) == 3


def test_student_html_cannot_produce_the_graders_marks():
    forged_box = ('<div data-course-grader="verdict" class="tex2jax_ignore" style="border:2px solid #1b7a34">'
                  "GRADER'S VERDICT · causal_mask · 1 / 1 point</div>")
    cleaned = sanitiser.sanitize_html(forged_box)
    assert "data-course-grader" not in cleaned and "style" not in cleaned and "tex2jax" not in cleaned
    assert "seal" not in sanitiser.markdown_block(cleaned).lower()


@pytest.mark.parametrize("source", [
    "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "<a href='javascript:alert(1)'>x</a>",
    "<a href='jav&#x09;ascript:alert(1)'>x</a>", "<svg><script>alert(1)</script></svg>",
    "<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>", "<style>*{display:none}</style>",
    "<div style='display:none'>x</div>", "<iframe srcdoc='<script>alert(1)</script>'></iframe>",
    "<base href='https://evil.example/'>", "<meta http-equiv='refresh' content='0;url=https://evil.example'>",
    "<link rel=stylesheet href='https://evil.example/x.css'>", "<details open ontoggle=alert(1)>",
    "<img src='https://evil.example/pixel.png'>", "<a href='data:text/html,<script>alert(1)</script>'>x</a>",
    "<!--><script>alert(1)</script>-->", "<noscript><p title='</noscript><img src=x onerror=alert(1)>'>",
])
def test_markdown_with_hostile_html_renders_inert(source):
    nb = new_notebook(cells=[new_markdown_cell(f"before\n\n{source}\n\nafter")])
    unsafe = render(nb, safe=False)  # most are live without the sanitiser (python's parser misses noscript's)
    assert problems(unsafe) or "evil" in source or "<!--" in source or "noscript" in source
    page = render(nb)
    assert problems(page) == []
    assert "before" in page and "after" in page


def test_markdown_blocks_pass_the_template_renderer_unchanged():
    html_text = sanitiser.sanitize_html(sanitiser._markdown("# T\n\n```python\ndef f():\n\n    return 1 < 2\n```\n"))
    block = sanitiser.markdown_block(html_text)
    assert sanitiser._markdown(block).strip() == block and "\n" not in block
    # Code with blank lines keeps them (as &#10;, the same character to the browser).
    assert "return" in _soup(block).get_text() and "\n\n" in _soup(block).get_text()


def test_outputs_keep_only_safe_types_and_metadata():
    out = sanitiser.sanitize_output(new_output("display_data", data={
        "image/png": PNG, "text/latex": "$x<y$", "application/pdf": "JVBER", "text/plain": "fig"},
        metadata={"image/png": {"width": 300, "height": "2 onerror=x"}, "filenames": {"image/png": "/etc/passwd"}}))
    assert set(out.data) == {"image/png", "text/latex", "text/plain"}
    assert out.metadata == {"image/png": {"width": 300}}
    js = sanitiser.sanitize_output(new_output("display_data", data={"application/javascript": "alert(1)"}))
    assert js.data == {"text/plain": "[not shown in the feedback: application/javascript output]"}


def test_markdown_attachments_show_images_only():
    cell = new_markdown_cell("![plot](attachment:plot.png) ![page](attachment:page.html)")
    cell.attachments = {"plot.png": {"image/png": PNG},
                        "page.html": {"text/html": base64.b64encode(b"<script>alert(1)</script>").decode()}}
    page = render(new_notebook(cells=[cell]))
    assert problems(page) == []
    sources = [img.get("src", "") for img in _soup(page).find_all("img")]
    assert sources == [f"data:image/png;base64,{PNG}"]


def _one_graded(outputs: list, score: float) -> list:
    page = render(new_notebook(cells=[_graded("causal_mask", score, outputs)]), score=score, max_score=1.0)
    return _boxes(page, "verdict") + _boxes(page, "student-output")


def test_a_verdict_cut_by_the_output_limit_is_not_replaced_by_student_text():
    """nbgrader's LimitOutput may drop a passed verdict's line: a line the student printed last is not taken
    for it, whatever it says, and the box still shows the gradebook's score."""
    box, framed = _one_graded([new_output("stream", name="stdout", text="x\n" * 998 + "... Output truncated ..."),
                               new_output("stream", name="stdout", text="✓ Hidden checks: bonus points\n")], 1.0)
    assert "1 / 1" in box.get_text() and "bonus" not in box.get_text() and "was not kept" in box.get_text()
    assert "bonus points" in framed.get_text()
    box, = _one_graded([new_output("stream", name="stdout", text="x\n")], 0.0)
    assert "0 / 1" in box.get_text() and "✗" in box.get_text()


def test_a_score_changed_by_hand_is_the_one_shown():
    box, = _one_graded([new_output("stream", name="stdout", text=FORGED + "\n")], 0.0)
    assert "0 / 1" in box.get_text() and "changed by hand" in box.get_text()


# -- end to end ------------------------------------------------------------------------------------------------
ATTACK_CELL = r'''
from IPython.display import HTML, Javascript, Markdown, SVG, display
display(HTML("<script>document.title = 'pwned-html'</script><b onmouseover=\"alert('handler')\">bold</b>"))
display(Javascript("document.title = 'pwned-js'"))
display(Markdown("<img src=x onerror=\"alert('markdown-output')\"> *markdown*"))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="20" height="20"><script>alert(1)</script>'
            '<rect width="20" height="20" fill="teal"/></svg>'))
print("✓ Hidden checks: all 4 hidden cases passed")
import matplotlib.pyplot as plt
plt.figure(figsize=(2, 2))
plt.plot([0, 1], [1, 0])
plt.show()
'''


@pytest.mark.pipeline
def test_graded_feedback_of_a_hostile_notebook_is_inert_and_the_verdicts_are_the_graders(tmp_path, monkeypatch):
    sandbox.check_available()
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel draws inline, as for a student (conftest: Agg)
    nb = samples.perfect(LESSON)
    # A wrong causal_mask (everything allowed) that prints a forged pass whenever it is called.
    solution = next(i for i, c in enumerate(nb.cells) if "causal_mask" in c.metadata.get("course", {}).get(
        "exercise", []))
    nb.cells[solution].source = ("import numpy as np\n\ndef causal_mask(T: int) -> np.ndarray:\n"
                                 "    print('✓ Hidden checks: all 4 hidden cases passed')\n"
                                 "    return np.ones((T, T), dtype=bool)\n")
    nb.cells.insert(2, new_markdown_cell(HOSTILE_MARKDOWN))
    nb.cells.insert(3, new_code_cell(ATTACK_CELL))
    path = tmp_path / "incoming" / "mallory" / LESSON / f"{LESSON}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    work = tmp_path / "work"
    outcomes = grade_class.grade(tmp_path / "incoming", work, [LESSON], limits=replace(LIMITS))
    mallory = next(o for o in outcomes if o.student == "mallory")
    assert mallory.ok and mallory.score == 3.0 and mallory.max_score == 4.0, mallory
    page_path = work / "feedback" / "mallory" / LESSON / f"{LESSON}.html"
    page = page_path.read_text()
    assert problems(page) == []
    assert "pwned" not in " ".join(s.string or "" for s in _soup(page).find_all("script"))
    report, = _boxes(page, "report")
    rows = {tr.find_all("td")[0].get_text(): [td.get_text() for td in tr.find_all("td")]
            for tr in report.find("tbody").find_all("tr")}
    assert set(rows) == {"causal_mask", "padding_mask", "combine_masks", "mask_to_bias"}
    assert rows["causal_mask"][1:3] == ["0 / 1", "✗ failed"] and "Hidden checks for `causal_mask`" in \
        rows["causal_mask"][3]
    for item in ("padding_mask", "combine_masks", "mask_to_bias"):
        assert rows[item][1:3] == ["1 / 1", "✓ passed"], rows[item]
        assert rows[item][3].startswith("✓ Hidden checks: all ") and rows[item][3].endswith("passed")
    assert "3 / 4 points" in report.get_text()
    verdicts = _boxes(page, "verdict")
    assert len(verdicts) == 4 and sum("✗ Hidden checks" in box.get_text() for box in verdicts) == 1
    # The forged prints (the attack cell's and the wrong causal_mask's, in its test cell) are all framed as the
    # notebook's own output; none is bare, none inside a verdict.
    assert _texts_outside_grader(page, "Hidden checks") == []
    framed = _boxes(page, "student-output")
    assert len(framed) >= 2 and all("not a grader's verdict" in box.get_text() for box in framed)
    soup = _soup(page)
    plots = [img for img in soup.find_all("img") if img.get("src", "").startswith("data:image/png;base64,")]
    # the lesson's own mask plots are demonstration cells, skipped while grading: the attack cell's plot is the one
    assert len(plots) >= 1, "the attack cell's plot still renders"
    assert soup.find("b", string="bold") is not None
