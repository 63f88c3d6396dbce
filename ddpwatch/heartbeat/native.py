"""Which parts of the heartbeat channel run in C: ddpwatch/heartbeat/_hotpath.c, where it
was built for this record layout, else the pure-Python reference everywhere
(also on request: DDPWATCH_PURE_PYTHON=1). Asked at each use, not once at
import, so tests and benchmarks can switch between the two in one process."""
from __future__ import annotations

import os

from . import layout


def pure_python_forced() -> bool:
    """DDPWATCH_PURE_PYTHON=1: the Python reference even where the C module was built."""
    return os.environ.get("DDPWATCH_PURE_PYTHON", "") not in ("", "0")


def hotpath():
    """The C module, or None where it was not built, not wanted, or built for
    another layout (a stale build must never write or read a record wrongly).
    An older build may lack a newer function: callers use getattr with None."""
    if pure_python_forced():
        return None
    try:
        from . import _hotpath
    except ImportError:
        return None
    fields = tuple((name, code) for name, code in layout.PROGRESS_FIELDS)
    if (_hotpath.LAYOUT_VERSION, _hotpath.FIELDS, _hotpath.RING_SLOT_SIZE) != (
            layout.LAYOUT_VERSION, fields, layout.RING_SLOT.size):
        return None
    return _hotpath
