"""A class's run: nbgrader's configuration and one notebook through it (``pipeline``), a class graded here, in a
pool of processes (``pool``) or on a Dask cluster (``cluster``), chosen by ``grade_class``; and who else may read
the instructor's tree (``access``).

May import: every other room and ``decoder_course``; only ``autograder.__main__`` and the compatibility names
import it.
"""
