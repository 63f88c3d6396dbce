"""Ranks no launcher, environment or record ties together, grouped by what they
share on the wire: the TCPStore they connect to (or host) and the
Gloo connections between them.

A script started by hand that sets MASTER_ADDR/RANK in `os.environ` itself, or
passes `init_method="tcp://..."` or `file://...` from its argv, leaves nothing in
`/proc/PID/environ`; each rank is a lone Python process in a process tree of its
own. What still joins them: Gloo connects every pair of ranks, and with a TCP
store every rank (the host too) is connected to the port rank 0 listens on. Two
processes are linked when an established TCP socket of one is the other end of
an established socket of the other (the same 4-tuple reversed, the owners found
by socket inode in /proc/PID/fd).

Rank numbers only from evidence: the store's host is rank 0 (init_process_group
hosts the TCPStore on rank 0); when the group is closed (every connection of every
member ends at a member) the world is the group, and in a world of two the other
member is rank 1. Anything else stays "rank unknown" (-1), never guessed.

The daemon, which looks at the whole node and not at one pid a person named,
asks more before it calls processes a job (`ddp_groups`): two torch processes
merely talking (an inference server and its client) must not be one. It wants
the DDP shape: a TCPStore host every member is connected to, or a full mesh of
at least three; and it carries groups and numbers across passes (`carry`;
probes/wire_groups.py keeps them).

READ is `read_wire` / `uses_torch` (impure, under a procfs root); `links`,
`component`, `store_host`, `closed`, `number`, `ddp_groups`, `carry` are pure;
`extend` puts them together for `diagnose`.
"""
from __future__ import annotations

import os
from collections import deque
from dataclasses import replace

from .launchers import env_rank, launcher_kind
from ..probes.sockets import TableEntry, read_table, socket_inodes
from .job import Job

MAX_CANDIDATES = 256   # Python processes of the target's user whose sockets are read
MAPS_LIMIT = 2 << 20   # bytes of /proc/PID/maps read looking for libtorch (a torch
# process's whole maps: 100-300 KiB)
FD_LIMIT = 4096        # a candidate with more open files is left out (the daemon's scan)
LOOPBACK = ("127.", "::1", "::ffff:127.")

Key = tuple[str, str, int, str, int]


# ---------------------------------------------------------------- PARSE (pure)

def _key(ns: str, e: TableEntry, reverse: bool = False) -> Key:
    local, peer = (e.peer_addr, e.peer_port), (e.local_addr, e.local_port)
    if not reverse:
        local, peer = peer, local
    # a loopback 4-tuple is unique within its network namespace only
    scope = ns if local[0].startswith(LOOPBACK) else ""
    return (scope, local[0], local[1], peer[0], peer[1])


def _owners(sockets) -> dict[Key, int]:
    """The owner of each established connection's local end."""
    owner: dict[Key, int] = {}
    for pid, (ns, entries) in sockets.items():
        for e in entries:
            if e.state == "ESTABLISHED":
                owner[_key(ns, e)] = pid
    return owner


def links(sockets: dict[int, tuple[str, tuple[TableEntry, ...]]]) -> dict[int, set[int]]:
    """pid -> the pids at the other end of its established TCP connections.
    `sockets`: pid -> (its network namespace, its own table entries)."""
    owner = _owners(sockets)
    out: dict[int, set[int]] = {pid: set() for pid in sockets}
    for pid, (ns, entries) in sockets.items():
        for e in entries:
            other = owner.get(_key(ns, e, reverse=True)) if e.state == "ESTABLISHED" else None
            if other is not None and other != pid:
                out[pid].add(other)
                out[other].add(pid)
    return out


def component(target: int, linked: dict[int, set[int]], member=lambda pid: True) -> set[int]:
    """`target` and every process reachable from it through members only."""
    seen, todo = {target}, deque([target])
    while todo:
        for other in sorted(linked.get(todo.popleft(), ())):
            if other not in seen and member(other):
                seen.add(other)
                todo.append(other)
    return seen


def store_host(members: set[int], sockets) -> int:
    """The member listening on a port every member (the host too: rank 0 is a
    client of its own store) has an established connection to; -1 if none."""
    for pid in sorted(members):
        ns, entries = sockets[pid]
        for port in sorted({e.local_port for e in entries if e.state == "LISTEN"}):
            if all(any(e.state == "ESTABLISHED" and e.peer_port == port
                       for e in sockets[m][1]) for m in members):
                return pid
    return -1


