"""nbgrader preprocessors that put the trusted verdicts into nbgrader's own pipeline.

``TrustedExecute`` replaces nbgrader's ``Execute`` in ``Autograde.autograde_preprocessors`` (see
``autograder/nbgrader_config.py``): it writes the hidden cases, runs the notebook (a crashed or killed kernel ends
the run, not the grading), judges outside the kernel, and writes each verdict into its graded cell, where
``SaveAutoGrades`` reads it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from nbformat import NotebookNode
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Unicode

from autograder import verdicts
from decoder_course.harvest import ENV_VAR

HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


class TrustedExecute(Execute):
    """Execute the submission, then replace in-kernel test outcomes by verdicts made here."""

    secret_file = Unicode(
        "", help="File holding the course's grading secret (the seed of hidden cases); made on first use."
    ).tag(config=True)

    def _secret(self) -> bytes:
        path = Path(self.secret_file or os.environ.get("DECODER_COURSE_SECRET_FILE", ".grading/secret"))
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(32))
            path.chmod(0o600)
        return path.read_bytes()

    def preprocess(self, nb: NotebookNode, resources: dict):
        info = resources["nbgrader"]
        lesson, student = info["assignment"], info["student"]
        scratch = Path(tempfile.mkdtemp(prefix=f"harvest-{student}-"))
        plan = verdicts.prepare(nb, lesson, student, self._secret(), scratch)
        previous = os.environ.get(ENV_VAR)
        os.environ[ENV_VAR] = str(scratch)
        try:
            nb, resources = super().preprocess(nb, resources)
        except Exception as exc:  # dead kernel, timeout: what ran before still counts, the rest scores 0
            self.log.warning("Execution of %s for %s stopped early: %s", lesson, student, exc)
        finally:
            if previous is None:
                os.environ.pop(ENV_VAR, None)
            else:
                os.environ[ENV_VAR] = previous
        decided = verdicts.decide(plan)
        verdicts.apply(nb, decided)
        for item, verdict in decided.items():
            self.log.info("%s/%s/%s: %s", lesson, student, item, "passed" if verdict.passed else "failed")
        shutil.rmtree(scratch, ignore_errors=True)
        return nb, resources


class StripHiddenTests(NbGraderPreprocessor):
    """Feedback shows the visible checks and the verdicts, never the hidden part of a test cell."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and HIDDEN_BEGIN in cell.source:
            kept, hidden = [], False
            for line in cell.source.splitlines():
                if HIDDEN_BEGIN in line:
                    hidden = True
                elif HIDDEN_END in line:
                    hidden = False
                elif not hidden:
                    kept.append(line)
            cell.source = "\n".join(kept).rstrip()
        return cell, resources
