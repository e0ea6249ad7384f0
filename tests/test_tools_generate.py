"""nbgrader's own Generate (formgrader's button, ``nbgrader generate_assignment``) stages like ``./course release``."""

import os
import subprocess
import sys
from pathlib import Path

from nbgrader.converters import GenerateAssignment

from autograder.grading import pipeline

ROOT = Path(__file__).resolve().parent.parent
LESSON = "01-masks"


def test_nbgraders_cli_generate_rebuilds_the_same_release_through_a_staging_folder(tmp_path):
    released = ROOT / "lessons" / LESSON / f"{LESSON}.ipynb"
    before = released.read_bytes()
    env = {**os.environ, "DECODER_COURSE_WORK": str(tmp_path / "work"), "OMP_NUM_THREADS": "1"}
    nbgrader = [str(Path(sys.executable).parent / "nbgrader")]
    done = subprocess.run([*nbgrader, "generate_assignment", LESSON, "--force"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert released.read_bytes() == before  # the committed release, regenerated identically
    assert not list(ROOT.glob(".generate-*")), "a staging folder was left behind"


def test_a_failed_generate_leaves_the_release_as_it_was(tmp_path, monkeypatch):
    release = tmp_path / "release"
    (release / LESSON).mkdir(parents=True)
    kept = release / LESSON / "what students have.ipynb"
    kept.write_text("{}")
    pipeline._stage_generate_assignment()  # what nbgrader_config.py does for nbgrader's tools

    def broken(self, notebook_filename):
        raise RuntimeError("a preprocessor failed halfway")

    monkeypatch.setattr(GenerateAssignment, "convert_single_notebook", broken)
    grader = pipeline.api(tmp_path / "work", release_dir=release)
    from nbgrader.apps import api as nbgrader_api

    assert nbgrader_api.GenerateAssignment is pipeline.StagedGenerateAssignment
    result = grader.generate_assignment(LESSON, force=True, create=True)
    assert not result["success"]
    assert kept.read_text() == "{}" and sorted(p.name for p in (release / LESSON).iterdir()) == [kept.name]
    assert not list(tmp_path.glob(".generate-*"))
    monkeypatch.undo()
    result = grader.generate_assignment(LESSON, force=True, create=True)
    assert result["success"], result.get("log")
    assert (release / LESSON / f"{LESSON}.ipynb").read_bytes() == (
        ROOT / "lessons" / LESSON / f"{LESSON}.ipynb").read_bytes()
