"""From any pid to the whole local job: the launcher and its ranks.

A person types the pid they happen to see in `top`: a rank, the torchrun agent,
or a spawn-style parent whose child is rank 1. Judging needs all local ranks
together, so first find them. `find_job` is pure over a process table;
`read_table` is the small impure part.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .probes.process import parse_cmdline, parse_environ, torchrun_args
from .snapshot import Job


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    cmdline: tuple[str, ...]
    env: dict[str, str]


def read_table(procfs: str = "/proc", cache: dict | None = None) -> dict[int, ProcInfo]:
    """Every process's parent, command line and allow-listed environment.

    `cache` (kept by a caller that asks every second) maps (pid, start time) to
    (cmdline, env): both are fixed once a process has exec'd, so only the parent
    - which changes when a process is orphaned - is read again each time."""
    table, seen = {}, set()
    for name in os.listdir(procfs):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"{procfs}/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ppid, key = int(fields[1]), (pid, fields[19])
            if cache is not None and key in cache:
                cmdline, env = cache[key]
            else:
                cmdline, env = _read_exec(procfs, pid)
                if cache is not None and cmdline:  # not a process caught mid-exec
                    cache[key] = (cmdline, env)
        except (OSError, IndexError, ValueError):
            continue
        seen.add(key)
        table[pid] = ProcInfo(pid, ppid, cmdline, env)
    if cache is not None:
        for key in set(cache) - seen:
            del cache[key]
    return table


def _read_exec(procfs: str, pid: int) -> tuple[tuple[str, ...], dict[str, str]]:
    with open(f"{procfs}/{pid}/cmdline", "rb") as f:
        cmdline = parse_cmdline(f.read())
    env = {}
    if is_python(cmdline) or is_launcher(cmdline):
        try:
            with open(f"{procfs}/{pid}/environ", "rb") as f:
                env = parse_environ(f.read())
        except OSError:
            pass
    return cmdline, env


def is_launcher(cmdline: tuple[str, ...]) -> bool:
    """torchrun itself (not `timeout 30 torchrun ...` or a shell around it)."""
    return bool(torchrun_args(cmdline)) and (
        is_python(cmdline) or os.path.basename(cmdline[0]) == "torchrun")


def is_python(cmdline: tuple[str, ...]) -> bool:
    return bool(cmdline) and "python" in os.path.basename(cmdline[0])


def looks_like_rank(info: ProcInfo, record_pids: frozenset[int]) -> bool:
    """A process that says it is a rank: torch's env vars, or a heartbeat record."""
    if info.pid in record_pids:
        return True
    return is_python(info.cmdline) and not is_launcher(info.cmdline) and "RANK" in info.env


def _children(table: dict[int, ProcInfo], pid: int) -> list[ProcInfo]:
    return sorted((p for p in table.values() if p.ppid == pid), key=lambda p: p.pid)


def find_job(target: int, table: dict[int, ProcInfo], record_pids=frozenset()) -> Job | None:
    """The job `target` belongs to, or None if `target` is not in the table."""
    record_pids = frozenset(record_pids)
    me = table.get(target)
    if me is None:
        return None
    parent = table.get(me.ppid)
    if is_launcher(me.cmdline):
        launcher, kind = me, "torchrun"
    elif parent is not None and is_launcher(parent.cmdline):
        launcher, kind = parent, "torchrun"
    elif me.pid != 1 and any(looks_like_rank(c, record_pids) for c in _children(table, me.pid)):
        launcher, kind = me, "spawn"  # e.g. mp.spawn's parent, itself often rank 0
    elif (parent is not None and parent.pid != 1 and looks_like_rank(me, record_pids)
          and sum(looks_like_rank(c, record_pids) for c in _children(table, parent.pid)) > 1):
        launcher, kind = parent, "spawn"
    else:
        launcher, kind = None, "none"

    if launcher is None:
        ranks = [me] + _peers_by_env(me, table, record_pids)
    else:
        ranks = [c for c in _children(table, launcher.pid) if looks_like_rank(c, record_pids)
                 or kind == "torchrun"]
        if kind == "spawn" and looks_like_rank(launcher, record_pids):
            ranks.append(launcher)
    rank_pids = tuple(sorted({p.pid for p in ranks}))
    run_id = next((p.env["TORCHELASTIC_RUN_ID"] for p in ranks
                   if p.env.get("TORCHELASTIC_RUN_ID", "none") != "none"), "")
    if not run_id:
        # The same on every node of a job, so the cluster view can join nodes'
        # series (torchrun's default run id is "none").
        run_id = next((f"{p.env['MASTER_ADDR']}:{p.env['MASTER_PORT']}" for p in ranks
                       if p.env.get("MASTER_ADDR") and p.env.get("MASTER_PORT")), "")
    return Job(target_pid=target, launcher_pid=launcher.pid if launcher else -1,
               launcher_kind=kind, rank_pids=rank_pids, run_id=run_id)


def _peers_by_env(me: ProcInfo, table: dict[int, ProcInfo], record_pids) -> list[ProcInfo]:
    """Bare env-rendezvous ranks (started by hand): same MASTER_ADDR:PORT and world size."""
    key = (me.env.get("MASTER_ADDR"), me.env.get("MASTER_PORT"), me.env.get("WORLD_SIZE"))
    if None in key:
        return []
    return [p for p in table.values() if p.pid != me.pid and looks_like_rank(p, record_pids)
            and (p.env.get("MASTER_ADDR"), p.env.get("MASTER_PORT"),
                 p.env.get("WORLD_SIZE")) == key]


def all_jobs(table: dict[int, ProcInfo], record_pids=frozenset()) -> list[Job]:
    """Every job on this node: each torchrun agent's, then ranks started otherwise."""
    record_pids = frozenset(record_pids)
    jobs, seen = [], set()
    launchers = [p for p in sorted(table) if is_launcher(table[p].cmdline)]
    ranks = [p for p in sorted(table) if looks_like_rank(table[p], record_pids)]
    for pid in launchers + ranks:
        if pid in seen:
            continue
        job = find_job(pid, table, record_pids)
        if job is None:
            continue
        members = set(job.rank_pids) | {pid}
        if job.launcher_pid > 0:
            members.add(job.launcher_pid)
        seen |= members
        jobs.append(job)
    return jobs


def job_key(job: Job) -> str:
    """A stable, bounded label for a job ("none" is torchrun's default run id)."""
    if job.run_id and job.run_id != "none":
        return job.run_id
    anchor = job.launcher_pid if job.launcher_pid > 0 else min(job.rank_pids, default=job.target_pid)
    return f"pid{anchor}"
