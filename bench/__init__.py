"""Benchmarks of the course (not tests): run them with ``python -m bench`` or ``./course bench``."""
