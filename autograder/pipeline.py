"""Compatibility name: the repository's ``nbgrader_config.py`` once imported ``tools_config`` from here, and an
instructor's own config may still do so. The code lives in :mod:`autograder.grading.pipeline` (one notebook through
nbgrader) and :mod:`autograder.grading.grade_class` (a class); import from there in new code."""

from autograder.grading.grade_class import grade
from autograder.grading.pipeline import StagedGenerateAssignment, nbgrader_config, tools_config

__all__ = ["StagedGenerateAssignment", "grade", "nbgrader_config", "tools_config"]
