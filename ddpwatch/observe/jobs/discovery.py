"""From any pid to the whole local job: the launcher and its ranks.

A person types the pid they happen to see in `top`: a rank, the torchrun agent,
or a spawn-style parent whose child is rank 1. Judging needs all local ranks
together, so first find them. `find_job` is pure over a process table;
`read_table` is the small impure part.
"""
from __future__ import annotations

import os
import re
import stat

from ... import launchers as T
from . import launchers as L
from ..probes.process import CLK_TCK
from .job import Job
# the process table discovery reads (kept here too: callers know it as discovery's)
from .proctable import (CACHE_AFTER_S, CACHE_BYTES, OTHER_ARGS, ProcInfo,  # noqa: F401
                        ProcTable, TableReader, _cost, indexed, read_table)


def is_launcher(cmdline: tuple[str, ...]) -> bool:
    """A launcher process whose children are the ranks: torchrun, `accelerate
    launch`, DeepSpeed's launcher, mpirun's daemons (launchers.launcher_kind)."""
    return bool(L.launcher_kind(cmdline))


is_python = L.is_python


MAX_NAMED_DIRS = 256     # directories looked at per tick, all users together
MAX_DIRS_PER_UID = 8     # ... and per user: one user's many cannot crowd out another's


def heartbeat_dirs(table: dict[int, ProcInfo], procfs: str = "/proc") -> tuple[str, ...]:
    """The record directories Python processes name in their DDPWATCH_DIR, each
    only if it is a directory of the naming process's own user that no one else
    may write to: a reader running as root must not take another user's word for
    where a rank's records are. At most MAX_DIRS_PER_UID per user: 64 processes
    of one user, each naming a directory of its own, once filled a global cap
    and left another user's directory unread (tests/hostile/test_hostile_second.py)."""
    named: dict[str, list[int]] = {}
    per_uid: dict[int, int] = {}
    table = indexed(table)
    for info in (table[pid] for pid in sorted(table.candidates())):  # Python ones only
        directory = info.env.get("DDPWATCH_DIR")
        if directory and info.python:
            if directory not in named:
                if len(named) >= MAX_NAMED_DIRS or per_uid.get(info.uid, 0) >= MAX_DIRS_PER_UID:
                    continue
                per_uid[info.uid] = per_uid.get(info.uid, 0) + 1
            named.setdefault(directory, []).append(info.pid)
    trusted = []
    for directory, pids in named.items():
        try:
            st = os.stat(directory)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o022 and any(
                _uid(procfs, pid) == st.st_uid for pid in pids):
            trusted.append(directory)
    return tuple(sorted(trusted))


def _uid(procfs: str, pid: int) -> int:
    try:
        return os.stat(f"{procfs}/{pid}").st_uid
    except OSError:
        return -1  # gone


def looks_like_rank(info: ProcInfo, record_pids: frozenset[int]) -> bool:
    """A process that says it is a rank: a launcher's variables (RANK, SLURM_PROCID,
    OMPI_COMM_WORLD_RANK, PMI_RANK, Lightning's LOCAL_RANK), or a heartbeat record."""
    if info.pid in record_pids:
        return True
    return info.python and info.launcher is None and L.says_rank(info.env)


def _children(table: dict[int, ProcInfo], pid: int, record_pids=frozenset()) -> list[ProcInfo]:
    """`pid`'s children, its own workers left out (`is_worker_of`), and so are
    children of another user than a non-root parent's: a user's fake launcher
    with a set-uid child would otherwise make a process of root's a rank of
    the user's job, read and dumped with the daemon's privileges and shown to
    that user (tests/hostile/test_hostile_second.py). Root may start other users'
    ranks (slurmstepd does)."""
    table = indexed(table)
    parent = table.get(pid)
    return sorted((p for p in table.children_of(pid) if not (
        parent is not None and (is_worker_of(p, parent, record_pids) or
                                _foreign(p, parent)))), key=lambda p: p.pid)


def _foreign(child: ProcInfo, parent: ProcInfo) -> bool:
    """A child running as another user than its non-root parent (a set-uid program)."""
    return parent.uid not in (0, -1) and child.uid not in (-1, parent.uid)


