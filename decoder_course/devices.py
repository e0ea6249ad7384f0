"""Where the lessons' tensors live: ``device()`` picks CUDA, else Apple's MPS, else the CPU.

Lessons 06–10 put their models and data on ``device()``; the environment variable ``DECODER_COURSE_DEVICE``
(``cpu``, ``cuda``, ``cuda:1``, ``mps``) overrides the choice, e.g. to compare a GPU runtime with its CPU. Nothing
in the course needs a GPU: every lesson runs on the CPU, and the course's tests run that path.

GPUs run asynchronously: a kernel launch returns before the work is done. :func:`synchronize` waits for it, and
:func:`timer` does so before reading the clock, so a measured time is the work's, not the launch's.

torch is imported only when one of these functions is called: lessons 00–02 run without it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["ENV", "device", "synchronize", "timer"]

ENV = "DECODER_COURSE_DEVICE"


def device() -> torch.device:
    """The device for this session's tensors: ``$DECODER_COURSE_DEVICE`` if set, else cuda, else mps, else cpu."""
    import torch

    chosen = os.environ.get(ENV, "").strip()
    if chosen:
        return torch.device(chosen)
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def synchronize(where: Any = None) -> None:
    """Wait until the work queued on ``where`` (a device, a device name, or None: :func:`device`) is done.

    A no-op on the CPU, which runs each operation before returning.
    """
    import torch

    where = torch.device(where) if where is not None else device()
    if where.type == "cuda":
        torch.cuda.synchronize(where)
    elif where.type == "mps":
        torch.mps.synchronize()


def timer(where: Any = None) -> Callable[[], float]:
    """A clock for ``where``: each call synchronises the device, then returns ``time.perf_counter()``.

    ``clock = timer(device); start = clock(); ...; seconds = clock() - start`` times the work, not its launch.
    """

    def clock() -> float:
        synchronize(where)
        return time.perf_counter()

    return clock

