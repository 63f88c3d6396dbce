"""A rank's links to the job's other ranks (judge/signals/sockets.py
rank_links_idle_s) and what they say of a rank in a collective
(judge/signals/state.py `blocked`), over hand-built snapshots; the jobs behind
the numbers are in tests/daemon/test_soak.py (a DataLoader job starved of CPU
by a compile beside it) and the replay fixtures (thirdparty_ray_stopped: Ray's
own sockets busy while its rank waits)."""
from __future__ import annotations

import os

from conftest import REPO

from ddpwatch.judge import classify, rules as rules_mod
from ddpwatch.judge.signals import state as state_signals
from ddpwatch.judge.signals.sockets import measure as socket_signals
from ddpwatch.observe.probes.process import ProcessObs, Processes, SchedStat, ThreadObs
from ddpwatch.observe.probes.sockets import PidSockets, Sockets, TcpSocket
from ddpwatch.observe.probes.stacks import PidStacks, Stacks, parse_dump
from ddpwatch.observe.snapshot import Job, Snapshot

R0, R1, MASTER = 10, 11, 29500
ENV = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(MASTER), "WORLD_SIZE": "2"}
with open(os.path.join(REPO, "tests", "fixtures", "pyspy", "allreduce_rank0_blocked.json")) as f:
    WAIT = parse_dump(f.read())  # a main thread in all_reduce's wait


def tcp(local_port, peer_port, idle_ms, peer="127.0.0.1"):
    return TcpSocket(1, "tcp", "ESTABLISHED", "127.0.0.1", local_port, peer, peer_port, 0, 0, 0,
                     last_send_ms=idle_ms, last_recv_ms=idle_ms)


def sockets(pair_ms, others_ms=5):
    """Rank 0 and rank 1 joined by Gloo's pair (41000 <-> 50000, idle `pair_ms`),
    each with a store connection to the launcher's MASTER_PORT and a framework's
    own connection (Ray's gRPC) busy `others_ms` ago."""
    return Sockets(0.0, (
        PidSockets(R0, sockets=(tcp(41000, 50000, pair_ms), tcp(40000, MASTER, others_ms),
                                tcp(40001, 6379, others_ms))),
        PidSockets(R1, sockets=(tcp(50000, 41000, pair_ms), tcp(40002, MASTER, others_ms),
                                tcp(40003, 6379, others_ms)))))


def proc(pid, rank, cpu_s, waited_s):
    thread = ThreadObs(pid, "python", "S", "", cpu_s, 0, SchedStat(cpu_s, waited_s, 1))
    return ProcessObs(pid, ppid=1000, state="S", cpu_seconds=cpu_s, threads=(thread,),
                      env=dict(ENV, RANK=str(rank)), start_time_s=1.0)


def snap(at, cpu_s, waited_s, pair_ms):
    procs = Processes(at, 1000.0 + at, 100, (proc(R0, 0, cpu_s, waited_s),
                                             proc(R1, 1, cpu_s, waited_s)))
    stacks = Stacks(at, "py-spy", (PidStacks(R0, "ok", "S", False, WAIT),
                                    PidStacks(R1, "ok", "S", False, WAIT)))
    job = Job(1000, -1, "torchrun", (R0, R1), "", (0, 1), 2)
    return Snapshot(1, at, at, job, procs, sockets(pair_ms), stacks, None, None, (),
                    seen_training=True)


def test_only_connections_between_the_ranks_count():
    history = (snap(0.0, 1.0, 0.0, 2500),)
    s0, s1 = socket_signals(history, R0), socket_signals(history, R1)
    assert s0["peer_idle_s"] == 0.005  # the store and Ray's sockets are busy
    assert s0["rank_links_idle_s"] == s1["rank_links_idle_s"] == 2.5
    # no other rank on this node: no link to speak of (a peer on another node)
    alone = (Snapshot(1, 0.0, 0.0, Job(1000, -1, "torchrun", (R0,), "", (0,), 2),
                      history[0].processes, sockets(2500), None, None, None, ()),)
    assert "rank_links_idle_s" not in socket_signals(alone, R0)


def blocked(links_idle_s):
    s = {"pid": R0, "alive": True, "hb": False, "stack": "collective", "cpu_ratio": 0.02,
         "runqueue_wait_ratio": 0.19, "rank_links_idle_s": links_idle_s}
    state_signals.measure(s, snap(0.0, 1.0, 0.0, 0))
    return s["in_collective"], s["blocked"]


def test_a_collective_whose_bytes_move_is_not_blocked_however_little_cpu_it_gets():
    assert blocked(0.008) == (True, False)   # bytes 8 ms ago: it moves, starved of CPU
    assert blocked(2.5) == (True, True)      # idle links: it waits for a peer
    assert blocked(None) == (True, True)     # not read (a lean look): CPU alone, as before


def test_two_starved_ranks_in_a_moving_collective_are_no_hang():
    """The CI failure in full: both ranks in the wait in every dump, 4% CPU each
    while their threads waited 0.19 cores for one, their pair moving bytes.
    Judged before as `blocked_in_collective` for every rank with no culprit."""
    rules = rules_mod.load(os.path.join(REPO, "rules", "default.yaml"))
    starved = classify.judge((snap(0.0, 10.0, 5.0, 8), snap(3.0, 10.12, 5.57, 8)), rules)
    assert {(v.verdict, v.rule) for v in starved.ranks} == {("healthy", "collective-moving")}
    assert starved.job.verdict == "healthy" and not starved.job.culprits
    assert "sent or received 0.008s ago" in starved.ranks[0].evidence
    hung = classify.judge((snap(0.0, 10.0, 5.0, 2500), snap(3.0, 10.003, 5.0, 5500)), rules)
    assert {v.verdict for v in hung.ranks} == {"blocked_in_collective"}, [
        (v.verdict, v.rule) for v in hung.ranks]
