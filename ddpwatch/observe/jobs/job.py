"""Job: which local processes make up one job under watch, as discovery
(discovery.py, tcp_discovery.py) found it and departures.py held it. Frozen;
every Snapshot carries the Job it was taken of (observe/snapshot.py)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Job:
    """Which local processes make up the job under watch (see discovery.py)."""
    target_pid: int
    launcher_pid: int              # torchrun agent or spawn parent; -1 if none
    launcher_kind: str             # see discovery.KINDS
    rank_pids: tuple[int, ...]     # live processes judged as ranks
    run_id: str
    # the rank of each of rank_pids (same order) by the launcher's convention
    # (environment, spawn index, NODE_RANK x local world + LOCAL_RANK); -1: unknown
    ranks: tuple[int, ...] = ()
    world_size: int = -1           # as the launch says it; -1: unknown
    # ranks of this job whose processes ended while it was watched (the exits
    # probe saw them go), with their ranks (same order): judged as dead ranks
    departed_pids: tuple[int, ...] = ()
    departed_ranks: tuple[int, ...] = ()

    @cached_property
    def rank_set(self) -> frozenset[int]:
        """rank_pids as a set: each rank asks whether a connection's far end is
        another rank's (judge/signals/sockets.py), 256 ranks of 255 pairs each."""
        return frozenset(self.rank_pids)
