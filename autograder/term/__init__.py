"""The term room of the grader (docs/ARCHITECTURE.md, the map)."""