def is_worker_of(child: ProcInfo, parent: ProcInfo, record_pids=frozenset()) -> bool:
    """Whether `child` is a worker a rank started (a DataLoader's, a
    multiprocessing pool's), not a rank: it inherits the rank's environment, so
    it says the same rank. Three shapes:
    * forked without exec (DataLoader's default on Linux): the parent's command
      line and environment, byte for byte; a launcher's is its rank, not a worker;
    * spawned by a rank that was itself spawned (mp.spawn's rank's DataLoader);
    * any child that claims the rank its parent claims (a "spawn" context copies
      the rank's RANK, MASTER_* into the child).
    A child that writes a heartbeat record is a rank, whatever its shape.
    (tests/unit/observe/test_discovery_unit.py; a real job: tests/daemon/test_soak.py's
    DataLoader job, whose workers were taken for ranks of a second, dead job)"""
    if child.pid in record_pids or not parent.python or parent.launcher is not None:
        return False
    if child.cmdline == parent.cmdline and child.env == parent.env:
        return True
    if L.is_spawn_child(child.cmdline) and L.is_spawn_child(parent.cmdline):
        return True
    rank = L.env_rank(child.env)[0]
    return rank >= 0 and rank == L.env_rank(parent.env)[0] and \
        L.group_key(child.env) == L.group_key(parent.env)


def _a_worker(info: ProcInfo, table: dict[int, ProcInfo], record_pids=frozenset()) -> bool:
    parent = _alive_parent(table, info)
    return parent is not None and is_worker_of(info, parent, record_pids)


def _is_rank_of(entry: T.Launcher, info: ProcInfo) -> bool:
    """`entry`'s own test (ddpwatch/launchers.py) makes `info` one of its ranks:
    mp.spawn's spawn_main argv, Lightning's re-executed environment."""
    return bool(entry.rank_argv and entry.rank_argv(info.cmdline)
                or entry.rank_env and entry.rank_env(info.env))


def _recognised(table: dict[int, ProcInfo], pid: int, entry: T.Launcher) -> list[ProcInfo]:
    """`pid`'s Python children that `entry`'s test makes its ranks (multiprocessing's
    helpers are not spawn_main children)."""
    return [c for c in _children(table, pid) if c.python and _is_rank_of(entry, c)]


def _alive_parent(table: dict[int, ProcInfo], info: ProcInfo) -> ProcInfo | None:
    parent = table.get(info.ppid)
    return parent if parent is not None and parent.pid != 1 else None


# launcher_kind values: how the ranks were started (wire: grouped by their connections,
# tcp_discovery.py)
KINDS = tuple(e.kind for e in T.TABLE + T.UNLAUNCHED)
# Launchers known by their ranks (mp.spawn's, Lightning's), in the table's order,
# and the one a Python parent of ranks that no entry recognises is taken for
_BY_RANK = tuple(e for e in T.TABLE if e.rank_argv or e.rank_env)
_ADOPTER = next(e for e in T.TABLE if e.adopts)


def _launcher(me: ProcInfo, parent: ProcInfo | None, table: dict[int, ProcInfo],
              record_pids: frozenset[int]) -> tuple[ProcInfo | None, T.Launcher | None]:
    """The process that launched `me`'s job (`me` itself, perhaps) and its entry
    in the table; (None, None) for ranks without one (by hand, srun's tasks)."""
    for who in (me, parent):
        entry = who.launcher if who is not None else None
        if entry is not None:
            return who, entry
    for entry in _BY_RANK:
        if parent is not None and _is_rank_of(entry, me):
            return parent, entry  # Lightning's rank 0, mp.spawn's parent
        if me.pid != 1 and _recognised(table, me.pid, entry):
            return me, entry  # the parent of such ranks itself
    # a spawner of its own (Python: not a shell, slurmstepd or a container init)
    if me.python and any(looks_like_rank(c, record_pids)
                         for c in _children(table, me.pid, record_pids)):
        return me, _ADOPTER  # itself often rank 0
    if (parent is not None and parent.python and looks_like_rank(me, record_pids)
            and sum(looks_like_rank(c, record_pids)
                    for c in _children(table, parent.pid, record_pids)) > 1):
        return parent, _ADOPTER
    return None, None


