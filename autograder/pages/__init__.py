"""The pages room of the grader (docs/ARCHITECTURE.md, the map)."""
