"""Wire-groups probe: ranks started by hand, for the daemon. A lone
Python process that no launcher, environment or record claims is no rank to
discovery; those that imported torch and have the shape of one DDP job on the
wire (observe/jobs/tcp_discovery.py `ddp_groups`: a TCPStore host every member is
connected to, or a full mesh) become one job, launcher kind "wire", numbered
from the evidence only (tcp_discovery.number). `diagnose` does the same for the
one pid a person names (tcp_discovery.extend).

The daemon runs this every pass over the whole node, once discovery found the
jobs it could, so what is learned is kept in a WireWatch (the probe's object
keeps it across passes):
* whether a process maps libtorch, per (pid, start time): once mapped it stays
  mapped; one not mapping it yet is looked at again after TORCH_RECHECK_S at the
  earliest (importing torch takes seconds), then twice as long after each miss
  up to TORCH_RECHECK_MAX_S, so /proc/PID/maps of every Python process is not
  read every tick, and a user's hundreds of idle Python processes cost a read
  each every few minutes, not every 10 s;
* the groups found, so that a rank whose peer died (no longer connected to
  anyone) stays its job's rank while it lives, and a rank number found once is
  kept when later evidence is missing (tcp_discovery.carry).
Only unclaimed Python processes are looked at, at most
tcp_discovery.MAX_CANDIDATES per user (the probe reports the rest as left out);
sockets are read only of those that map libtorch, each with at most
tcp_discovery.FD_LIMIT open files; a group never spans two users. Nothing read
is used as a path.

`pids`: the processes already in a job (not looked at).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..jobs import tcp_discovery
from ..jobs.launchers import env_rank, launcher_kind
from ..jobs.job import Job
from ..jobs.proctable import indexed
from . import Pass, Probe, ProbeContext, register

TORCH_RECHECK_S = 10.0
TORCH_RECHECK_MAX_S = 300.0  # a notebook that imports torch late is found within this


@dataclass(frozen=True)
class WireGroups:
    jobs: tuple[Job, ...]
    candidates: int                            # unclaimed Python processes looked at
    torch: int                                 # of which map libtorch
    left_out: tuple[tuple[int, int], ...] = ()  # (uid, processes past the bound)

    @property
    def note(self) -> str:
        """Why the probe may have missed a job ("" if it saw everything)."""
        return "; ".join(f"{n} Python process(es) of uid {uid} not looked at (more than "
                         f"{tcp_discovery.MAX_CANDIDATES} per user)" for uid, n in self.left_out)


class WireWatch:
    """What the wire-groups probe keeps between passes (see the module's doc)."""

    def __init__(self, recheck_s: float = TORCH_RECHECK_S):
        self.recheck_s = recheck_s
        # -> (mapped, read at, wait before the next read)
        self._torch: dict[tcp_discovery.Member, tuple[bool, float, float]] = {}
        self._groups: list = []  # tcp_discovery.Group values of the last pass
        self.maps_reads = 0      # /proc/PID/maps read since start (cost, for benchmarks)

    def scan(self, procfs: str, table: dict, claimed: frozenset[int], now: float) -> WireGroups:
        by_uid: dict[int, list] = {}
        table = indexed(table)
        python = [table[pid] for pid in sorted(table.candidates()) if table[pid].python]
        for info in python:
            if info.pid not in claimed and info.pid != 1 and info.uid >= 0:
                by_uid.setdefault(info.uid, []).append(info)
        live = {(info.pid, info.start) for info in python}
        self._torch = {m: v for m, v in self._torch.items() if m in live}
        found, left_out, looked, torch = [], [], 0, 0
        for uid, infos in sorted(by_uid.items()):
            # torch processes known first, then the oldest: a burst of new
            # processes does not push a running job's ranks out
            infos.sort(key=lambda p: (not self._torch.get((p.pid, p.start), (False,))[0],
                                      p.start, p.pid))
            if len(infos) > tcp_discovery.MAX_CANDIDATES:
                left_out.append((uid, len(infos) - tcp_discovery.MAX_CANDIDATES))
                infos = infos[:tcp_discovery.MAX_CANDIDATES]
            looked += len(infos)
            # (a launcher is in its job, so claimed; one whose job discovery
            # missed is still no rank; asked of torch processes only: it costs)
            mine = [p for p in infos if self._maps_torch(procfs, p, now)
                    and not launcher_kind(p.cmdline)]
            torch += len(mine)
            if len(mine) >= 2:  # one user's processes only: never another's job
                found += self._groups_of(procfs, mine, table)
        alive = {(p.pid, p.start) for infos in by_uid.values() for p in infos}
        self._groups = tcp_discovery.carry(self._groups, found, alive)
        return WireGroups(tuple(_job(group) for group in self._groups), looked, torch,
                          tuple(left_out))

    def _maps_torch(self, procfs: str, info, now: float) -> bool:
        key = (info.pid, info.start)
        mapped, at, wait = self._torch.get(key, (False, -1e18, 0.0))
        if mapped or now - at < wait:
            return mapped
        mapped = tcp_discovery.uses_torch(procfs, info.pid)
        self.maps_reads += 1
        backoff = min(max(wait * 2, self.recheck_s), max(TORCH_RECHECK_MAX_S, self.recheck_s))
        self._torch[key] = (mapped, now, backoff)
        return mapped

    @staticmethod
    def _groups_of(procfs: str, infos: list, table: dict) -> list:
        sockets = tcp_discovery.read_wire(procfs, [p.pid for p in infos],
                                          tcp_discovery.FD_LIMIT)
        out = []
        for host, members in tcp_discovery.ddp_groups(sockets):
            env_ranks = {pid: env_rank(table[pid].env)[0] for pid in members}
            whole = (tcp_discovery.closed(members, sockets)
                     or tcp_discovery.store_complete(host, set(members), sockets))
            ranks, world = tcp_discovery.number(set(members), host, whole, env_ranks)
            out.append((tuple(sorted(((pid, table[pid].start), ranks.get(pid, -1))
                                     for pid in members)), world))
        return out


def _job(group) -> Job:
    members, world = group
    ranks = dict(sorted((pid, rank) for (pid, _), rank in members))
    pids = tuple(ranks)
    return Job(target_pid=pids[0], launcher_pid=-1, launcher_kind="wire", rank_pids=pids,
               run_id="", ranks=tuple(ranks.values()), world_size=world)


# ranks started by hand: lone torch processes of one user grouped into a job by their
# TCP connections (a TCPStore or a full mesh); reads /proc/PID/maps and the sockets of
# unclaimed Python processes
@register("wire_groups", scope="node", stage="jobs")
class WireGroupsProbe(Probe):
    """Keeps its WireWatch across passes; `keep` False: a new one every pass."""

    def __init__(self, keep: bool = True):
        self.watch = WireWatch() if keep else None

    def run(self, ctx: ProbeContext, seen: Pass, pids: tuple[int, ...]) -> WireGroups:
        if seen.table is None:
            raise ValueError("needs the pass's process table")
        return (self.watch or WireWatch()).scan(ctx.procfs, seen.table, frozenset(pids),
                                                ctx.clock())
