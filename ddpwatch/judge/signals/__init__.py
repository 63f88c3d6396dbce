"""The named signals rules combine: measured facts per rank, from a short history
of snapshots (oldest first). Pure.

Signals come in families, one module each, that declare their signals (name,
type, meaning: `SIGNALS`) beside the code that measures them:

    process     /proc over the window: state, CPU, run-queue wait, environment
    sockets     the rank's TCP connections: connects stuck, idle times
    heartbeat   the rank's own record: collective, step, phase, dtype, data
    stack       what py-spy dumps say the main thread does (and, across ranks, who
                left the common path when they wait in different collectives)
    interfaces  where the rank's Gloo listens against where it reaches the master
    inbound     peers' connects this node drops (the traffic probe)
    window      shares of a sampled window: stopped, running, asleep, throttled
    work        whether it, or a worker of its, works: CPU, disk, I/O, sockets
    launch      its place in the job when its environment does not say it
    exits       how its process ended (signal, exit code) and when, next to its peers'
    host        the node: cores, bf16, hostname resolution, crowding
    state       what the rank is doing, from the families above
    peers       the rank next to the other ranks of its job
    overtime    what the job's past makes of this window: a pause's age and bound, a
                spell of slowness (given by the daemon's per-job watch, never measured
                here: absent in diagnose)

A new signal is a line in its family's SIGNALS (name, type, meaning, unit:
spec.py) and the code there that measures it: per rank, or across ranks in a step
that declares what it reads and writes (steps.py `cross_rank`: the steps' order
follows); `ddpwatch rules signals` and docs/rules.md list it from that line. A
rule naming anything no family declares, or comparing it with a value of another
type or a string value its signal does not declare (spec.py `one_of`), is
rejected by the rules loader. A value that could not be measured is None, and a condition on
None is false (a blind watcher must not conclude anything).
"""
from __future__ import annotations

from ...observe.snapshot import Snapshot
from . import (exits, heartbeat, host, inbound, interfaces, launch, overtime, peers, process,
               sockets, stack, state, steps, window, work)
from .spec import Signal

# measured per rank from the history, in this order (later families read earlier ones)
PER_RANK = (process, sockets, heartbeat, stack, interfaces, inbound, window)
FAMILIES = PER_RANK + (work, launch, host, state, exits, peers, overtime)
SIGNALS: dict[str, Signal] = {}
FAMILY: dict[str, str] = {}  # signal name -> the family (module) that declares it
for _family in FAMILIES:
    for _signal in _family.SIGNALS:
        assert _signal.name not in SIGNALS, f"signal {_signal.name} declared twice"
        SIGNALS[_signal.name] = _signal
        FAMILY[_signal.name] = _family.__name__.rpartition(".")[2]
# the cross-rank steps, each after those whose signals it reads (steps.py)
STEPS = steps.ordered(steps.of(FAMILIES))


def measure(history: tuple[Snapshot, ...], remote: tuple[dict, ...] = ()) -> list[dict]:
    """Per-rank signals, completed with the cross-rank ones. `remote`: the local
    signals of this job's ranks on other nodes, as their daemons measured them
    (the peer view); they join before the cross-rank step, so a culprit on
    another node is named here too."""
    return with_peers(local(history), remote)


def local(history: tuple[Snapshot, ...]) -> list[dict]:
    """Per-rank signals from what this node saw: every value a rule needs that
    does not depend on the peers. Clock-free (ratios, ages, flags), so another
    node's daemon can judge with them (see measure)."""
    last = history[-1]
    ranks = []
    pids = list(last.job.rank_pids)
    if not pids and not last.job.departed_pids and last.job.launcher_pid > 0:
        pids = [last.job.launcher_pid]  # a launcher whose workers never started
    records = {r.pid: (r, alive) for r, alive in heartbeat.job_records(last)}
    for pid in pids:
        s: dict = {}
        for family in PER_RANK:
            s.update(family.measure(history, pid))
        s.update(work.measure(history, pid, s))  # reads the process family's CPU
        s.update(launch.measure(history, pid, s))  # from the families above
        if s.get("rank", -1) in (-1, None) and s.get("hb_rank") is not None:
            s["rank"], s["world_size"] = s["hb_rank"], s["hb_world_size"]
        s["launcher_only"] = not last.job.rank_pids
        ranks.append(s)
    for pid, (rec, alive) in records.items():  # ranks gone from this node, records left
        if pid in pids:
            continue
        s = {"pid": pid, "alive": False, "rank": rec.rank, "world_size": rec.world_size,
             "launcher_only": False}
        s.update(heartbeat.measure(history, pid))
        ranks.append(s)
    held = {s["pid"] for s in ranks}
    for pid, rank in zip(last.job.departed_pids, last.job.departed_ranks):
        if pid not in held:  # ranks seen ending while watched (the exits probe)
            ranks.append({"pid": pid, "alive": False, "rank": rank,
                          "world_size": last.job.world_size, "launcher_only": False})
    ranks += peers.missing(ranks)
    for s in ranks:
        host.measure(s, last)
        heartbeat.of_job_record(s, records.get(s["pid"], (None,))[0])
        state.measure(s, last)
        exits.measure(s, last)
    return ranks


def with_peers(local_ranks: list[dict], remote: tuple[dict, ...]) -> list[dict]:
    ranks = [dict(s) for s in local_ranks]  # the links add to them; `local` stays as measured
    held = {s["rank"] for s in ranks if isinstance(s.get("rank"), int) and s["rank"] >= 0}
    for s in remote:  # a rank held here, or already given by another peer, is not added
        if s.get("rank") not in held:
            held.add(s.get("rank"))
            ranks.append(dict(s, remote=True))
    for step in STEPS:
        step.fn(ranks)
    return ranks


__all__ = ["SIGNALS", "FAMILY", "Signal", "measure", "local", "with_peers"]
