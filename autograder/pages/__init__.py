"""What people read: the feedback page and formgrader's view of a submission, sanitised and bounded
(``feedback``), formgrader's and ``nbgrader export``'s views of the gradebook (``gradebook_views``), the class report
(``report``, its template in ``templates/``) and the similarity of submissions (``similarity``).

May import: every room before it (``sandbox``, ``course``, ``term``, ``intake``, ``judge``) and ``decoder_course``.
"""
