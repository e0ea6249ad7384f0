"""`python -m decoder_course check NOTEBOOK`: a self-learner's verdict per exercise, without nbgrader."""

import json
import os
import subprocess
import sys

import nbformat
import pytest

from autograder.course import samples
from decoder_course import __main__ as cli
from tests.conftest import ROOT

LESSON = "01-masks"
EXERCISES = ["causal_mask", "padding_mask", "combine_masks", "mask_to_bias"]
pytestmark = pytest.mark.notebook


def run_check(path, *args, env=None):
    """The command as a student types it, from the repository root; returns (exit code, stdout, stderr)."""
    done = subprocess.run([sys.executable, "-m", "decoder_course", "check", str(path), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)
    return done.returncode, done.stdout, done.stderr


def with_one_wrong_answer(exercise: str, description: str) -> nbformat.NotebookNode:
    """The perfect submission with one exercise replaced by the named wrong answer of autograder.course.mutants."""
    nb = samples.perfect(LESSON)
    wrong = next(obj for item, what, replacement in samples.mutants_of(LESSON)
                 for obj in replacement.values() if item == exercise and what == description)
    cell = next(c for c in nb.cells if c.metadata.get("course", {}).get("exercise") == [exercise])
    cell.source = samples.mutant_source(wrong)
    return nb


def test_released_lesson_reports_every_exercise_as_not_implemented(tmp_path):
    path = tmp_path / f"{LESSON}.ipynb"
    nbformat.write(samples.untouched(LESSON), path)
    code, out, err = run_check(path)
    assert code == 1, out + err
    for name in EXERCISES:
        assert f"✗ {name}: not implemented yet" in out.splitlines()
    assert "0/4 exercises pass" in out and "4 not implemented yet" in out
    assert "Traceback" not in out + err and "WARNING" not in err, err


def test_solution_notebook_passes_every_exercise(tmp_path):
    path = tmp_path / f"{LESSON}.ipynb"
    nbformat.write(samples.perfect(LESSON), path)
    code, out, err = run_check(path)
    assert code == 0, out + err
    assert [line for line in out.splitlines() if line.startswith(("✓", "✗"))] == [f"✓ {n}" for n in EXERCISES]
    assert "4/4 exercises pass" in out


def test_one_wrong_answer_fails_alone_with_its_teaching_message(tmp_path):
    folder = tmp_path / "my work"  # a space in the path, as on many students' machines
    folder.mkdir()
    nb = with_one_wrong_answer("padding_mask", "assumes the pad id is 0")
    # A probe at the end: where the kernel ran, and whether a grading run's variable reached it.
    nb.cells.append(nbformat.v4.new_code_cell(
        "import json, os, pathlib\n"
        f"seen = [os.getcwd(), os.environ.get({cli.HARVEST_ENV!r})]\n"
        "pathlib.Path('probe.json').write_text(json.dumps(seen))"
    ))
    path = folder / "submission.ipynb"
    nbformat.write(nb, path)
    before = path.read_bytes()
    env = {**os.environ, cli.HARVEST_ENV: str(tmp_path / "no-such-grading-run")}
    code, out, err = run_check(path, env=env)
    assert code == 1, out + err
    lines = out.splitlines()
    for name in ("causal_mask", "combine_masks", "mask_to_bias"):
        assert f"✓ {name}" in lines
    failed = [line for line in lines if line.startswith("✗")]
    assert len(failed) == 1 and failed[0].startswith("✗ padding_mask: "), out
    # The visible check's own words: which idea broke and what to do.
    assert "pad_id" in failed[0] and "Use the pad_id argument" in failed[0], failed[0]
    assert "3/4 exercises pass" in out and "1 to fix" in out
    cwd, harvest = json.loads((folder / "probe.json").read_text())
    assert cwd == str(folder), "the kernel must run in the notebook's folder, as in JupyterLab"
    assert harvest is None, "a grading run's variable must not reach the kernel"
    assert path.read_bytes() == before, "the student's notebook must not be written"


def _cell(grade_id, outputs, *, grade=True, solution=False, count=1):
    return nbformat.from_dict({
        "cell_type": "code", "source": "", "execution_count": count, "outputs": outputs,
        "metadata": {"nbgrader": {"grade": grade, "solution": solution, "grade_id": grade_id}},
    })


def _error(ename, evalue):
    return {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": []}


def test_verdicts_read_only_the_cell_outputs():
    stdout = {"output_type": "stream", "name": "stdout", "text": "✓ shape\n✓ values\n"}
    ok = cli.verdict_of(_cell("a", [stdout]))
    assert ok.passed and ok.checks_passed == 2
    todo = cli.verdict_of(_cell("a", [_error("CheckFailed", "✗ t: `a` is not implemented yet: replace …")]))
    assert not todo.passed and todo.not_implemented and todo.message == "not implemented yet"
    wrong = cli.verdict_of(_cell("a", [stdout, _error("CheckFailed", "✗ shape: expected (2, 3), got (3, 2)")]))
    assert not wrong.passed and not wrong.not_implemented and wrong.message == "shape: expected (2, 3), got (3, 2)"
    crash = cli.verdict_of(_cell("a", [_error("ValueError", "operands could not be broadcast ")]))
    assert crash.message == "raised ValueError: operands could not be broadcast"
    missing = cli.verdict_of(_cell("a", [_error("NameError", "name 'a' is not defined")]))
    assert "run the cell that defines it" in missing.message
    hang = cli.verdict_of(_cell("a", [_error("KeyboardInterrupt", "")]), timeout=300)
    assert "hit the time limit of 300 s a cell and was stopped" in hang.message
    never = cli.verdict_of(_cell("a", [], count=None))
    assert not never.passed and "did not run" in never.message


def test_notes_name_the_students_cell_and_skip_unwritten_exercises():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        _cell("causal_mask_solution", [_error("SyntaxError", "invalid syntax")], grade=False, solution=True),
        _cell("padding_mask_solution", [], grade=False, solution=True),
        nbformat.v4.new_code_cell("plot()", outputs=[_error("NotImplementedError", "")]),
        nbformat.v4.new_code_cell("plot()", outputs=[_error("ZeroDivisionError", "division by zero\nmore")]),
        _cell("causal_mask", [_error("NameError", "name 'causal_mask' is not defined")]),
    ]
    assert cli.notes_on_other_cells(nb) == [
        "your cell for causal_mask raised SyntaxError: invalid syntax",
        "the 4th code cell raised ZeroDivisionError: division by zero",
    ]
    assert [i for i, _ in cli.graded_cells(nb)] == [4]


def test_a_stopped_cell_is_named_as_jupyterlab_shows_it_and_said_to_have_hit_the_time_limit():
    """Cells are named by the execution count JupyterLab prints beside them (markdown cells do not count), or as
    the Nth code cell when they never ran; an interrupted one hit the time limit, and the NameError below it is
    traced back to it."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# title"), nbformat.v4.new_markdown_cell("prose"),
                nbformat.v4.new_code_cell("train()", execution_count=7,
                                          outputs=[_error("KeyboardInterrupt", "")]),
                nbformat.v4.new_markdown_cell("more prose"),
                nbformat.v4.new_code_cell("plot(runs)", execution_count=None,
                                          outputs=[_error("NameError", "name 'runs' is not defined")])]
    notes = cli.notes_on_other_cells(nb, timeout=60)
    assert notes[0] == ("cell [7] hit the time limit of 60 s a cell and was stopped (an endless loop? or a slow "
                        "machine: --timeout gives more); what it had not yet defined is missing in the cells after "
                        "it (a NameError there comes from this)")
    assert notes[1] == "the 2nd code cell raised NameError: name 'runs' is not defined"
    assert all("cell 3" not in note and "cell 5" not in note for note in notes)


def test_report_summary_counts():
    verdicts = [cli.Verdict("a", True), cli.Verdict("b", False, "x"), cli.Verdict("c", False, "n", True)]
    text = cli.report(verdicts, ["a note"])
    assert text.splitlines()[:3] == ["✓ a", "✗ b: x", "✗ c: n"]
    assert "  - a note" in text
    assert "1/3 exercises pass their visible checks (1 to fix, 1 not implemented yet)" in text


def test_unusable_input_exits_2_and_help_works(tmp_path, capsys):
    bad = tmp_path / "broken.ipynb"
    bad.write_text("{ not json")
    assert cli.main(["check", str(bad)]) == 2 and "cannot run" in capsys.readouterr().err
    assert cli.main(["check", str(tmp_path / "missing.ipynb")]) == 2
    assert "is not a file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "check" in out and "without nbgrader" in out


def test_the_kernels_own_stderr_is_kept_aside_unless_the_kernel_dies(tmp_path):
    """The kernel process's stderr is machinery (ipykernel can log a traceback there while it shuts down): it must
    not reach the student's report; when the kernel dies its last lines say why, with control characters shown."""
    noisy = samples.perfect(LESSON)
    noisy.cells.append(nbformat.v4.new_code_cell(
        "import os\nos.write(2, b'Traceback (most recent call last):\\nZMQError: Socket operation on non-socket\\n')"))
    nbformat.write(noisy, tmp_path / "noisy.ipynb")
    code, out, err = run_check(tmp_path / "noisy.ipynb")
    assert code == 0, out + err
    assert "Traceback" not in out + err and "ZMQError" not in out + err, err

    dying = samples.perfect(LESSON)
    dying.cells.append(nbformat.v4.new_code_cell(
        "import os\nos.write(2, b'out of pinned memory \\x1b[31mred\\n')\nos._exit(9)"))
    nbformat.write(dying, tmp_path / "dying.ipynb")
    code, out, err = run_check(tmp_path / "dying.ipynb")
    assert "the kernel died" in out, out + err
    assert "kernel: out of pinned memory \\x1b[31mred" in out and "\x1b" not in out + err, out


# -- find-the-bug exercises: reported as a bug to find while their cell is as released ------------------------------
def _released(lesson: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)


def test_as_released_is_nbgraders_checksum_on_every_solution_cell_of_every_lesson():
    from nbgrader.utils import compute_checksum

    from autograder.course import notebooks

    solution_cells = 0
    for lesson in notebooks.lessons():
        for cell in _released(lesson).cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("solution") and not meta.get("grade"):
                solution_cells += 1
                assert compute_checksum(cell) == meta["checksum"] and cli.as_released(cell), (lesson, meta)
                for edit in (cell.source + "\n", cell.source.replace("\n", "\n    pass\n", 1), ""):
                    edited = nbformat.from_dict({**cell, "source": edit})
                    assert not cli.as_released(edited)
    assert solution_cells > 60


def test_bugs_to_find_are_the_find_the_bug_cells_left_as_released():
    nb = _released("02-attention")
    assert cli.bugs_to_find(nb) == {"fixed_attention"}
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "fixed_attention_solution")
    cell.source = cell.source.replace("return", "return ", 1)  # the student started
    assert cli.bugs_to_find(nb) == set()
    import inspect
    import textwrap

    from autograder.course import bugs, notebooks
    from autograder.course import lessons as registry

    for lesson in notebooks.lessons():  # in every lesson: exactly the exercises whose reference holds a bug block
        shown = {name for name in registry.exercises(lesson) if bugs.regions(textwrap.dedent(inspect.getsource(
            notebooks.reference_object(lesson, name)))) is not None}
        assert cli.bugs_to_find(_released(lesson)) == shown, lesson


