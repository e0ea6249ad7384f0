"""Shared test setup: the repository root on sys.path, a headless matplotlib, one torch thread per process."""

import os
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# One clock reading for the whole run: read here in the controlling process, which xdist's workers inherit through
# the environment, so that every worker builds the same term dates (and the same test ids, were a date in one).
# Tests import it (from tests.conftest import NOW) instead of reading the clock at import.
NOW_ENV = "DECODER_COURSE_TEST_NOW"
os.environ.setdefault(NOW_ENV, datetime.now(UTC).replace(microsecond=0).isoformat())
NOW = datetime.fromisoformat(os.environ[NOW_ENV])
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("OMP_NUM_THREADS", "1")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # the NumPy-only tests still run
    pass
