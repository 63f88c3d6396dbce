"""A writer opening its record removes old records of gone writers beside it.

A record outlives its rank on purpose: that is how a killed rank is noticed,
and incident bundles copy it. Nothing else removes it, though, and /dev/shm is
memory: a directory that has seen a thousand runs holds thousands of records,
which every reader lists every tick. So each new writer deletes, in its own
directory, the records whose writer is gone and which were last written more
than `$DDPWATCH_RECORD_TTL_S` ago (default a day; 0 keeps every record). A
rank that still runs keeps its record however long it has been quiet (a rank
hung for a day is evidence). Best effort: a record that cannot be read or
removed is left alone; nothing here may fail the writer.
"""
from __future__ import annotations

import os
import time

from .liveness import record_alive
from .reader import list_records, read_file

ENV_TTL = "DDPWATCH_RECORD_TTL_S"
DEFAULT_TTL_S = 86400.0


def ttl_from_env() -> float:
    try:
        return float(os.environ.get(ENV_TTL, DEFAULT_TTL_S))
    except ValueError:
        return DEFAULT_TTL_S


def prune(directory: str, ttl_s: float, keep: str = "", procfs: str = "/proc",
          clock=time.monotonic) -> list[str]:
    """Remove stale records of gone writers from `directory` (never `keep`);
    returns the paths removed."""
    if ttl_s <= 0:
        return []
    removed, now = [], clock()
    for path in list_records(directory):
        if path == keep:
            continue
        record = read_file(path)
        if not hasattr(record, "updated_at"):  # Skipped: not ours to judge
            continue
        # Times are CLOCK_MONOTONIC: a record from before a reboot cannot be aged,
        # but /dev/shm does not survive one.
        if now - record.updated_at < ttl_s or record_alive(record, procfs):
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed
