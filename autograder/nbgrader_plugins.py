"""Compatibility name: nbgrader configs written before the rooms name these classes by this path
(``autograder.nbgrader_plugins.TrustedExecute``,
``c.ExportApp.plugin_class = "autograder.nbgrader_plugins.SafeCsvExport"``).
They live in :mod:`autograder.judge.preprocessors`; name that path in new configs."""

from autograder.judge.preprocessors import RestoreGradingMetadata, SafeCsvExport, StripHiddenTests, TrustedExecute

__all__ = ["RestoreGradingMetadata", "SafeCsvExport", "StripHiddenTests", "TrustedExecute"]
