"""Feedback HTML that is inert and unforgeable: the last preprocessor of nbgrader's ``GenerateFeedback``.

The feedback page is opened by the instructor (and, through ``release_feedback``, by the student), so nothing a
student controls may run or style anything in it, and nothing a student prints may pass for the grader's verdict.
:class:`SafeFeedback` runs after ``GetGrades`` and ``StripHiddenTests`` (see :func:`autograder.grading.pipeline
.nbgrader_config`) and does two things:

1. **Sanitise every student-controlled part** of the autograded notebook with ``nh3`` (the Ammonia sanitiser):

   - outputs: ``text/plain``, ``image/png``, ``image/jpeg`` (valid base64 only) and ``text/latex`` (the template
     escapes it) are kept; ``text/html`` is sanitised; ``text/markdown`` is rendered, then sanitised, as HTML;
     ``image/svg+xml`` is shown as an ``<img>`` of a ``data:`` URL (an SVG loaded as an image runs no script and
     loads nothing); every other type (``application/javascript``, widget views, anything with ``javascript`` in
     its name, PDF, …) is dropped and replaced by a one-line note. Output metadata is rebuilt (numeric image width
     and height only): the template writes it unquoted into ``<img>`` tags, and ``isolated`` would make an iframe;
   - markdown cells: nbconvert's markdown rendering passes raw HTML through, so each cell is rendered here with
     nbconvert's own renderer, sanitised, and put back as one HTML block the template's renderer leaves unchanged
     (checked for every cell; a cell that would not survive is shown as escaped text instead);
   - raw cells: sanitised the same way (nbconvert writes ``text/html`` raw cells as they are);
   - text (streams, tracebacks, ``text/plain``): terminal escapes removed, since nbconvert turns colour codes
     into inline styles (and a title or cursor escape means nothing in a page);
   - cell and notebook metadata: only the (instructor-restored) ``nbgrader`` metadata is kept, so tags cannot add
     CSS classes (``hidden``) to a cell and ``widgets`` state cannot load widget JavaScript.

   Cell sources need nothing: the template highlights them with Pygments, which escapes them.
   The sanitised HTML keeps structure (headings, lists, tables, code, links, ``data:`` images) and loses every
   script, event handler, ``style`` tag and attribute, ``class`` (but a few harmless ones), ``id``/``name``
   (which could hijack the page's anchors), ``javascript:``/``data:`` links, remote images (no tracking pixel),
   iframes, forms, objects, embeds, SVG and MathML.

2. **Write the grader's verdicts where student content cannot reach or imitate them**:

   - a report at the top of the page (item, points, passed/failed, the verdict's message) made from the
     gradebook's scores (``GetGrades``) and the verdict outputs that :func:`autograder.judge.verdicts.apply` wrote
     into each graded cell, never from student text;
   - in each graded cell, that verdict output is replaced by a box headed "Grader's verdict".

   Both are coloured, bordered boxes made with inline styles, which no student content can have (every student
   ``style`` is removed, every student text escaped), and both carry a **seal**: a random code drawn when the page
   is made, after the notebook ran, so no notebook can print it. The report says so. A student output that
   mentions hidden checks or the grader's verdict is shown in a grey dashed frame labelled as the notebook's own
   output.

formgrader's view of a submission (the autograded notebook, in the instructor's Jupyter session) is sanitised the
same way by :class:`SafeFormgrade`, in :class:`~autograder.pages.exporters.FormgradeExporter`
(``pipeline.tools_config`` makes formgrader build it); its verdicts are sealed boxes too, its score inputs and
comment boxes work as before.

The sanitiser itself is :mod:`autograder.pages.sanitiser`. Both pages are made within a bound
(:class:`~autograder.pages.exporters.BoundedExporter`): the preprocessors and the template run in a forked child
with a time, memory and size limit; past one, the page is plain text made without the template, and says why. The
page is written by :class:`~autograder.pages.exporters.FeedbackExporter` (``GenerateFeedback.exporter_class``):
nbconvert's ``HTMLExporter`` without its BeautifulSoup round trip, which re-parsed the whole page only to give
``<img>`` tags an ``alt`` and lab-template cells a ``tabindex`` (most of the time feedback took).
"""