def find_job(target: int, table: dict[int, ProcInfo], record_pids=frozenset()) -> Job | None:
    """The job `target` belongs to, or None if `target` is not in the table."""
    record_pids = frozenset(record_pids)
    table = indexed(table)
    me = table.get(target)
    if me is None:
        return None
    while _a_worker(me, table, record_pids):  # a person typed a DataLoader worker's pid
        me = table[me.ppid]
    launcher, entry = _launcher(me, _alive_parent(table, me), table, record_pids)

    numbered: dict[int, tuple[int, int]] = {}  # pid -> (rank, world size)
    if entry is None:
        ranks = [me] + _peers_by_env(me, table, record_pids)
        peers = L.peers_of(me.env)
        kind = peers.kind if peers else "none"
    else:
        kind = entry.kind
        ranks, numbered = SHAPES[entry.shape](entry, launcher, table, record_pids)
        if entry.launcher_rank == "always":
            ranks = [launcher] + ranks
        elif entry.launcher_rank == "claimed" and looks_like_rank(launcher, record_pids):
            ranks.append(launcher)
    rank_pids = tuple(sorted({p.pid for p in ranks}))
    for p in ranks:
        rank, world, _ = L.env_rank(p.env)
        if rank < 0 and entry is not None and entry.rank_flags:
            rank = _flag_rank(entry, launcher, p)
        if rank >= 0:  # a launcher's variable outranks a convention
            numbered[p.pid] = (rank, world if world >= 0 else numbered.get(p.pid, (0, -1))[1])
    worlds = {w for _, w in numbered.values() if w > 0}
    run_id = next((p.env["TORCHELASTIC_RUN_ID"] for p in ranks
                   if p.env.get("TORCHELASTIC_RUN_ID", "none") != "none"), "")
    if not run_id:
        # The same on every node of a job, so the cluster view can join nodes'
        # series (torchrun's default run id is "none").
        run_id = next((f"{p.env['MASTER_ADDR']}:{p.env['MASTER_PORT']}" for p in ranks
                       if p.env.get("MASTER_ADDR") and p.env.get("MASTER_PORT")), "")
    # Lightning's rank 0 is the launcher: it is counted among the ranks, not again
    # as a launcher process
    launcher_pid = (launcher.pid if launcher is not None and entry.launcher_rank != "always"
                    else -1)
    return Job(target_pid=target, launcher_pid=launcher_pid, launcher_kind=kind,
               rank_pids=rank_pids, run_id=run_id,
               ranks=tuple(numbered.get(pid, (-1, -1))[0] for pid in rank_pids),
               world_size=worlds.pop() if len(worlds) == 1 else -1)


# How a launcher's ranks stand to its process (ddpwatch/launchers.py `Launcher.shape`;
# "peers", ranks without a launcher process, are `_peers_by_env`'s): each gives the
# ranks under `launcher` and the numbers its convention gives them.

def _workers(entry, launcher, table, record_pids):
    """torchrun-like agents: every child is a worker (multiprocessing's helpers aside)."""
    return [c for c in _children(table, launcher.pid) if not L.is_mp_helper(c.cmdline)], {}


def _claimants(entry, launcher, table, record_pids):
    """The children that say they are ranks (mpirun's daemons start other things too)."""
    return [c for c in _children(table, launcher.pid, record_pids)
            if looks_like_rank(c, record_pids)], {}


def _spawned(entry, launcher, table, record_pids):
    """mp.spawn's children, numbered by `_spawn_ranks`; else the children that say
    they are ranks (a script of the user's own that starts them)."""
    spawned = _recognised(table, launcher.pid, entry)
    if not spawned:
        return _claimants(entry, launcher, table, record_pids)
    return spawned, _spawn_ranks(spawned)


def _reexecuted(entry, launcher, table, record_pids):
    """Lightning's re-executions of the user's process (rank 0, added by the caller)."""
    children = _recognised(table, launcher.pid, entry)
    return children, _node_ranks(entry.env[0], launcher, children)


