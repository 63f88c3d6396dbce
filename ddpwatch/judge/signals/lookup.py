"""Looking a pid up in a snapshot: its process, its own heartbeat record, its
sockets, its stack dumps. Shared by every signal family. Pure."""
from __future__ import annotations

from dataclasses import dataclass

from ...heartbeat import Record
from ...heartbeat.liveness import wrote
from ...observe.snapshot import Snapshot


@dataclass(frozen=True)
class Window:
    first: Snapshot
    last: Snapshot

    @property
    def seconds(self) -> float:
        return max(self.last.taken_at - self.first.taken_at, 0.0)


def proc_of(snap: Snapshot, pid: int):
    if snap.processes is None:
        return None
    return snap.processes.by_pid.get(pid)


def record_of(snap: Snapshot, pid: int) -> Record | None:
    """The record `pid` wrote: records outlive their writers, and a pid can come
    back as a new process (a rank of a later job) next to its old record."""
    if snap.heartbeats is None:
        return None
    found = [r for r in snap.heartbeats.by_pid.get(pid, ()) if owns(snap, r)]
    return max(found, key=lambda r: r.started_at, default=None)


def owns(snap: Snapshot, record: Record) -> bool:
    """False when the process now holding the record's pid started after the record
    was created (pid reuse); True when it wrote it or is gone."""
    proc = proc_of(snap, record.pid)
    if proc is None:
        return True
    if proc.uid >= 0 and record.uid != proc.uid:
        return False  # another user's file claiming this pid: not the rank's
    procs = snap.processes
    if procs.uptime_s < 0:
        return wrote(record, proc.start_time_s)
    suspended = max(procs.uptime_s - procs.taken_at, 0.0)  # boot clock ahead of monotonic
    boot_wall = snap.wall_time - (snap.taken_at - procs.taken_at) - procs.uptime_s
    return wrote(record, proc.start_time_s, suspended, boot_wall)


def stacks_of(snaps: tuple[Snapshot, ...], pid: int) -> list:
    """Every dump of `pid` in the history, oldest first: those taken inside a
    snapshot's window (window_stacks), then the snapshot's own. A reading kept
    for later looks (observe/sampler.py still_current) is one sample however many
    snapshots carry it: counted once, by when it was taken."""
    found, seen = [], set()
    for snap in snaps:
        for stacks in (*snap.window_stacks, snap.stacks):
            if stacks is not None and stacks.taken_at not in seen:
                seen.add(stacks.taken_at)
                found += stacks.by_pid.get(pid, ())
    return found


def socket_entry(snap: Snapshot, pid: int):
    """The sockets probe's PidSockets of `pid` (its namespace, error, interfaces)."""
    if snap.sockets is None:
        return None
    return snap.sockets.by_pid.get(pid)


def sockets_of(snap: Snapshot, pid: int):
    entry = socket_entry(snap, pid)
    return entry.sockets if entry else ()
