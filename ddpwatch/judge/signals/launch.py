"""Signals of a rank's place in its job when its environment does not say it:
mp.spawn, Lightning and other launchers' ranks have no RANK,
WORLD_SIZE or MASTER_PORT at exec. Discovery numbers them by their launcher's
convention (Job.ranks, Job.world_size); the store they share is found on the
wire. Pure; `measure` completes a rank's signals after the other per-rank families,
the cross-rank step `orphans` after the peers' (it reads peers_alive).
"""
from __future__ import annotations

from ... import launchers
from ...observe.snapshot import Snapshot
from .lookup import proc_of, sockets_of
from .spec import declare, one_of
from .steps import cross_rank

SIGNALS = declare(
    ("rank_source", one_of("env", "launch", "wire", "record", "unknown"),
     "where the rank number comes from: its environment, its launcher's convention (spawn "
     "index, NODE_RANK x local world + LOCAL_RANK), the wire (the TCPStore's host is rank 0; "
     "in a closed group of two the other is 1), its heartbeat record, or nowhere"),
    ("store_port", int, "the TCPStore's port: MASTER_PORT, else the port one rank of the job "
                        "listens on that every rank is connected to"),
    ("parent_gone", bool, "the process was re-parented to init (PPID 1): its launcher or "
                          "shell left"),
    ("progressing", bool, "evidence of progress: its heartbeat advances, or it computes (CPU "
                          ">= 30%) connected to all its peers, outside any collective wait"),
)


def measure(history: tuple[Snapshot, ...], pid: int, s: dict) -> dict:
    """Completes a rank's signals `s` from the other per-rank families."""
    last = history[-1]
    job = last.job
    out: dict = {}
    if s.get("rank", -1) >= 0:
        out["rank_source"] = "env"
    elif s.get("hb_rank") is not None:  # the rank's own word, best of all
        out["rank_source"] = "record"
    elif pid in job.rank_pids and job.ranks and job.ranks[job.rank_pids.index(pid)] >= 0:
        out["rank"] = job.ranks[job.rank_pids.index(pid)]
        out["rank_source"] = "wire" if job.launcher_kind == "wire" else "launch"
    else:
        out["rank_source"] = "record" if s.get("hb_rank") is not None else "unknown"
    world = s.get("world_size", -1)
    if (world is None or world < 0) and job.world_size > 0:
        world = out["world_size"] = job.world_size
    if s.get("gloo_unconnected") is None and world and world > 0 and last.sockets is not None:
        store = store_port(last)
        if store > 0:
            out["store_port"] = store
            data = sum(1 for k in sockets_of(last, pid) if k.state == "ESTABLISHED"
                       and store not in (k.peer_port, k.local_port))
            out["gloo_unconnected"] = max(world - 1 - data, 0)
    # a launcher whose ranks are all on one node by construction (launchers.py
    # `Launcher.world_local`): every rank of the world is found here
    if (launchers.world_local(job.launcher_kind) and s.get("alive") and world
            and world > 0 and not s.get("all_ranks_local") and len(job.rank_pids) == world):
        out["all_ranks_local"] = True
    return out


def store_port(snap: Snapshot) -> int:
    """MASTER_PORT as any rank's environment says, else the port that one rank of
    the job listens on and every rank (the holder too: rank 0 is a client of its
    own store) has an established connection to; -1 if none."""
    for pid in snap.job.rank_pids:
        proc = proc_of(snap, pid)
        port = proc.env.get("MASTER_PORT", "") if proc else ""
        if port.isascii() and port.isdigit() and 0 < int(port) < 65536:
            return int(port)
    pids = snap.job.rank_pids
    if len(pids) < 2:
        return -1
    listening = {k.local_port for pid in pids for k in sockets_of(snap, pid)
                 if k.state == "LISTEN"}
    for port in sorted(listening):
        if all(any(k.state == "ESTABLISHED" and k.peer_port == port for k in sockets_of(snap, pid))
               for pid in pids):
            return port
    return -1


@cross_rank(reads=("peers_alive",), writes=("parent_gone", "progressing", "orphan"))
def orphans(ranks: list[dict]) -> None:
    for s in ranks:
        s.update(orphan(s))


def orphan(s: dict) -> dict:
    """`orphan` is a leftover only: its parent gone, making no progress, and no
    live rank of its job beside it (its peers died, or never joined: a rank 0
    alone at rendezvous holding the master port, tests/fixtures/snapshots
    leftover_rendezvous). A parent gone says nothing of a live job: nohup, setsid,
    a closed terminal or SSH session re-parent every Lightning or by-hand rank 0
    to init, and a rank stuck beside a live peer (stopped, hung, starved) is that
    job's hang, judged by its verdict, whatever its parent (tests/
    test_thirdparty_jobs.py's Lightning job, started by a shell that exits, has no
    orphan in any of its states). Computed after the peers' signals (blocked,
    peers_alive)."""
    progressing = bool(s.get("hb_advanced") or (
        (s.get("cpu_ratio") or 0) >= 0.3 and not s.get("blocked")
        and (s.get("gloo_unconnected") == 0 or s.get("peers_alive", 0) >= 1)))
    parent_gone = bool(s.get("orphan"))
    alone = not s.get("peers_alive")
    return {"parent_gone": parent_gone, "progressing": progressing,
            "orphan": parent_gone and not progressing and alone}