SHAPES = {"workers": _workers, "claimants": _claimants, "spawned": _spawned,
          "reexecuted": _reexecuted}


def _spawn_ranks(spawned: list[ProcInfo]) -> dict[int, tuple[int, int]]:
    """mp.spawn's index of each child: it starts them one after the other
    (`for i in range(nprocs): Process(target=_wrap, args=(fn, i, ...)).start()`),
    so the order of their start is the index, and their parent is still joining
    them, so none is missing (join terminates the rest when one fails). Within
    one clock tick the pid order decides, unless the pids of that tick lie far
    apart (the pid counter wrapped between them: which came first is unknowable),
    then the numbering is left to other evidence (records)."""
    ordered = sorted(spawned, key=lambda p: (p.start, p.pid))
    ticks: dict[int, list[int]] = {}
    for p in ordered:
        ticks.setdefault(p.start, []).append(p.pid)
    if any(max(pids) - min(pids) > SPAWN_PID_SPREAD for pids in ticks.values()):
        return {}
    world = len(ordered)
    return {p.pid: (i, world) for i, p in enumerate(ordered)}


SPAWN_PID_SPREAD = 4096  # children forked in one tick get nearby pids, barring a wrap


def _node_ranks(names: T.Env, rank0: ProcInfo, children: list[ProcInfo]
                ) -> dict[int, tuple[int, int]]:
    """Lightning's global rank: NODE_RANK x local world + LOCAL_RANK (`names` says
    which variables). On node 0 the local world does not matter; elsewhere it is
    this node's ranks (rank 0 and its re-executions), if none is missing (a local
    rank above the count says one is)."""
    node = {L.number(c.env.get(names.node_rank)) for c in children}
    worlds = {L.number(c.env.get(names.world_size)) for c in children}
    world = worlds.pop() if len(worlds) == 1 else -1
    if len(node) != 1:
        return {}
    (node_rank,) = node
    local = {c.pid: L.number(c.env.get(names.local_rank)) for c in children}
    local[rank0.pid] = 0
    local_world = len(local)
    if node_rank > 0 and max(local.values()) >= local_world:
        return {}
    return {pid: (node_rank * local_world + lr, world) for pid, lr in local.items() if lr >= 0}


def _flag_rank(entry: T.Launcher, launcher: ProcInfo, worker: ProcInfo) -> int:
    """A worker's `--local_rank=i` (`entry.rank_flags`) under a launcher on node 0
    by its `entry.node_flag` (DeepSpeed's `--node_rank`; elsewhere the ranks per
    node are in its base64 --world_info: unknown)."""
    local = L.local_rank_arg(worker.cmdline, entry.rank_flags)
    node = 0
    for i, arg in enumerate(launcher.cmdline):
        name, eq, value = arg.partition("=")
        if name == entry.node_flag:
            node = L.number(value if eq else (launcher.cmdline[i + 1]
                                              if i + 1 < len(launcher.cmdline) else None))
    return local if node == 0 else -1


def _peers_by_env(me: ProcInfo, table: dict[int, ProcInfo], record_pids) -> list[ProcInfo]:
    """Ranks started by hand or by a scheduler: the same SLURM step, or the same
    MASTER_ADDR:PORT and world size."""
    key = L.group_key(me.env)
    if key is None:
        return []
    # Another user's processes are never this job's, whatever their environment says.
    # Only Python processes and writers of records look like ranks: the
    # candidates, not every process (3 000 of one user's look-alikes made this a
    # walk of the whole table per job: benchmarks/hostile_scan.py --procs).
    table = indexed(table)
    pids = table.candidates() | (frozenset(record_pids) & table.keys())
    return [p for p in (table[pid] for pid in sorted(pids))
            if p.pid != me.pid and looks_like_rank(p, record_pids)
            and p.uid == me.uid and L.group_key(p.env) == key
            and not _a_worker(p, table, record_pids)]


