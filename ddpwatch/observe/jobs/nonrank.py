"""Why a Python process of the node is in no job (`ddpwatch diagnose --all`):
pure over the process table discovery read and the jobs it found."""
from __future__ import annotations

import os

from . import discovery
from . import launchers as L
from .proctable import indexed


def explain(table, jobs, record_pids=frozenset(), only_uid: int | None = None
            ) -> list[tuple[int, int, str, str]]:
    """(pid, uid, name, why it is no rank) of each Python process or launcher
    that belongs to no job in `jobs`; `only_uid`: that user's alone (another
    user's environment is closed to a caller without CAP_SYS_PTRACE)."""
    table = indexed(table)
    members = set()
    for job in jobs:
        members |= set(job.rank_pids) | {job.launcher_pid}
    out = []
    for pid in sorted(table.candidates()):
        info = table[pid]
        if pid in members or pid == os.getpid() or (only_uid is not None
                                                      and info.uid != only_uid):
            continue
        name = os.path.basename(info.cmdline[0]) if info.cmdline else "?"
        if len(info.cmdline) > 1:
            name = f"{name} {os.path.basename(info.cmdline[1])}"
        out.append((pid, info.uid, name[:80], _why(info, table, members, record_pids)))
    return out


def _why(info, table, members, record_pids) -> str:
    parent = table.get(info.ppid)
    if parent is not None and parent.pid in members and discovery.is_worker_of(
            info, parent, record_pids):
        return f"a worker of rank pid {parent.pid} (DataLoader, multiprocessing)"
    if L.is_mp_helper(info.cmdline):
        return "a multiprocessing helper (resource tracker, forkserver)"
    if info.launcher is not None:
        return f"a {info.launcher.kind} launcher with no rank under it"
    if not info.env and info.cmdline:
        return "its environment is unreadable (another user's: needs root)"
    return ("no launcher above it, no rank variables (RANK, LOCAL_RANK, SLURM_PROCID, "
            "OMPI_COMM_WORLD_RANK) in its environment, no heartbeat record, no "
            "torch.distributed peers on the wire")
