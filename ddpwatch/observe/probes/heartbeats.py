"""Heartbeat probe: the records ranks write about themselves, plus whether each
record's process is still the one that wrote it (heartbeat/liveness.py).

READ: `read` (one look, as `ddpwatch ranks` takes), `HeartbeatsProbe` (the
daemon's and diagnose's, every pass, keeping what a pass needs not read again).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import cached_property
from typing import AbstractSet

from ...heartbeat import Record, Skipped, read_file
from ...heartbeat.reader import BUSY_PATIENCE_S
from ...heartbeat.scan import ScanState, identity, scan
from ...heartbeat.liveness import record_alive
from ...heartbeat.paths import record_dirs
from . import Pass, Probe, ProbeContext, register
from .process import CLK_TCK

# One budget per run for waiting out busy writers, over all files (reader.py)
BUSY_BUDGET_S = 0.05


@dataclass(frozen=True)
class HeartbeatObs:
    records: tuple[Record, ...]
    alive: tuple[bool, ...]          # per record, same order
    skipped: tuple[Skipped, ...]

    @cached_property
    def by_pid(self) -> dict[int, tuple[Record, ...]]:
        """pid -> the records naming it, in order (judge/signals/lookup.py record_of)."""
        found: dict[int, list[Record]] = {}
        for r in self.records:
            found.setdefault(r.pid, []).append(r)
        return {pid: tuple(rs) for pid, rs in found.items()}


# First in a pass: discovery finds jobs by the live records' pids
# the heartbeat records the ranks write (ddpwatch.instrument)
@register("heartbeats", scope="node", stage="records", switchable=False)
class HeartbeatsProbe(Probe):
    """Keeps, between passes, what need not be read again: the records of gone
    writers (`dead`: path -> (file identity, Record, final); such a record no
    longer changes, and finished runs' records pile up in the directory) and the
    directories' listings and refused files (heartbeat/scan.py ScanState),
    and each live record as last read (`earlier`: path -> Record; a new read
    keeps the collectives of its ring already decoded: layout.decode).
    `keep_dead` False: every record is read every pass."""

    def __init__(self, keep_dead: bool = True):
        self.dead: dict | None = {} if keep_dead else None
        self.earlier: dict | None = {} if keep_dead else None
        self.scan_state = ScanState()

    def run(self, ctx: ProbeContext, seen: Pass, pids: tuple[int, ...]) -> HeartbeatObs:
        # processes that run now: the table's own keys, not a set of them made
        # each pass (every process of the node)
        live = seen.table.keys() if seen.table else None
        return read(ctx, seen.record_dirs, live, self.dead, self.scan_state, self.earlier,
                    seen.table)


def read(ctx: ProbeContext, named: tuple[str, ...] = (), live: AbstractSet[int] | None = None,
         dead: dict | None = None, scan_state: ScanState | None = None,
         earlier: dict | None = None, table=None) -> HeartbeatObs:
    """Every record in ctx.heartbeat_dir and the directories the ranks `named`,
    within heartbeat/scan.py's caps: a bad or hostile file is a Skipped, never
    the probe's failure. `live`: the pids running now (their records are looked
    at first); `dead`, `scan_state` and `earlier`: HeartbeatsProbe's; `table`:
    the pass's process table (proctable.py), whose Python processes were read
    this pass: a record of one of them is judged alive from it, not by reading
    /proc again."""
    records, alive, skipped = [], [], []
    dirs = record_dirs(ctx.heartbeat_dir, named)
    cached_dead, identities = {}, {}
    # one budget for waiting out busy writers, over all files of this run: a
    # legitimate writer is busy for microseconds, a hostile one forever
    deadline = time.monotonic() + BUSY_BUDGET_S

    def reader(path):
        # the scan's stat of the file, just taken (scan_state given), else one here
        ident = (None if dead is None else identities[path] if path in identities
                 else _file_identity(path))
        identities[path] = ident
        cached = dead.get(path) if dead is not None else None
        if cached is not None and cached[2] and ident is not None and cached[0] == ident:
            cached_dead[path] = True
            return cached[1]
        return read_file(path, None, max(0.0, min(BUSY_PATIENCE_S, deadline - time.monotonic())),
                         earlier.get(path) if earlier is not None else None)

    paths = []
    for path, result in scan(dirs, scan_state, live, reader, identities=identities):
        if isinstance(result, Skipped):
            skipped.append(result)
            continue
        paths.append(path)
        if cached_dead.get(path):
            records.append(result)
            alive.append(False)  # a gone writer stays gone (pids are checked by start time)
            continue
        is_alive = record_alive(result, ctx.procfs, _known(table, result.pid))
        records.append(result)
        alive.append(is_alive)
        if dead is not None:
            ident = identities.get(path)
            if is_alive or ident is None:
                dead.pop(path, None)
            else:
                # Reused only once read with its writer already gone a tick
                # before: a read that raced the writer's last publish (EXITED,
                # at exit) is not final, and mmap stores leave mtime alone.
                dead[path] = (ident, result, path in dead)
    if dead is not None:
        for path in set(dead) - set(paths):  # files removed since
            del dead[path]
    if earlier is not None:  # this pass's, no more: what the scan's caps let through
        earlier.clear()
        earlier.update((path, rec) for path, rec in zip(paths, records))
    return HeartbeatObs(tuple(records), tuple(alive), tuple(skipped))


def _known(table, pid: int) -> tuple[float, int] | None:
    """(start seconds after boot, owner) of `pid` from the pass's table when it
    read the process this pass: TableReader reads every Python process again at
    each pass (proctable.py), the others maybe long ago."""
    info = table.get(pid) if table else None
    if info is None or not info.python or info.start < 0 or info.uid < 0:
        return None
    return info.start / CLK_TCK, info.uid


def _file_identity(path: str) -> tuple | None:
    """What changes when a record file is rewritten or replaced: the scan's
    identity of it (heartbeat/scan.py), whose stat the probe mostly takes."""
    try:
        return identity(os.stat(path, follow_symlinks=False))
    except OSError:
        return None