def store_complete(host: int, members: set[int], sockets) -> bool:
    """Every connection to the store's port comes from a member. Every rank dials
    the store in init_process_group and keeps that connection, so then the world
    is the group, whatever else the members are connected to (a Ray Train
    worker talks to Ray's controller and raylet too: tests/thirdparty/test_ray_jobs.py)."""
    if host not in members:
        return False
    owner = _owners(sockets)
    ns, entries = sockets[host]
    for port in sorted({e.local_port for e in entries if e.state == "LISTEN"}):
        accepted = [e for e in entries if e.state == "ESTABLISHED" and e.local_port == port]
        dialled = {owner.get(_key(ns, e, reverse=True)) for e in accepted}
        if members <= dialled:  # the store's port: every member dialled it
            return dialled <= members
    return False


def closed(members: set[int], sockets) -> bool:
    """Every established connection of every member ends at a member: no rank of
    the job is elsewhere (another node), so the world is the group."""
    ends: dict[Key, int] = {}
    for pid in members:
        ns, entries = sockets[pid]
        for e in entries:
            if e.state == "ESTABLISHED":
                ends[_key(ns, e)] = pid
    return all(_key(ns, e, reverse=True) in ends for pid in members
               for ns, entries in [sockets[pid]] for e in entries if e.state == "ESTABLISHED")


def number(members: set[int], host: int, is_closed: bool, env_ranks: dict[int, int]
           ) -> tuple[dict[int, int], int]:
    """(pid -> rank, world size) from the evidence only."""
    ranks = {pid: r for pid, r in env_ranks.items() if r >= 0}
    if host > 0 and 0 not in ranks.values():
        ranks.setdefault(host, 0)
    world = len(members) if is_closed else -1
    unknown = [pid for pid in members if pid not in ranks]
    if world > 0 and len(unknown) == 1 and len(set(ranks.values())) == world - 1:
        (last,) = set(range(world)) - set(ranks.values()) or {-1}
        ranks[unknown[0]] = last
    return ranks, world


def store_groups(sockets) -> list[tuple[int, frozenset[int]]]:
    """(host, members) of each TCPStore among `sockets`' processes: one listens on
    a port it is itself connected to (init_process_group hosts the store on rank 0,
    and rank 0 is a client of its own store) and others are connected to; the
    members are the host and those clients. An inference server and its clients
    are no such thing: a server does not dial its own port. A process is in one
    group only (the first host by pid keeps it)."""
    owner = _owners(sockets)
    dialled: dict[tuple[int, int], set[int]] = {}  # (pid, its port) -> who is connected there
    for pid, (ns, entries) in sockets.items():
        for e in entries:
            if e.state == "ESTABLISHED":
                other = owner.get(_key(ns, e, reverse=True))
                if other is not None:
                    dialled.setdefault((other, e.peer_port), set()).add(pid)
    out, taken = [], set()
    for host in sorted(sockets):
        listening = sorted({e.local_port for e in sockets[host][1] if e.state == "LISTEN"})
        for port in listening:
            clients = dialled.get((host, port), set()) - taken
            if host in clients and len(clients) >= 2:
                out.append((host, frozenset(clients)))
                taken |= clients
                break
    return out


MESH_MIN = 3  # a pair linked once is what any client and server look like


def mesh_groups(sockets, taken=frozenset()) -> list[frozenset[int]]:
    """Groups of at least MESH_MIN processes (none in `taken`) each connected to
    every other: Gloo connects every pair of ranks, with no store among them (a
    `file://` init)."""
    linked = links(sockets)
    out, seen = [], set(taken)
    for pid in sorted(sockets):
        if pid in seen:
            continue
        members = component(pid, linked, lambda other: other not in taken)
        seen |= members
        if len(members) >= MESH_MIN and all(members - {m} <= linked[m] for m in members):
            out.append(frozenset(members))
    return out


def ddp_groups(sockets) -> list[tuple[int, frozenset[int]]]:
    """(store host or -1, members): the processes of `sockets` that have the
    shape of one DDP job on the wire, a TCPStore host every member is connected
    to or a full mesh of connections. Two torch processes merely talking (a
    server and its client) are no job."""
    stores = store_groups(sockets)
    taken = frozenset().union(*(members for _, members in stores))
    return stores + [(-1, members) for members in mesh_groups(sockets, taken)]


Member = tuple[int, int]                     # (pid, start): a process, not a reused pid
Group = tuple[tuple[tuple[Member, int], ...], int]  # ((member, rank)..., world size)


