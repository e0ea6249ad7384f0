"""nbgrader preprocessors that put the trusted verdicts into nbgrader's own pipeline.

``TrustedExecute`` replaces nbgrader's ``Execute`` in ``Autograde.autograde_preprocessors`` (see
:func:`autograder.grading.pipeline.nbgrader_config`): it writes the hidden cases, runs the notebook in a bubblewrap
sandbox
(:mod:`autograder.sandbox.launch`; a crashed, killed or hung kernel ends the run, not the grading), judges outside the
kernel, and writes each verdict into its graded cell, where ``SaveAutoGrades`` reads it.
``RestoreGradingMetadata`` runs first among nbgrader's sanitizing steps: the grading metadata of a submission is
the instructor's, whatever the student's copy says. What happened to a notebook, in words, is logged on the
``autograder.grading`` logger and kept in :data:`NOTES` for the grade CSV.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from jupyter_core.utils import ensure_async
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins import CsvExportPlugin
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Bool, Dict, Enum, Unicode

from autograder.course import notebooks
from autograder.course.checks import framework
from autograder.course.checks.framework import write_cases
from autograder.judge import verdicts
from autograder.sandbox import kernel as sandbox_kernel
from autograder.sandbox import launch as sandbox
from autograder.sandbox import warm as warm_sandboxes
from decoder_course.harvest import ENV_VAR
from decoder_course.text import csv_writer, shown

HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
TIMED_OUT = "timed out"  # in the note of a cell that ran past its limit (the canary's failure message looks for it)

log = logging.getLogger("autograder.grading")
# (lesson, student) -> what happened while grading that notebook, in words; the pipeline takes them per outcome.
NOTES: dict[tuple[str, str], list[str]] = {}


def note(lesson: str, student: str, text: str, level: int = logging.WARNING) -> None:
    """Say what happened to one notebook: in the log, and (warnings) in the notes the grade CSV shows. The text
    may quote the kernel (its stderr, an exception message): it is escaped here, once, for every place it goes."""
    text = shown(text)
    log.log(level, "%s/%s: %s", student, lesson, text)
    if level >= logging.WARNING:
        NOTES.setdefault((lesson, student), []).append(text)


def strip_hidden(source: str) -> str:
    """A test cell's source without its hidden part (what the release and the feedback show)."""
    kept, hidden = [], False
    for line in source.splitlines():
        if HIDDEN_BEGIN in line:
            hidden = True
        elif HIDDEN_END in line:
            hidden = False
        elif not hidden:
            kept.append(line)
    return "\n".join(kept).strip()


