"""nbgrader's configuration for this course: nbgrader's own tools (CLI, formgrader, exchange) on the tree and
gradebook that ``./course grade`` uses, with the course's trusted execution and sandbox.

Start formgrader (``.venv/bin/jupyter lab``) or run ``.venv/bin/nbgrader …`` from this folder. Environment:
``DECODER_COURSE_WORK`` (default ``.grading``), ``GRADEBOOK_URL`` (default SQLite in it), ``NBGRADER_EXCHANGE_ROOT``
(default: what a system-wide config says, else ``/srv/nbgrader/exchange``). See docs/INSTRUCTOR.md.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # formgrader reads this file again on every request
    sys.path.insert(0, HERE)

from autograder.grading.pipeline import tools_config  # noqa: E402

tools_config(get_config())  # noqa: F821 (traitlets defines get_config for config files)
