"""The sandbox room of the grader (docs/ARCHITECTURE.md, the map)."""
