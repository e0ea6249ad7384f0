"""The course's content: the reference modules (``reference/``, one per lesson: every exercise's code), the hidden
checks (``checks/``), the known mistakes (``mutants/``), the lesson registry (``lessons``), find-the-bug exercises
(``bugs``), the notebook builder (``notebooks``) and the demo's sample students (``samples``).

May import: ``sandbox`` (it does not need to) and ``decoder_course``. Start here for a new exercise or lesson
(CONTRIBUTING.md).
"""
