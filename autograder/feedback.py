"""Compatibility name: nbgrader configs written before the rooms name the feedback's classes by this path
(``c.GenerateFeedback.exporter_class = "autograder.feedback.FeedbackExporter"``, ``autograder.feedback.SafeFeedback``).
They live in :mod:`autograder.pages.feedback`; name that path in new configs."""

from autograder.pages.feedback import (
    BoundedExporter,
    FeedbackExporter,
    FormgradeExporter,
    SafeFeedback,
    SafeFormgrade,
)

__all__ = ["BoundedExporter", "FeedbackExporter", "FormgradeExporter", "SafeFeedback", "SafeFormgrade"]