from __future__ import annotations

import html
import re
import secrets
import unicodedata

from nbformat import NotebookNode
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.preprocessors import NbGraderPreprocessor

from autograder.course.checks.framework import PASSED_MESSAGE
from autograder.judge.verdicts import FAILED_NAME, PASSED_PREFIX
from autograder.pages.sanitiser import (
    FONT,
    GREEN,
    GREY,
    MONO,
    NAVY,
    RED,
    grading_metadata,
    joined_text,
    markdown_block,
    plain_cells,
    plain_note,
    safe_markdown,
    sanitize_html,
    sanitize_output,
)
from autograder.term import schedule as term_module

# -- what only the grader writes -------------------------------------------------------------------------------
# verdicts.apply: a passed item's last output is this stream; a failed item's verdict is the only error output of
# its cell (apply turns every error the kernel raised into text), named HiddenCheckFailed.
PASSED = re.compile(re.escape(PASSED_PREFIX) + "(" + re.escape(PASSED_MESSAGE).replace(r"\{n\}", r"\d+") + r")\n?")
_CONFUSABLE = str.maketrans("аеіјоорсухнкмтвԁһ", "aeijoopcyxhkmtbdh")  # Cyrillic letters that look Latin
_VERDICT_WORDS = ("hiddencheck", "graderverdict", "gradersverdict", "graderreport", "gradersreport")