class RestoreGradingMetadata(NbGraderPreprocessor):
    """The instructor's grading metadata for every cell, whatever the submitted copy says.

    nbgrader alone aborts the whole notebook when a graded cell was made ungraded, a cell carries a forged
    ``grade_id``, or a solution cell was marked graded. Here: known cells get the gradebook's metadata back,
    cells with an unknown or a duplicated id become plain cells, and a test cell whose metadata was deleted is
    recognised by its source. A deleted test cell is put back by ``OverwriteCells`` (its first line commented
    out, the rest the instructor's code), so it is graded as usual.
    """

    def preprocess(self, nb: NotebookNode, resources: dict):
        info = resources["nbgrader"]
        lesson, student = info["assignment"], info.get("student", "?")
        with Gradebook(info["db_url"]) as gb:
            source = gb.find_notebook(info["notebook"], lesson)
            truth = {}
            for cell in source.source_cells:
                truth[cell.name] = {"grade": False, "solution": False, "task": False, "locked": cell.locked,
                                    "schema_version": 3, "grade_id": cell.name, "cell_type": cell.cell_type,
                                    "source": cell.source}
            for cell in source.grade_cells:
                truth[cell.name].update(grade=True, points=float(cell.max_score))
            for cell in source.solution_cells:
                truth[cell.name]["solution"] = True
            for cell in source.task_cells:
                truth[cell.name].update(task=True, points=float(cell.max_score))
        present = {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells}
        # A locked cell whose metadata was deleted is known by its visible source.
        by_source = {strip_hidden(t["source"]): name for name, t in truth.items()
                     if t["locked"] and name not in present and strip_hidden(t["source"])}
        last = {}
        for index, cell in enumerate(nb.cells):
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if grade_id in truth:
                last[grade_id] = index
        for index, cell in enumerate(nb.cells):
            meta = cell.setdefault("metadata", NotebookNode())
            if isinstance(meta.get("course"), dict):  # only the grader writes a verdict (verdicts.apply)
                meta["course"].pop(verdicts.VERDICT_KEY, None)
            if "nbgrader" not in meta:
                name = by_source.pop(strip_hidden(cell.get("source", "")), None) if cell.cell_type == "code" else None
                if name is None:
                    continue
                note(lesson, student, f"cell {index} is the test cell `{name}` with its grading metadata deleted: "
                                      "restored")
                last[name] = index
                meta["nbgrader"] = NotebookNode({k: v for k, v in truth[name].items()
                                                 if k not in ("cell_type", "source")})
                continue
            else:
                grade_id = meta["nbgrader"].get("grade_id")
                flags = meta["nbgrader"]
                if grade_id is None and not any(flags.get(k) for k in ("grade", "solution", "locked", "task")):
                    continue  # plain cell with empty grading metadata
            if grade_id not in truth:
                note(lesson, student, f"cell {index} has grading metadata for an unknown cell id {grade_id!r}: "
                                      "it is graded as an ordinary cell")
                del meta["nbgrader"]
                continue
            if last[grade_id] != index:
                note(lesson, student, f"cell {index} duplicates `{grade_id}`: only its last copy is graded")
                del meta["nbgrader"]
                continue
            want = {k: v for k, v in truth[grade_id].items() if k not in ("cell_type", "source")}
            got = {k: meta["nbgrader"].get(k) for k in want}
            if got != want:
                changed = sorted(k for k in want if got[k] != want[k])
                note(lesson, student, f"the grading metadata of `{grade_id}` was edited ({', '.join(changed)}): "
                                      "restored")
            meta["nbgrader"] = NotebookNode(want)
        for name in sorted(set(truth) - set(last)):
            if truth[name]["grade"]:
                note(lesson, student, f"the test cell `{name}` was deleted: nbgrader puts the instructor's copy "
                                      "back, and it is graded")
        return nb, resources


