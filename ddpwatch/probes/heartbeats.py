"""Heartbeat probe: the records ranks write about themselves, plus whether each
record's process is still the one that wrote it.

A record outlives its process (that is how a killed rank is noticed), and pids
are reused, so "alive" means: a process with that pid exists *and* it started
no later than the record was created.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..heartbeat import Record, Skipped, read_dir
from . import ProbeContext, register
from .process import parse_stat

@dataclass(frozen=True)
class HeartbeatObs:
    records: tuple[Record, ...]
    alive: tuple[bool, ...]          # per record, same order
    skipped: tuple[Skipped, ...]


def record_alive(record: Record, procfs: str = "/proc") -> bool:
    try:
        with open(f"{procfs}/{record.pid}/stat") as f:
            started = parse_stat(f.read()).start_time_s
    except (OSError, IndexError, ValueError):
        return False
    # Process start is in clock ticks (10 ms); allow slack for rounding.
    return started <= record.started_at + 1.0


@register("heartbeats", help="heartbeat records the ranks write (ddpwatch.instrument)")
def run(ctx: ProbeContext, pids: tuple[int, ...]) -> HeartbeatObs:
    records, skipped = read_dir(ctx.heartbeat_dir)
    return HeartbeatObs(tuple(records), tuple(record_alive(r, ctx.procfs) for r in records),
                        tuple(skipped))
