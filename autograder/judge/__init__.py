"""One notebook's verdicts: nbgrader's preprocessors that run the kernel in its sandbox and put the trusted verdicts
into nbgrader's pipeline (``preprocessors``), the verdicts made outside the kernel (``verdicts``) and the static
policy's warnings (``policy``).

May import: ``sandbox``, ``course``, ``term``, ``intake`` and ``decoder_course``.
"""