class TrustedExecute(Execute):
    """Execute the submission in a sandbox, then replace in-kernel test outcomes by verdicts made here."""

    secret_file = Unicode(
        "", help="File holding the course's grading secret (the seed of hidden cases); made on first use."
    ).tag(config=True)
    sandbox = Bool(True, help="Run the kernel in a bubblewrap sandbox. False only with --no-sandbox (unsafe).").tag(
        config=True)
    limits = Dict({}, help="Fields of autograder.sandbox.launch.Limits; missing ones keep their defaults.").tag(
        config=True)
    skip_demos = Bool(True, help="Skip the demonstration cells a student left as released (see "
                                 "autograder.course.notebooks.untouched_demo); an edited one runs.").tag(config=True)
    warm = Bool(True, help="Keep one sandbox per student between their notebooks, with a zygote that has imported "
                           "the lessons' libraries once and forks each notebook's kernel (autograder.sandbox.launch."
                           "WarmSandbox). False: a new sandbox and a fresh interpreter per notebook.").tag(config=True)
    # The kernel is killed, not asked to stop: a hostile kernel may ignore a polite request.
    shutdown_kernel = Enum(["graceful", "immediate"], default_value="immediate").tag(config=True)
    _box: sandbox.Sandbox | None = None

    @classmethod
    def prestart(cls, config, student: str) -> None:
        """Launch ``student``'s warm sandbox now, as this configuration would have :meth:`preprocess` ask for it,
        so that its zygote imports while nbgrader does its own work before the kernel (see
        :func:`autograder.sandbox.warm.prestart_warm`); nothing when sandboxes or warm ones are off."""
        execute = cls(config=config)
        if execute.sandbox and execute.warm:
            warm_sandboxes.prestart_warm(student, sandbox.Limits(**execute.limits))

    def _secret(self) -> bytes:
        path = Path(self.secret_file or os.environ.get("DECODER_COURSE_SECRET_FILE", ".grading/secret"))
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(32))
            path.chmod(0o600)
        return path.read_bytes()

    # -- the kernel ----------------------------------------------------------------------------------------------
    def create_kernel_manager(self):
        if self._box is None:
            return super().create_kernel_manager()
        self.km = sandbox_kernel.SandboxedKernelManager(self._box, config=self.config)
        return self.km

    def preprocess_cell(self, cell, resources, index):
        """Run one cell. A graded test cell's hidden cases, and what it hands in, are in the kernel's view only
        while it runs: no other cell can read the hidden inputs, or the outputs computed from them."""
        self._cell = index
        self.iopub_timeout = self._grace  # nbconvert's preprocess set the configured one again
        if self.skip_demos and notebooks.untouched_demo(cell):
            # the instructor's demonstration, unedited: no graded item reads it (the builder checks), and a
            # student could have deleted it, so skipping it cannot raise a score; it only saves its time
            cell.outputs = [NotebookNode(output_type="stream", name="stdout", text=notebooks.DEMO_SKIPPED)]
            cell.execution_count = None
            return cell, resources
        item = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        staged = [p for p in self._staged.glob("*") if p.stem == item] if item and cell.cell_type == "code" else []
        for path in staged:
            shutil.copyfile(path, self._cases / path.name)
            (self._cases / path.name).chmod(0o444)
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        finally:
            self._hand_in([path.name for path in staged])
        if staged:
            self._answer(item, index)
        return cell, resources

    def _hand_in(self, names: list[str]) -> None:
        """Take the cases out of the kernel's view, and what it handed in for them out of its reach."""
        for name in names:
            (self._cases / name).unlink(missing_ok=True)
            handed_in = self._outputs / name  # taken as it is: a link stays a link, and is refused
            if os.path.lexists(handed_in):
                framework.take_out(handed_in, self._collected / name)

    def _answer(self, item: str, index: int) -> None:
        """An item whose building block raised on its cases runs them again, right after its cell, with a correct
        building block's answers where the student's raised (see :func:`verdicts.answer_rounds`)."""
        if item in self._plan.items:
            verdicts.answer_rounds(self._plan, item, self._collected, lambda cases: self._rerun(item, index, cases))

    def _rerun(self, item: str, index: int, cases: list) -> None:
        """Run ``cases`` of ``item`` in the kernel once more, as its cell's hidden part does, and hand them in."""
        write_cases(self._cases, item, cases, self._plan.items[item][0].forbidden)
        names = [f"{item}.json", f"{item}.npz"]
        for name in names:
            (self._cases / name).chmod(0o444)
        probe = NotebookNode(cell_type="code", metadata={}, outputs=[],
                             source=f"from decoder_course.harvest import collect; collect({item!r}, globals())")
        cell = self.nb.cells[index]
        try:
            self.execute_cell(probe, index, store_history=False)
        finally:
            self.nb.cells[index] = cell  # nbclient puts the cell it ran in its place: the graded cell stays
            self._hand_in(names)

    def _get_timeout(self, cell):
        """This notebook's cell limit, stretched by the machine's measured slowdown (see :meth:`preprocess`)."""
        return self._cell_limit

    async def _async_handle_timeout(self, timeout, cell=None):
        self._timed_out.add(self._cell)
        self._note(f"{self._cell_name(self._cell)} {TIMED_OUT}: ran past the {timeout} s cell limit: interrupted"
                   f"{sandbox.stretch_note(self._limits.cell_timeout, self._slowdown)}")
        return await super()._async_handle_timeout(timeout, cell)

    # -- what the kernel sends ----------------------------------------------------------------------------------
    def process_message(self, msg, cell, cell_index):
        """Charge every IOPub message of a cell to the output budget before nbclient stores any of it (outputs,
        display updates, widget state); past the cell's or the notebook's budget it is dropped, with one note.
        Only what stores nothing passes regardless: a cell's idle status ends it."""
        if msg["msg_type"] not in _UNSTORED:
            over = self._budget.refused(cell_index) or self._budget.charge(
                cell_index, message_charge(msg, self._display_id_map))  # sized only while the cell is open
            if over:
                self._drop(over, cell, cell_index)
                return None
        try:
            return super().process_message(msg, cell, cell_index)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # nbclient trusts the fields it reads
            if cell_index not in self._malformed_cells:
                self._malformed_cells.add(cell_index)
                self._note(f"{self._cell_name(cell_index)} sent a malformed {shown(str(msg['msg_type']))[:40]} "
                           f"message ({type(exc).__name__}: {shown(str(exc))[:80]}): ignored")
            return None

    def _drop(self, over: str, cell, cell_index: int) -> None:
        """Say once per cell, in the cell, and once per cell limit or notebook, in the log, that output past a
        limit was dropped."""
        if cell_index in self._dropped_cells:
            return
        self._dropped_cells.add(cell_index)
        cell.outputs.append(NotebookNode(output_type="stream", name="stdout", text=_DROPPED[over]))
        if over == "notebook":
            if self._dropped_notebook:
                return
            self._dropped_notebook = True
        limit = self._limits.output_bytes if over == "notebook" else self._limits.cell_output_bytes
        self._note(f"{self._cell_name(cell_index)} sent past the {limit / 2**20:g} MB output limit of "
                   f"{'the notebook' if over == 'notebook' else 'a cell'}"
                   f"{' in one message (its connection was closed, then opened again)' if over == 'message' else ''}"
                   ": further output dropped")

    async def _async_poll_output_msg(self, parent_msg_id, cell, cell_index):
        """Read the cell's IOPub messages. A frame over the message cap closes the connection (see
        :class:`sandbox_kernel.CappedChannel`), and what the kernel sent meanwhile is lost, its idle status perhaps: the
        cell's output ends there, noted, and nbclient waits for its reply alone (a dead kernel it reports itself)."""
        try:
            await super()._async_poll_output_msg(parent_msg_id, cell, cell_index)
        except sandbox_kernel.ConnectionDropped:
            if not await self._kernel_ended():
                self._budget.close(cell_index)
                self._drop("message", cell, cell_index)

    async def _async_poll_for_reply(self, msg_id, cell, timeout, task_poll_output_msg, task_poll_kernel_alive):
        """The reply on the shell channel; a frame over the message cap there loses it: the notebook stops."""
        try:
            return await super()._async_poll_for_reply(msg_id, cell, timeout, task_poll_output_msg,
                                                       task_poll_kernel_alive)
        except sandbox_kernel.ConnectionDropped:
            task_poll_output_msg.cancel()
            task_poll_kernel_alive.cancel()
            if await self._kernel_ended():
                raise DeadKernelError("Kernel died") from None
            raise sandbox_kernel.ConnectionDropped(
                f"the kernel sent a message over the {self._limits.cell_output_bytes / 2**20:g} MB output limit "
                "of a cell on its shell channel, whose connection was closed") from None

    async def _kernel_ended(self, seconds: float = 1.0) -> bool:
        """Whether the kernel (or its relay) ended within ``seconds``: a connection also closes then."""
        deadline = time.monotonic() + seconds
        while await ensure_async(self.kc.is_alive()):  # the client knows of the relay too
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    # -- one notebook --------------------------------------------------------------------------------------------
    def preprocess(self, nb: NotebookNode, resources: dict):
        info = resources["nbgrader"]
        self._begin(info["assignment"], info["student"], nb)
        scratch = Path(tempfile.mkdtemp(prefix="grade-"))
        self._box = self._sandbox(scratch)
        try:
            if self._box is not None:
                self._box.slowdown = self._slowdown
                self._box.prepare()
                harvest = self._box.harvest
            else:
                harvest = scratch / "harvest"
            plan = self._plan = verdicts.prepare(nb, self._lesson, self._student, self._secret(), harvest)
            # The cases wait outside the kernel's view, and the outputs are taken out of it, by preprocess_cell.
            self._cases, self._staged = harvest / "cases", scratch / "staged"
            self._outputs, self._collected = harvest / "outputs", scratch / "collected" / "outputs"
            self._staged.mkdir()
            self._cases.mkdir(parents=True, exist_ok=True)
            for path in self._cases.iterdir():  # the folder stays: a warm sandbox has it bound
                shutil.move(path, self._staged / path.name)
            self._collected.mkdir(parents=True)
            for private in (self._staged, self._collected.parent):
                private.chmod(0o700)
            if self._box is not None:
                self._box.seal()
            nb, resources = self._run(nb, resources, harvest)
            judged = dataclasses.replace(plan, scratch=self._collected.parent)
            decided = verdicts.decide(judged, self._unfinished())
            verdicts.apply(nb, decided)
            for item, verdict in decided.items():
                summary = "passed" if verdict.passed else "failed: " + verdict.message.splitlines()[0][:160]
                self._note(f"{item}: {summary}", logging.INFO)
        finally:
            if isinstance(self._box, warm_sandboxes.WarmSandbox):
                self._box.finish_notebook()
            elif self._box is not None:
                self._box.release()  # its capped file systems, before their folders go
            shutil.rmtree(scratch, ignore_errors=True)
            self._box = None
        return nb, resources

    def _begin(self, lesson: str, student: str, nb: NotebookNode) -> None:
        """What this object knows of one notebook, before it runs."""
        self._lesson, self._student, self._nb = lesson, student, nb
        self._limits = sandbox.Limits(**self.limits)
        # the time limits are an idle machine's: stretched by how busy this one is now (see sandbox.slowdown)
        self._slowdown = sandbox.slowdown()
        self._cell_limit = max(1, round(self._limits.cell_timeout * self._slowdown))
        self._grace = max(1, round(self._limits.interrupt_grace * self._slowdown))
        self._timed_out: set[int] = set()  # cells that ran past their limit
        self._cell = -1
        self._budget = OutputBudget(self._limits.cell_output_bytes, self._limits.output_bytes)
        self._dropped_cells: set[int] = set()  # cells whose dropped output was noted
        self._dropped_notebook = False  # whether the notebook's limit was noted
        self._malformed_cells: set[int] = set()  # cells whose malformed message was noted

    def _sandbox(self, scratch: Path) -> sandbox.Sandbox | None:
        """This notebook's sandbox: the student's warm one (see :class:`autograder.sandbox.warm.WarmSandbox`), or a
        cold one of its own when warm sandboxes are off or the warm one cannot start."""
        if not self.sandbox:
            return None
        if self.warm and warm_sandboxes.warm_possible():
            try:
                uses_torch = any(_IMPORTS_TORCH.search(cell.source) for cell in self._nb.cells
                                 if cell.cell_type == "code")  # only how soon its kernel starts
                return warm_sandboxes.warm_sandbox(self._student, self._limits, uses_torch)
            except (sandbox.SandboxUnavailable, OSError, RuntimeError) as exc:
                self._note(f"the student's warm sandbox could not start ({shown(str(exc))[:200]}): a cold one "
                           "was used", logging.INFO)
        return sandbox.Sandbox(scratch, self._limits)

    def _run(self, nb: NotebookNode, resources: dict, harvest: Path):
        """Run the notebook; whatever stops it early is noted, never raised: what was harvested still counts."""
        previous = os.environ.get(ENV_VAR)
        if self._box is None:
            os.environ[ENV_VAR] = str(harvest)  # unsandboxed: the kernel inherits this process's environment
        stopped = ""
        self._stopped_early = False
        try:
            nb, resources = super().preprocess(nb, resources)
        except CellTimeoutError:
            self._stopped_early = True
            stopped = (f"{self._cell_name(self._cell)} did not stop within {self._grace} s of "
                       "being interrupted: the kernel was stopped; later cells did not run")
        except DeadKernelError:
            stopped = f"the kernel died during {self._cell_name(self._cell)}; later cells did not run"
        except Exception as exc:  # a kernel that never started, a broken message: report it, grade what we have
            stopped = (f"execution stopped early in {self._cell_name(self._cell)}: {type(exc).__name__}: "
                       f"{str(exc)[:300]}")
        finally:
            if self._box is not None:
                self._box.kill()
            if previous is None:
                os.environ.pop(ENV_VAR, None)
            else:
                os.environ[ENV_VAR] = previous
        if self._box is not None:  # the cause first (a limit, a crash), then its consequence
            for event in self._box.events:
                self._note(event)
            ended = self._box.exit_description()
            if ended:
                tail = self._box.log_tail()
                self._note(ended + (f" (last message: {tail[:200]})" if tail else ""))
        if stopped:
            self._note(stopped)
        for index, cell in enumerate(self._nb.cells):  # the instructor's log says which cell raised what
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    self._note(f"{self._cell_name(index)} raised {out.get('ename')}: "
                               f"{str(out.get('evalue', ''))[:120]}", logging.INFO)
        return self._nb, resources

    def _unfinished(self) -> dict[str, str]:
        """The graded items that a limit stopped, with why: their test cell or their solution cell ran past the
        cell limit, the notebook's deadline or the sandbox's memory limit came while it ran or before it, or the
        kernel stopped after an earlier cell's timeout. Their verdict says so
        (:func:`autograder.judge.verdicts.decide`),
        never that the answer was wrong."""
        deadline = self._box is not None and self._box.deadline_hit
        memory = self._box is not None and self._box.memory_hit  # the sandbox's memory limit stopped it
        stopped = self._cell if self._stopped_early else None  # the timed-out cell whose kernel was stopped
        how = sandbox.stretch_note(self._limits.cell_timeout, self._slowdown)
        solved_slowly = {name for index in self._timed_out if index >= 0
                         for name in verdicts.solved_in(self._nb.cells[index])}
        why = {}
        for index, cell in enumerate(self._nb.cells):
            item = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if not item or item not in self._plan.items:
                continue
            if index in self._timed_out:
                why[item] = verdicts.timed_out_cell(self._cell_limit, how)
            elif item in solved_slowly:
                why[item] = verdicts.timed_out_solution(self._cell_limit, how)
            elif memory and index >= self._cell:
                why[item] = verdicts.out_of_memory(self._limits.sandbox_memory_bytes)
            elif deadline and index >= self._cell:
                why[item] = verdicts.timed_out_notebook(
                    self._limits.deadline * self._slowdown,
                    sandbox.stretch_note(self._limits.deadline, self._slowdown))
            elif stopped is not None and index > stopped:
                why[item] = verdicts.not_run_after_timeout(self._cell_name(stopped))
        return why

    def _note(self, text: str, level: int = logging.WARNING) -> None:
        note(self._lesson, self._student, text, level)

    def _cell_name(self, index: int) -> str:
        if index < 0:
            return "kernel start-up"
        cell = self._nb.cells[index]
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        return f"cell {index}" + (f" (`{grade_id}`)" if grade_id else "")