def carry(before: list, found: list, alive: set[Member]) -> list:
    """This pass's groups (Group values): those `found` on the wire, each keeping
    a rank number an earlier pass had evidence for when this pass has none (a
    rank that later opens a connection elsewhere leaves the group open, not
    renumbered); then the earlier groups no member of which was found again,
    with their members still `alive` (and in no other job): a rank whose peer
    died is no longer connected to anyone, and is still that job's rank."""
    out, claimed = [], set()
    for ranks, world in found:
        members = dict(ranks)
        earlier = {m: r for group, w in before for m, r in group if m in members}
        worlds = {w for group, w in before if any(m in members for m, _ in group)}
        used = {r for r in members.values() if r >= 0}
        for m, r in sorted(members.items()):
            if r < 0 and earlier.get(m, -1) >= 0 and earlier[m] not in used:
                members[m] = earlier[m]
                used.add(earlier[m])
        if world < 0 and len(worlds) == 1:
            world = worlds.pop()
        out.append((tuple(sorted(members.items())), world))
        claimed |= set(members)
    for ranks, world in before:
        if any(m in claimed for m, _ in ranks):
            continue
        kept = tuple((m, r) for m, r in ranks if m in alive)
        if kept:
            out.append((kept, world))
    return out


# ---------------------------------------------------------------- READ (impure)

def _ns(procfs: str, pid: int) -> str:
    try:
        return os.readlink(f"{procfs}/{pid}/ns/net")
    except OSError:
        return ""


def read_wire(procfs: str, pids, fd_limit: int = 0
              ) -> dict[int, tuple[str, tuple[TableEntry, ...]]]:
    """pid -> (network namespace, its TCP sockets); processes that are gone or
    unreadable (or hold more than `fd_limit` files) are left out. Each
    namespace's table is read once."""
    tables: dict[str, tuple[TableEntry, ...]] = {}
    out = {}
    for pid in pids:
        try:
            inodes = socket_inodes(procfs, pid, fd_limit)
            if not inodes:
                continue
            ns = _ns(procfs, pid)
            if ns not in tables or not ns:
                tables[ns] = read_table(procfs, pid)
        except OSError:
            continue
        out[pid] = (ns, tuple(e for e in tables[ns] if e.inode in inodes))
    return out


def uses_torch(procfs: str, pid: int) -> bool:
    """libtorch is mapped: a process that imported torch, not any Python program
    with a TCP connection."""
    try:
        with open(f"{procfs}/{pid}/maps", errors="replace") as f:
            return "libtorch" in f.read(MAPS_LIMIT)
    except OSError:
        return False


def extend(job: Job, table: dict, procfs: str = "/proc") -> Job:
    """`job` as discovery found it, or, for a lone Python process with no launcher
    and no environment naming its peers, the group of torch processes of its
    user it is connected to (launcher kind "wire")."""
    me = table.get(job.target_pid)
    if (job.launcher_kind != "none" or job.launcher_pid > 0 or len(job.rank_pids) > 1
            or me is None or not me.python):
        return job
    candidates = sorted(p.pid for p in table.values() if p.uid == me.uid and p.pid != 1
                        and p.python and not launcher_kind(p.cmdline))
    if me.pid not in candidates[:MAX_CANDIDATES]:
        candidates = [me.pid] + candidates
    sockets = read_wire(procfs, candidates[:MAX_CANDIDATES])
    if me.pid not in sockets or not uses_torch(procfs, me.pid):
        return job
    linked = links(sockets)
    torch_cache: dict[int, bool] = {}

    def member(pid: int) -> bool:
        if pid not in torch_cache:
            torch_cache[pid] = uses_torch(procfs, pid)
        return torch_cache[pid]
    # the DDP shape first (a store every member dialled, a full mesh): a Ray Train
    # worker is connected to Ray's controller and the driver too, both torch
    # processes; then any torch process it is connected to (two ranks by hand
    # whose store connection closed)
    shaped = [(host, set(group)) for host, group in ddp_groups(
        {pid: s for pid, s in sockets.items() if pid == me.pid or member(pid)})
        if me.pid in group]
    members = shaped[0][1] if shaped else component(me.pid, linked, member)
    if len(members) < 2:
        return job
    env_ranks = {pid: env_rank(table[pid].env)[0] for pid in members if pid in table}
    host = store_host(members, sockets)
    ranks, world = number(members, host, closed(members, sockets)
                          or store_complete(host, members, sockets), env_ranks)
    pids = tuple(sorted(members))
    return replace(job, launcher_kind="wire", rank_pids=pids,
                   ranks=tuple(ranks.get(pid, -1) for pid in pids), world_size=world)
