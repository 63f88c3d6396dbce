"""Whether a record's writer is still the process that wrote it.

A record outlives its process (that is how a killed rank is noticed), and pids
are reused, so "alive" means: a process with that pid exists *and* it started
no later than the record was created, *and* it belongs to the record's user.
Shared by the daemon's heartbeat probe and the writer's pruning of old records
(retention.py).

The owner check is what keeps a forged record from naming someone else's
process (a user's `rank1-pid<N>.hb` naming root's `sleep` made it a
rank, and py-spy attached to it every 5 s). The reader has already checked that
the record's uid is its file's owner; here the process must be that uid's too.
"""
from __future__ import annotations

import os
import time

from .layout import Record

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def record_alive(record: Record, procfs: str = "/proc",
                 known: tuple[float, int] | None = None) -> bool:
    """`known`: the (start, in seconds after boot; owner uid) of the process now
    holding the record's pid, read this very pass by the caller (the daemon's
    process table); else /proc/PID/stat is read here."""
    if known is not None:
        started, owner = known
    else:
        try:
            with open(f"{procfs}/{record.pid}/stat") as f:
                text = f.read()
                owner = os.fstat(f.fileno()).st_uid  # /proc/PID/* belong to the process's uid
            # The command name may hold spaces and ')': fields follow the last ')'.
            started = int(text[text.rindex(")") + 2:].split()[19]) / _CLK_TCK
        except (OSError, IndexError, ValueError):
            return False
    if owner != record.uid:
        return False  # not this user's process, whatever the record says
    return wrote(record, started, suspended_s(), time.time() - time.clock_gettime(
        time.CLOCK_BOOTTIME))


def suspended_s() -> float:
    """How far the boot clock (/proc start times, uptime) has run ahead of the
    monotonic one (records' times): the time the machine spent suspended."""
    return max(time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic(), 0.0)


# Wall-clock slack for telling a record of an earlier boot: NTP may step the clock.
BOOT_SLACK_S = 5.0


def wrote(record: Record, process_start_s: float, suspended: float = 0.0,
          boot_wall: float | None = None) -> bool:
    """Whether the process that started `process_start_s` after boot (as
    /proc/PID/stat says) can be the writer of `record`: it started no later than
    the record was created. A later one holds a reused pid. `boot_wall`, the
    wall time of this boot: a record made before it (a directory that outlives
    reboots) is no running process's, whatever its monotonic times say."""
    if boot_wall is not None and record.started_wall < boot_wall - BOOT_SLACK_S:
        return False
    if process_start_s < 0:
        return True  # start unknown (an old snapshot): nothing to tell them apart by
    # Process start is in clock ticks (10 ms); allow slack for rounding. Suspended
    # time since boot is taken off whole, which errs toward "the writer".
    return process_start_s - suspended <= record.started_at + 1.0
