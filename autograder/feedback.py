"""Compatibility name: nbgrader configs written before the rooms name the feedback's classes by this path
(``c.GenerateFeedback.exporter_class = "autograder.feedback.FeedbackExporter"``, ``autograder.feedback.SafeFeedback``).
The preprocessors live in :mod:`autograder.pages.feedback`, the exporters in :mod:`autograder.pages.exporters`;
name those paths in new configs."""

from autograder.pages.exporters import BoundedExporter, FeedbackExporter, FormgradeExporter
from autograder.pages.feedback import SafeFeedback, SafeFormgrade

__all__ = ["BoundedExporter", "FeedbackExporter", "FormgradeExporter", "SafeFeedback", "SafeFormgrade"]