def all_jobs(table: dict[int, ProcInfo], record_pids=frozenset()) -> list[Job]:
    """Every job on this node: each launcher's, then ranks started otherwise. A
    family of spawned children counts only with a sign of torch.distributed in its
    environment or a record: any Python program may use multiprocessing."""
    record_pids = frozenset(record_pids)
    table = indexed(table)
    jobs, seen = [], set()
    # only a Python process or a launcher can be either (`candidates`), and the
    # writers of records
    candidates = sorted(table.candidates() | (record_pids & table.keys()))
    launchers = [p for p in candidates if table[p].launcher is not None]
    ranks = [p for p in candidates if (looks_like_rank(table[p], record_pids)
                                          or _spawned_rank(table[p], table, record_pids))
             and not _a_worker(table[p], table, record_pids)]
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


MAX_LABEL = 128
TORCH_ENV = ("MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE")


def _spawned_rank(info: ProcInfo, table: dict[int, ProcInfo], record_pids) -> bool:
    """A rank by its argv alone (mp.spawn's spawn_main child), if its family (its
    parent and the parent's children of its kind) shows torch.distributed."""
    if not info.python or _alive_parent(table, info) is None:  # rank_argv: Python's
        return False
    for entry in _BY_RANK:
        if entry.rank_argv and entry.rank_argv(info.cmdline):
            family = [table[info.ppid]] + _recognised(table, info.ppid, entry)
            return any(p.pid in record_pids or any(k in p.env for k in TORCH_ENV)
                       for p in family)
    return False


def job_key(job: Job) -> str:
    """A stable, bounded label for a job ("none" is torchrun's default run id).
    A label, never a path or a key that tells jobs apart: the run id is whatever
    the job's owner put in its environment (owner_key tells jobs apart)."""
    if job.run_id and job.run_id != "none":
        return "".join(c if c.isprintable() else "?" for c in job.run_id[:MAX_LABEL])
    anchor = job.launcher_pid if job.launcher_pid > 0 else min(job.rank_pids, default=job.target_pid)
    return f"pid{anchor}"


def owner_key(job: Job, table: dict[int, ProcInfo]) -> str:
    """Who a job is, for the daemon's own books: the uid, pid and start time of
    its launcher (else its first rank). Two users' jobs with one run id never
    share it (tests/unit/publish/test_hostile_unit.py: a second user's process with a
    stopped job's run id hid that job's incident), and it stays the same across a
    daemon restart."""
    anchor = job.launcher_pid if job.launcher_pid > 0 else min(job.rank_pids,
                                                               default=job.target_pid)
    info = table.get(anchor)
    uid, start = (info.uid, info.start) if info is not None else (-1, -1)
    return f"u{uid}.p{anchor}.s{start}"


_KEY = re.compile(r"u(-?\d+)\.p-?\d+\.s(-?\d+)\Z")  # owner_key's


def owner_uid(key: str) -> int:
    """The uid in an owner key; -1 when unknown (publish/limits.py: one bucket
    for all of those)."""
    m = _KEY.match(key)
    return int(m.group(1)) if m else -1


def born_s(key: str) -> float | None:
    """When the job's oldest process started, in seconds since boot
    (CLOCK_BOOTTIME, as /proc/PID/stat counts), from its owner key; None if unknown."""
    m = _KEY.match(key)
    if not m or int(m.group(2)) < 0:
        return None
    return int(m.group(2)) / CLK_TCK


def labels(jobs: list[Job], table: dict[int, ProcInfo]) -> dict[str, str]:
    """owner_key -> the job's label (job_key), each label used once: jobs that
    share a run id keep it in order of start (the oldest keeps it bare, the
    others get "@<owner key>"), so /metrics never holds two series with the
    same labels and the first job keeps the name its other nodes know it by."""
    keyed = sorted(((owner_key(j, table), job_key(j)) for j in jobs),
                   key=lambda kl: (_start_of(kl[0]), kl[0]))
    out, taken = {}, set()
    for owner, label in keyed:
        out[owner] = label if label not in taken else f"{label}@{owner}"
        taken.add(out[owner])
    return out


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return -1


def _start_of(owner: str) -> int:
    return _int(owner.rsplit(".s", 1)[-1])
