"""Heartbeat probe: the records ranks write about themselves, plus whether each
record's process is still the one that wrote it.

A record outlives its process (that is how a killed rank is noticed), and pids
are reused, so "alive" means: a process with that pid exists *and* it started
no later than the record was created.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..heartbeat import Record, Skipped, read_dir
from . import ProbeContext, register

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class HeartbeatObs:
    records: tuple[Record, ...]
    alive: tuple[bool, ...]          # per record, same order
    skipped: tuple[Skipped, ...]


def parse_starttime(stat_text: str) -> float:
    """Seconds since boot at which the process started (field 22 of /proc/pid/stat)."""
    after_comm = stat_text.rsplit(")", 1)[1].split()
    return int(after_comm[19]) / CLK_TCK


def record_alive(record: Record, procfs: str = "/proc") -> bool:
    try:
        with open(f"{procfs}/{record.pid}/stat") as f:
            started = parse_starttime(f.read())
    except (OSError, IndexError, ValueError):
        return False
    # Process start is in clock ticks (10 ms); allow slack for rounding.
    return started <= record.started_at + 1.0


@register("heartbeats", help="heartbeat records the ranks write (ddpwatch.instrument)")
def run(ctx: ProbeContext, pids: tuple[int, ...]) -> HeartbeatObs:
    records, skipped = read_dir(ctx.heartbeat_dir)
    return HeartbeatObs(tuple(records), tuple(record_alive(r, ctx.procfs) for r in records),
                        tuple(skipped))
