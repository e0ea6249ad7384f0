"""The term: the term file and its dates (``schedule``), late penalties through nbgrader's own machinery (``late``),
what a release made during a term may hold (``integrity``), and the student edition (``edition``).

May import: ``sandbox``, ``course`` and ``decoder_course``.
"""