def test_a_released_find_the_bug_cell_is_a_bug_to_find_not_a_mistake_to_fix(tmp_path):
    lesson = "02-attention"
    nb = samples.perfect(lesson)
    released = {c.metadata["nbgrader"]["grade_id"]: c for c in _released(lesson).cells
                if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in nb.cells:  # the student's answers, but the find-the-bug cell as it came
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "fixed_attention_solution":
            cell.source, cell.metadata = released["fixed_attention_solution"].source, \
                released["fixed_attention_solution"].metadata
    path = tmp_path / f"{lesson}.ipynb"
    nbformat.write(nb, path)
    code, out, err = run_check(path)
    assert code == 1, out + err
    line = next(line for line in out.splitlines() if line.startswith("✗ fixed_attention"))
    assert line.startswith("✗ fixed_attention: bug not fixed yet (find the bug: the cell above holds the given "
                           "code with one mistake; its check says: "), line
    assert "(1 bug to find); fix the first ✗" in out and "to fix," not in out, out


def test_report_counts_bugs_to_find_apart():
    verdicts = [cli.Verdict("a", False, "x"), cli.Verdict("b", False, "bug not fixed yet", bug_to_find=True),
                cli.Verdict("c", False, "n", True), cli.Verdict("d", False, "bug not fixed yet", bug_to_find=True)]
    assert "0/4 exercises pass their visible checks (1 to fix, 1 not implemented yet, 2 bugs to find)" in \
        cli.report(verdicts, [])
