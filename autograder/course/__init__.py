"""The course room of the grader (docs/ARCHITECTURE.md, the map)."""