_IMPORTS_TORCH = re.compile(r"^\s*(from\s+torch\b|import\s+[^#\n]*\btorch\b)", re.MULTILINE)


# Messages nbclient stores nothing of: a status (its idle ends the cell) and the echo of the code that was sent.
_UNSTORED = frozenset({"status", "execute_input"})
_DROPPED = {
    "cell": "\n[output limit reached: the rest of this cell's output was dropped]\n",
    "message": "\n[output limit reached: a message larger than a cell's output limit, and the rest of this "
               "cell's output, were dropped]\n",
    "notebook": "\n[output limit reached: the rest of this notebook's output was dropped]\n",
}


def message_bytes(msg: dict) -> int:
    """What storing one kernel message costs: its whole content as JSON (data, text, metadata, transient, a comm's
    widget state, whatever fields the kernel added), and its binary buffers as nbclient keeps them (base64)."""
    size = len(json.dumps(msg.get("content") or {}, ensure_ascii=False, default=str))
    for buffer in msg.get("buffers") or ():
        size += 4 * -(-memoryview(buffer).nbytes // 3)
    return size


def message_charge(msg: dict, displays: dict) -> int:
    """What one message costs the output budget: its size once per output it writes. A message with a display
    id rewrites every output with that id (``displays`` is nbclient's ``_display_id_map``: display id -> cell ->
    output indices), then a ``display_data`` or ``execute_result`` adds one more."""
    kind = msg["msg_type"]
    content = msg.get("content") or {}
    transient = content.get("transient")
    display_id = transient.get("display_id") if isinstance(transient, dict) else None
    copies = kind != "update_display_data"
    if display_id and kind in ("execute_result", "display_data", "update_display_data"):
        try:
            copies += sum(len(outputs) for outputs in displays.get(display_id, {}).values())
        except TypeError:  # an unhashable id names no display
            pass
    return message_bytes(msg) * copies


class OutputBudget:
    """What the kernel's messages may still store: ``cell_bytes`` per cell and ``notebook_bytes`` per notebook.

    Charges are taken before anything is stored; once a message is over a limit, that cell (the cell limit) or
    the notebook (the notebook limit) stores nothing more, so output never has holes. A dropped message costs
    the notebook nothing: a flooding cell leaves the later cells their budget."""

    def __init__(self, cell_bytes: int, notebook_bytes: int):
        self.cell_bytes, self.notebook_bytes = cell_bytes, notebook_bytes
        self.spent: dict[int, int] = {}  # cell index -> bytes stored
        self.closed: dict[int, str] = {}  # cell index -> the limit that closed it
        self.full = False

    @property
    def total(self) -> int:
        return sum(self.spent.values())

    def charge(self, cell: int, size: int) -> str:
        """Charge ``size`` bytes to ``cell``: '' when they fit, else the limit they pass ('cell', 'notebook',
        or 'message' for a cell closed by :meth:`close`), and nothing is charged."""
        if self.refused(cell):
            return self.refused(cell)
        spent = self.spent.get(cell, 0)
        if spent + size > self.cell_bytes:
            self.closed[cell] = "cell"
            return "cell"
        if self.total + size > self.notebook_bytes:
            self.full = True
            return "notebook"
        self.spent[cell] = spent + size
        return ""

    def refused(self, cell: int) -> str:
        """The limit that already closed ``cell`` (see :meth:`charge`), or ''."""
        return "notebook" if self.full else self.closed.get(cell, "")

    def close(self, cell: int, why: str = "message") -> None:
        """Store nothing more of ``cell``: it sent something that could not be counted (a message over the cap)."""
        self.closed.setdefault(cell, why)


class StripHiddenTests(NbGraderPreprocessor):
    """Feedback shows the visible checks and the verdicts, never the hidden part of a test cell."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and HIDDEN_BEGIN in cell.source:
            cell.source = strip_hidden(cell.source)
        return cell, resources


__all__ = ["NOTES", "TIMED_OUT", "OutputBudget", "RestoreGradingMetadata", "StripHiddenTests", "TrustedExecute",
           "message_bytes", "message_charge", "note", "strip_hidden"]


class SafeCsvExport(CsvExportPlugin):
    """``nbgrader export`` as nbgrader's CSV plugin writes it (its columns and rows, every student of every
    assignment, zero for none submitted), through the course's one CSV writer (:func:`decoder_course.text.csv_writer`):
    nbgrader's own joins the cells with commas unquoted and unescaped, so a student id, name or email (a name an
    instructor copied from the LMS) could start a formula or a column of its own. ``duedate`` is the student's own
    (the lesson's, with the term's extension for that student, as the gradebook stores it on the submission)."""

    COLUMNS = ("assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email", "raw_score",
               "late_submission_penalty", "score", "max_score")

    def export(self, gradebook: Gradebook) -> None:
        dest = self.to or "grades.csv"
        students, assignments = {str(s) for s in self.student}, {str(a) for a in self.assignment}
        self.log.info("Exporting grades to %s", dest)
        with open(dest, "w", newline="") as handle:
            writer = csv_writer(handle)
            writer.writerow(self.COLUMNS)
            for assignment in gradebook.assignments:
                if assignments and assignment.name not in assignments:
                    continue
                for student in gradebook.students:
                    if students and student.id not in students:
                        continue
                    try:
                        submission = gradebook.find_submission(assignment.name, student.id)
                    except MissingEntry:  # nothing submitted: zero by the lesson's own due date, as nbgrader's
                        due, timestamp, raw, penalty, score = assignment.duedate, None, 0.0, 0.0, 0.0
                    else:
                        due, timestamp = submission.duedate, submission.timestamp  # the extension included
                        raw, penalty = float(submission.score), float(submission.late_submission_penalty or 0.0)
                        score = max(0.0, raw - penalty)
                    row = (assignment.name, due, timestamp, student.id, student.last_name,
                           student.first_name, student.email, raw, penalty, score, assignment.max_score)
                    writer.writerow(["" if cell is None else cell if isinstance(cell, (int, float)) else str(cell)
                                     for cell in row])
