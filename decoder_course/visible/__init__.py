"""Visible checks, one module per lesson: what a student runs under each exercise, anywhere (no nbgrader).

They check shapes, dtypes, a worked example and properties that need no reference (causal leakage by perturbation,
rows that sum to one, no NaN), and their messages say which idea broke. The hidden checks that grade an exercise
live with the instructor, not here.
"""
