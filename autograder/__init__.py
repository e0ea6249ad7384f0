"""The instructor's grader: everything of the course that students never get (docs/ARCHITECTURE.md, the map).

It is built in rooms, one sub-package per concern, and imports run one way: a room may import the rooms listed
before it in :data:`ROOMS` (and ``decoder_course``, the public package), never one after it.
``tests/test_architecture.py`` reads every import (function-local ones too) and fails on one that runs upward, and
on any import circle.

``python -m autograder`` (``__main__``) sits above every room. The modules :data:`COMPATIBILITY_NAMES` are old
dotted names that instructors' nbgrader configs may still name (``autograder.pipeline.tools_config``,
``autograder.nbgrader_plugins.TrustedExecute``, ...): each only re-exports from its room, and no room imports one.
"""

# Bottom first: each room may import the ones before it.
ROOMS = (
    "sandbox",  # where a student's kernel runs: bubblewrap, tmpfs caps, syscall profile, control groups, relay
    "course",  # the course's content: references, hidden checks, mistakes, the lesson registry, notebook builder
    "term",  # the term: due dates, late penalties, what a release may hold, the student edition
    "intake",  # what students hand in: submissions and LMS exports, nbgrader's exchange on a hub
    "judge",  # one notebook's verdicts: nbgrader's preprocessors, the trusted verdicts, the static policy
    "pages",  # what people read: feedback, formgrader's views, the class report
    "grading",  # a class's run: the nbgrader pipeline, a pool of processes, a Dask cluster, who may read the tree
)

# Top-level modules kept only so that configs written before the rooms still load; each re-exports its room's names.
COMPATIBILITY_NAMES = ("pipeline", "nbgrader_plugins", "feedback", "exchange")
