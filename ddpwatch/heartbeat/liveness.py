"""Whether a record's writer is still the process that wrote it.

A record outlives its process (that is how a killed rank is noticed), and pids
are reused, so "alive" means: a process with that pid exists *and* it started
no later than the record was created. Shared by the daemon's heartbeat probe
and the writer's pruning of old records (retention.py).
"""
from __future__ import annotations

import os

from .layout import Record

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def record_alive(record: Record, procfs: str = "/proc") -> bool:
    try:
        with open(f"{procfs}/{record.pid}/stat") as f:
            text = f.read()
        # The command name may hold spaces and ')': fields follow the last ')'.
        started = int(text[text.rindex(")") + 2:].split()[19]) / _CLK_TCK
    except (OSError, IndexError, ValueError):
        return False
    # Process start is in clock ticks (10 ms); allow slack for rounding.
    return started <= record.started_at + 1.0