def imitates_verdict(text: str) -> bool:
    """Whether student text reads like a verdict: it mentions hidden checks or the grader's verdict or report
    (case, accents, zero-width characters, Cyrillic look-alikes and punctuation ignored)."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if unicodedata.category(ch) not in ("Cf", "Mn")).casefold()
    letters = re.sub(r"[^a-z]", "", text.translate(_CONFUSABLE))
    return any(word in letters for word in _VERDICT_WORDS)


def _output_text(output: NotebookNode) -> str:
    if output.output_type == "stream":
        return output.text
    if output.output_type == "error":
        return "\n".join(output.traceback) + f"\n{output.ename}: {output.evalue}"
    data = output.get("data", {})
    html_text = re.sub(r"<[^>]*>", "", data.get("text/html", ""))
    return "\n".join([data.get("text/plain", ""), html.unescape(html_text), data.get("text/latex", "")])




def _points(value) -> str:
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return "?"


class SafeFeedback(NbGraderPreprocessor):
    """Sanitise the student's notebook, then add the grader's report and verdict boxes (see the module doc).

    When :class:`~autograder.pages.exporters.BoundedExporter` could not make the page within its bound it runs
    the preprocessors in its own process with ``resources["course_plain"]`` set to why: every student part is then
    kept only as truncated plain text (:func:`plain_cells`), so nothing of it is parsed as markup, and a note under the
    report says so."""

    shows_points = True  # the report and the boxes give each item's points (GetGrades ran before)

    def preprocess(self, nb: NotebookNode, resources: dict):
        verdicts, plain = self._student_part(nb, resources)
        rows = [row for cell, verdict in zip(nb.cells, verdicts) if (row := self._row(cell, verdict)) is not None]
        if plain:
            nb.cells.insert(0, plain_note(plain, "feedback"))
        nb.cells.insert(0, NotebookNode(cell_type="markdown", metadata=NotebookNode(), id="course-grader-report",
                                        source=self._report(rows, resources)))
        return nb, resources

    def _student_part(self, nb: NotebookNode, resources: dict) -> tuple[list, str | None]:
        """Draw the seal, take the verdicts out of the cells, sanitise the rest (or keep it as plain text); the
        verdicts by cell, and why the page is plain (None when it is not)."""
        seal = "-".join(secrets.token_hex(2).upper() for _ in range(2))
        resources.setdefault("course_feedback", {})["seal"] = seal
        self._seal = seal
        meta = nb.get("metadata", {})
        nb.metadata = NotebookNode({key: meta[key] for key in ("kernelspec",) if key in meta})
        nb.metadata.language_info = NotebookNode(name="python", pygments_lexer="ipython3")
        verdicts = [self._take_verdict(cell) for cell in nb.cells]  # first: the rest is sanitised and labelled next
        plain = resources.get("course_plain")
        if plain:
            nb.cells = plain_cells(nb.cells)
            resources["course_plain_done"] = True
            for cell in nb.cells:
                if cell.cell_type == "code":
                    cell.outputs = [self._mark(out) for out in cell.outputs]
        else:
            for cell in nb.cells:
                self._sanitize_cell(cell)
        return verdicts, plain

    # -- the student's part ----------------------------------------------------------------------------------
    def _sanitize_cell(self, cell: NotebookNode) -> None:
        cell.metadata = grading_metadata(cell)
        cell.source = joined_text(cell.get("source", ""))
        if cell.cell_type == "markdown":
            cell.source = safe_markdown(cell.source, cell.pop("attachments", None))
        elif cell.cell_type == "raw":
            # nbconvert writes text/html and untyped raw cells into the page as they are.
            cell.source = sanitize_html(cell.source)
            cell.pop("attachments", None)
        elif cell.cell_type == "code":
            count = cell.get("execution_count")
            cell.execution_count = count if isinstance(count, int) and not isinstance(count, bool) else None
            cell.outputs = [self._mark(sanitize_output(out)) for out in cell.get("outputs", [])]

    def _mark(self, output: NotebookNode) -> NotebookNode:
        """A student output that reads like a verdict, framed and labelled as the notebook's own output."""
        if not imitates_verdict(_output_text(output)):
            return output
        data = output.get("data", {})
        if output.output_type in ("stream", "error"):
            body = f'<pre style="margin:2px 0 0 0">{html.escape(_output_text(output))}</pre>'
        elif "text/html" in data:
            body = f"<div>{data['text/html']}</div>"  # already sanitised
        else:
            body = f'<pre style="margin:2px 0 0 0">{html.escape(_output_text(output))}</pre>'
        label = ("Printed by the notebook's own code. This is not a grader's verdict: the grader's verdicts are "
                 f"the boxes with the seal {self._seal}.")
        framed = (f'<div data-course-grader="student-output" class="tex2jax_ignore" style="border:1px dashed '
                  f'{GREY};background:#f7f7f7;padding:4px 8px;margin:2px 0">'
                  f'<div style="{FONT};font-size:11px;color:{GREY}">{html.escape(label)}</div>{body}</div>')
        return NotebookNode(output_type="display_data", data=NotebookNode({"text/html": framed}),
                            metadata=NotebookNode())

    # -- the grader's part -----------------------------------------------------------------------------------
    def _take_verdict(self, cell: NotebookNode) -> tuple[bool, str] | None:
        """The verdict that verdicts.apply wrote into a graded test cell, taken out of its outputs."""
        grading = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type != "code" or not grading.get("grade") or grading.get("solution"):
            return None
        outputs = cell.get("outputs", [])
        failed = [i for i, out in enumerate(outputs)
                  if out.get("output_type") == "error" and out.get("ename") == FAILED_NAME]
        if failed:
            return False, joined_text(outputs.pop(failed[-1]).get("evalue", ""))
        if outputs and outputs[-1].get("output_type") == "stream":
            found = PASSED.fullmatch(joined_text(outputs[-1].get("text", "")))
            if found:
                outputs.pop()
                return True, found.group(1)
        return None

    def _row(self, cell: NotebookNode, verdict: tuple[bool, str] | None) -> dict | None:
        """A graded cell's line of the report; a test cell also gets the grader's box as its last output."""
        grading = cell.metadata.get("nbgrader", {})
        if not (grading.get("grade") or grading.get("task")) or not grading.get("grade_id"):
            return None
        item, score, points = str(grading["grade_id"]), grading.get("score"), grading.get("points")
        if not self.shows_points:  # formgrader: its own inputs show the points; a box only where a verdict was kept
            if verdict is None or cell.cell_type != "code" or grading.get("solution"):
                return None
            row = {"item": item, "score": None, "points": None, "passed": verdict[0], "message": verdict[1]}
            cell.outputs.append(NotebookNode(output_type="display_data", metadata=NotebookNode(),
                                             data=NotebookNode({"text/html": self._box(row)})))
            return row
        full = score is not None and points is not None and _points(score) == _points(points)
        passed, message = verdict if verdict is not None else (None, "")
        if passed is None:
            passed = full
            if cell.cell_type != "code" or grading.get("solution"):
                message = "graded by hand"
            else:
                message = ("passed" if full else "no points") + \
                    " (the hidden checks' message was not kept: this cell's output was cut)"
        elif passed != full:
            message += " (the score was changed by hand in the gradebook)"
        row = {"item": item, "score": _points(score), "points": _points(points), "passed": passed,
               "message": message}
        if cell.cell_type == "code" and not grading.get("solution"):
            cell.outputs.append(NotebookNode(output_type="display_data", metadata=NotebookNode(),
                                             data=NotebookNode({"text/html": self._box(row)})))
        return row

    def _line(self, row: dict) -> str:
        return (f"{PASSED_PREFIX}{row['message']}" if row["passed"]
                else f"✗ Hidden checks for `{row['item']}`: {row['message']}")

    def _box(self, row: dict) -> str:
        colour, tint = (GREEN, "#e9f6ec") if row["passed"] else (RED, "#fdecea")
        point_word = "point" if row["points"] == "1" else "points"
        points = f" · {row['score']} / {row['points']} {point_word}" if row["points"] is not None else ""
        head = f"Grader's verdict · {row['item']}{points} · seal {self._seal}"
        return (f'<div data-course-grader="verdict" class="tex2jax_ignore" style="border:2px solid {colour};'
                f'border-left:10px solid {colour};border-radius:4px;background:{tint};padding:6px 10px;'
                f'margin:6px 0">'
                f'<div style="{FONT};font-size:11px;font-weight:bold;letter-spacing:0.06em;text-transform:uppercase;'
                f'color:{colour}">{html.escape(head)}</div>'
                f'<div style="{MONO};font-size:13px;white-space:pre-wrap;color:#111;margin-top:3px">'
                f'{html.escape(self._line(row))}</div></div>')

    def _report(self, rows: list[dict], resources: dict) -> str:
        info = resources.get("nbgrader", {})
        lesson, student = str(info.get("assignment", "")), str(info.get("student", ""))
        score, total = _points(info.get("score")), _points(info.get("max_score"))
        cell_style = "padding:4px 8px;border:1px solid #c9d3e0;text-align:left;vertical-align:top"
        lines = []
        for row in rows:
            colour = GREEN if row["passed"] else RED
            status = "✓ passed" if row["passed"] else "✗ failed"
            lines.append(
                f'<tr><td style="{cell_style};{MONO}">{html.escape(row["item"])}</td>'
                f'<td style="{cell_style};white-space:nowrap">{row["score"]} / {row["points"]}</td>'
                f'<td style="{cell_style};color:{colour};font-weight:bold;white-space:nowrap">{status}</td>'
                f'<td style="{cell_style};{MONO};font-size:12px;white-space:pre-wrap">'
                f'{html.escape(self._line(row))}</td></tr>')
        if not lines:
            lines.append(f'<tr><td colspan="4" style="{cell_style}">This notebook has no graded cells.</td></tr>')
        penalty = info.get("late_penalty") or 0
        late = f" (after a late penalty of {_points(penalty)})" if penalty else ""
        explain = (
            "Written by the course's grader after the notebook ran, from the gradebook and the hidden checks' "
            "verdicts. Only this report and the boxes headed “Grader's verdict … seal "
            f"{self._seal}” come from the grader; the seal is drawn when this page is made, so no notebook can "
            "print it. Everything else on this page is the submitted notebook and what its code printed, shown "
            "inert (no scripts, no styles) and unable to change a score.")
        header = "".join(f'<th style="{cell_style};background:#dde6f2">{name}</th>'
                         for name in ("item", "points", "result", "the grader's verdict"))
        return markdown_block(
            f'<div data-course-grader="report" class="tex2jax_ignore" style="border:3px solid {NAVY};'
            f'border-radius:6px;background:#f2f6fb;padding:12px 16px;margin:4px 0 18px 0;{FONT};color:#111">'
            f'<h2 style="font-size:19px;font-weight:bold;color:{NAVY};margin:0">Grader\'s report · '
            f'{html.escape(lesson)} · {html.escape(student)} · {score} / {total} points{late}</h2>'
            f'<div style="font-size:12px;font-weight:bold;color:{NAVY};letter-spacing:0.08em;margin:2px 0 6px 0">'
            f'SEAL {self._seal}</div>{self._submitted_line(resources)}'
            f'<p style="margin:0 0 8px 0;font-size:13px">{html.escape(explain)}</p>'
            f'<table style="border-collapse:collapse;width:100%;font-size:13px;background:white">'
            f'<thead><tr>{header}</tr></thead><tbody>{"".join(lines)}</tbody></table></div>')

    def _submitted_line(self, resources: dict) -> str:
        """The report's line on when the notebook was submitted and what lateness cost, from the gradebook (the
        submission's time, its due date with the extension) and the term's policy; "" without a due date."""
        info = resources.get("nbgrader", {})
        try:
            with Gradebook(info["db_url"]) as gb:
                submission = gb.find_submission(info["assignment"], info["student"])
                submitted, due, extension = submission.timestamp, submission.duedate, submission.extension
                seconds_late = submission.total_seconds_late
        except (KeyError, MissingEntry):
            return ""
        if submitted is None or due is None:
            return ""
        term = term_module.from_config(self)
        policy = term.late if term is not None else None
        penalty = float(info.get("late_penalty") or 0)
        zone = term.zone if term is not None else None  # the term's clock, UTC beside it
        when, due_at = term_module.shown_time(submitted, zone), term_module.shown_time(due, zone)
        extension = f"an extension of {term_module.shown_span(extension.total_seconds())} included" \
            if extension else ""
        extended = f" ({extension})" if extension else ""
        if seconds_late <= 0:
            text, colour = f"Submitted {when}, on time (due {due_at}{', ' + extension if extension else ''}).", GREEN
        elif not penalty and policy is not None and seconds_late <= policy.grace.total_seconds():
            text, colour = (f"Submitted {when}, {term_module.shown_span(seconds_late)} after the due date {due_at}"
                            f"{extended}, within the grace of {term_module.shown_span(policy.grace.total_seconds())}:"
                            " on time."), GREEN
        else:
            cost = f"−{_points(penalty)} points" if penalty else "no points lost"
            rule = f" by the late policy: {policy.describe()}" if policy is not None else ""
            text, colour = (f"Submitted {when}, {term_module.shown_span(seconds_late)} after the due date {due_at}"
                            f"{extended}: {cost}{rule}."), RED
        return (f'<p data-course-grader="submitted" style="margin:0 0 8px 0;font-size:14px;font-weight:bold;'
                f'color:{colour}">{html.escape(text)}</p>')


class SafeFormgrade(SafeFeedback):
    """The same sanitising for formgrader's view of a submission (the autograded notebook, rendered by
    :class:`~autograder.pages.exporters.FormgradeExporter` with nbgrader's ``formgrade`` template in the
    instructor's Jupyter session, whose page holds the XSRF token): no student script, style, id or link runs or reaches
    the grading form. Each test
    cell's verdict becomes a sealed box (formgrader's own inputs show the points); no report."""

    shows_points = False

    def preprocess(self, nb: NotebookNode, resources: dict):
        verdicts, plain = self._student_part(nb, resources)
        for cell, verdict in zip(nb.cells, verdicts):
            self._row(cell, verdict)
        if plain:
            nb.cells.insert(0, plain_note(plain, "formgrader"))
        return nb, resources


__all__ = ["SafeFeedback", "SafeFormgrade", "imitates_verdict"]
