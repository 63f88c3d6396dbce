"""Peers family: each rank next to the other ranks of its job (on this node,
and on others through the peer view). One rank's 0% CPU is only a verdict
next to its peers' states (docs/design.md "Ranks judged together"). Pure."""
from __future__ import annotations

import bisect
from collections import Counter

from .spec import NUMBER, declare
from .steps import cross_rank
from .process import IDLE_CPU
from .stack import rank_name
from .window import THROTTLED, cpu_wanted

SIGNALS = declare(
    ("missing", bool, "a rank of an all-local job with no process and no record on this node"),
    ("peers_blocked", int, "other ranks that are blocked", "count"),
    ("peers_compiling", int, "other ranks, alive and not stopped, that compile (warming up "
                             "with dynamo/inductor frames on their stacks)", "count"),
    ("peers_alive", int, "other ranks that are alive", "count"),
    ("pausing", bool, "works outside the collectives (signal working: CPU, disk, I/O, "
                      "sockets, or its workers) while a peer waits in one, or while it "
                      "waits for its DataLoader (pause_kind data) whatever its peers do: "
                      "every rank waits for its workers at an epoch's start; not stopped, "
                      "compiling at start-up or meeting its peers. Where its stack stands "
                      "(pause_kind) never makes it pausing: idle there is a hang. A pause, "
                      "not yet a hang: the daemon pages it only past what is normal for "
                      "the job (rule pause-past-bound)"),
    ("peers_paused", int, "other ranks that are pausing", "count"),
    ("paused_peer", str, "who pauses and what it does (\"rank 0 evaluation at estimate_loss "
                         "<- train.py:260\"), for a waiting rank's evidence"),
    ("peers_in_rendezvous", int, "other ranks still in init_process_group (stack or heartbeat)",
                                 "count"),
    ("seq_behind", int, "collectives this rank is behind the furthest peer", "count"),
    ("peer_dead", bool, "a rank of the job died (its record remains, its process is gone)"),
    ("peer_exited", bool, "a rank of the job left cleanly (record says exited) while this one "
                          "runs"),
    ("peer_stopped", bool, "another rank of the job is stopped (state T): the others' shares "
                           "of time in collectives no longer compare"),
    ("peer_ops_differ", bool, "stuck ranks wait in different collectives"),
    ("step_time_ratio", NUMBER, "this rank's step time over the peers' median", "ratio"),
    ("comm_share_ratio", NUMBER, "this rank's share of time in collectives over the peers' "
                                 "median", "ratio"),
    ("peer_comm_share", NUMBER, "the peers' median share of step time in collectives", "share"),
    ("peer_cpu_ratio", NUMBER, "the peers' median CPU over the window, in cores", "cores"),
    ("runqueue_wait_vs_peers", NUMBER, "this rank's run-queue wait over the peers' median (on "
                                       "a busy node every rank waits some; a starved one "
                                       "waits more)", "ratio"),
    ("peers_remote", int, "ranks of the job in this view that run on other nodes (the peer "
                          "view, diagnose --peer)", "count"),
    ("ranks_unseen", int, "ranks of the job no view here holds: world size - ranks seen (they "
                          "run on nodes whose daemons are not peers)", "count"),
    ("compute_s", NUMBER, "seconds of the rank's step outside collectives: its step time less "
                          "its waiting share (clock-free: each rank's own durations)", "s"),
    ("compute_ratio", NUMBER, "its share of step time outside collectives over the peers' "
                              "median share (floored at 5%): how many times longer it works "
                              "per step than they do (a straggler arrives last because it "
                              "works longer)", "ratio"),
    ("outworks_peers", bool, "works per step at least 2.5x as long as its peers "
                             "(compute_ratio) while they wait half of each step or more, "
                             "wanting a CPU for a good part of that time or held back by its "
                             "quota: it arrives last at each collective"),
    ("peer_cpu_model", str, "the CPU model of its peers on other nodes where it is not this "
                            "rank's (a slower CPU is a straggler's cause: its model beside "
                            "the measured step-time ratio)"),
    ("blamed_elsewhere", str, "where this rank's culprit is when no view here holds it: 'the "
                              "node at ADDR' whose firewall drops its data connect, 'a rank "
                              "on ADDR' for ranks on nodes no daemon here watches"),
    ("data_parity", bool, "this rank's data fingerprint differs from the peers' majority"),
    ("data_fps", str, "the fingerprints seen across the job, with counts"),
)


# A healthy pair of ranks works about as long per step (within 1.5x here, on a busy
# 2-core host); a CPU quota of 0.15 cores on one made it 6-7x, its peer waiting 91%.
OUTWORKS = 2.5
PEERS_WAIT = 0.5
MIN_WORK_SHARE = 0.05  # peers that wait (nearly) all the time: the ratio is "at least" this


# A rank that works outside collectives works on a CPU: it wants one (CPU used
# plus run-queue wait) for a good part of that time, or its quota holds it back
# (as much as makes it straggle: window.THROTTLED). On a link shaped to 8 Mbit/s
# a rank idled 0.76 s of a 2.4 s step outside the collectives' accounting at 3%
# CPU, 6x its peers by the shares: no straggler.
BUSY_OUTSIDE = 0.3


def _works_on_a_cpu(s: dict) -> bool:
    wanted = cpu_wanted(s)
    if wanted is None or s.get("hb_comm_share") is None:
        return True  # not measured: the shares alone decide
    return (wanted >= BUSY_OUTSIDE * (1.0 - s["hb_comm_share"])
            or (s.get("throttled_share") or 0) >= THROTTLED)


def missing(ranks: list[dict]) -> list[dict]:
    """Ranks of an all-local job that have neither a process nor a record here: a
    plain script's rank that died leaves nothing else behind (no heartbeats)."""
    live = [s for s in ranks if s.get("alive")]
    worlds = {s.get("world_size") for s in live if (s.get("world_size") or 0) > 0}
    if len(worlds) != 1 or not all(s.get("all_ranks_local") for s in live) or not live:
        return []
    (world,) = worlds
    seen = {s.get("rank") for s in ranks}
    return [{"pid": -1, "alive": False, "rank": r, "world_size": world, "missing": True,
             "launcher_only": False} for r in range(world) if r not in seen]


def _compute_s(s: dict):
    """A rank's step time outside collectives (heartbeats), None unknown."""
    step, share = s.get("hb_step_s"), s.get("hb_comm_share")
    if not s.get("alive") or not step or share is None:
        return None
    return round(step * (1.0 - share), 4)


@cross_rank(reads=("ranks_unseen", "syn_sent_dropped_by", "peer_dead"),
            writes=("blamed_elsewhere",))
def blame_elsewhere(ranks: list[dict]) -> None:
    """After the links (inbound ties a stuck connect to a peer's capture): the
    culprit of a rank whose culprit is not in this view, by its address. A rank
    whose data connect goes unanswered waits on the node it dials, not on itself
    (node 0's rank 0 was blamed for node 1's firewall)."""
    for s in ranks:
        target = s.get("syn_sent_to") or ""
        if s.get("syn_sent_data") and s.get("syn_sent_dropped_by") is None and target:
            s["blamed_elsewhere"] = f"the node at {target.rpartition(':')[0].strip('[]')}"
        elif s.get("link_silent_between") and not s.get("peer_dead"):
            # nothing comes back from there, acknowledgements included: the link (or
            # the node behind it) is what fails, not a rank that could be named
            s["blamed_elsewhere"] = "the link between " + s["link_silent_between"]
        elif (s.get("ranks_unseen") or 0) >= 1 and s.get("remote_addrs"):
            s["blamed_elsewhere"] = "a rank on " + " or ".join(s["remote_addrs"].split())


class _PeerMedian:
    """Median of a signal over a rank's live peers, for every rank in O(n log n):
    the values are sorted once, and a rank's own value is left out by index
    (the daemon judges jobs of hundreds of ranks every second)."""

    def __init__(self, ranks: list[dict], key: str):
        self.key = key
        self.values = sorted(s[key] for s in ranks if s.get("alive") and s.get(key) is not None)

    def of_peers(self, s: dict):
        """statistics.median of the values but this rank's, in O(log n): the
        sorted values with index `skip` left out are read around it."""
        values = self.values
        own = s.get(self.key) if s.get("alive") else None
        skip = bisect.bisect_left(values, own) if own is not None else len(values)
        n = len(values) - (skip < len(values))
        if n <= 0:
            return None

        def at(k):  # the k-th of the values without index `skip`
            return values[k + (k >= skip)]
        return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


@cross_rank(writes=("comm_share_ratio", "compute_ratio", "compute_s", "data_fps", "data_parity",
                    "outworks_peers", "peer_comm_share", "peer_cpu_model", "peer_cpu_ratio",
                    "peer_dead", "peer_exited", "peer_ops_differ", "peer_stopped", "peers_alive",
                    "peers_blocked", "peers_compiling", "peers_in_rendezvous", "peers_remote",
                    "ranks_unseen", "runqueue_wait_vs_peers", "seq_behind", "step_time_ratio"))
def link(ranks: list[dict]) -> None:
    fingerprints = Counter(s.get("data_fp") for s in ranks if s.get("data_fp"))
    joining = sum(1 for p in ranks if p.get("alive") and (
        p.get("stack") == "rendezvous" or p.get("hb_phase") in ("rendezvous", "init")))

    def is_dead(p):  # a missing rank while peers still join has not started: not dead
        return not p.get("alive") and p.get("hb_phase") != "exited" and not (
            p.get("missing") and joining)
    alive = sum(1 for s in ranks if s.get("alive"))
    blocked = sum(1 for s in ranks if s.get("blocked"))
    dead = sum(1 for s in ranks if is_dead(s))
    exited = sum(1 for s in ranks if not s.get("alive") and s.get("hb_phase") == "exited")
    stopped = sum(1 for s in ranks if _is_stopped(s))
    # a stopped rank's stack still shows where it was stopped: it compiles nothing
    compiling = [p for p in ranks if p.get("alive") and not _is_stopped(p)
                 and p.get("warming_up") and p.get("stack") == "compile"]
    compiling_ids = {id(p) for p in compiling}
    seqs = sorted((s["hb_seq"] for s in ranks if s.get("hb_seq") is not None), reverse=True)
    # Desync is a hang: only ranks stuck past their bound count, so a healthy
    # rank caught between two different collectives is not one.
    # A stopped rank waits in nothing: SIGSTOP caught Lightning's rank 1 inside its
    # per-step broadcast (#N) while rank 0, past it, waited in the bucket all-reduce
    # (#N+1), and rank 0 was called a desync victim of a rank that was only stopped.
    stuck = [p for p in ranks if p.get("blocked") and p.get("waiting_in") and not _is_stopped(p)]
    ops_differ = len(stuck) >= 2 and len({p["waiting_in"] for p in stuck}) > 1
    for s in ranks:
        s["compute_s"] = _compute_s(s)
    step, share, cpu, wait = (_PeerMedian(ranks, k) for k in (
        "hb_step_s", "hb_comm_share", "cpu_ratio", "runqueue_wait_ratio"))
    remote = sum(1 for s in ranks if s.get("remote"))
    worlds = [s["world_size"] for s in ranks if (s.get("world_size") or 0) > 0]
    seen = len({s["rank"] for s in ranks if isinstance(s.get("rank"), int) and s["rank"] >= 0})
    models_by_node: dict = {}  # node -> the CPU models of its ranks
    for p in ranks:
        if p.get("cpu_model"):
            models_by_node.setdefault(p.get("node"), set()).add(p.get("cpu_model"))
    for s in ranks:
        # the ranks on the other side of the peer view from this one
        s["peers_remote"] = len(ranks) - remote if s.get("remote") else remote
        s["ranks_unseen"] = max(worlds) - seen if worlds else None
        me_alive, me_blocked = bool(s.get("alive")), bool(s.get("blocked"))
        me_dead = is_dead(s)
        s["peers_alive"] = alive - me_alive
        s["peers_blocked"] = blocked - me_blocked
        s["peers_compiling"] = len(compiling) - (id(s) in compiling_ids)
        s["peers_in_rendezvous"] = joining - bool(s.get("alive") and (
            s.get("stack") == "rendezvous" or s.get("hb_phase") in ("rendezvous", "init")))
        s["peer_dead"] = dead - me_dead > 0
        s["peer_exited"] = exited - (not me_alive and s.get("hb_phase") == "exited") > 0
        s["peer_stopped"] = stopped - _is_stopped(s) > 0
        if s.get("hb_seq") is not None and len(seqs) > 1:
            furthest = seqs[1] if s["hb_seq"] == seqs[0] else seqs[0]
            s["seq_behind"] = furthest - s["hb_seq"]
        s["peer_ops_differ"] = me_blocked and ops_differ
        peer_step = step.of_peers(s)
        if s.get("hb_step_s") and peer_step:
            s["step_time_ratio"] = round(s["hb_step_s"] / peer_step, 3)
        peer_share = share.of_peers(s)
        if s.get("hb_comm_share") is not None and peer_share:
            s["comm_share_ratio"] = round(s["hb_comm_share"] / peer_share, 3)
            s["peer_comm_share"] = peer_share
        s["peer_cpu_ratio"] = cpu.of_peers(s)
        peer_wait = wait.of_peers(s)
        if s.get("runqueue_wait_ratio") is not None and peer_wait is not None:
            s["runqueue_wait_vs_peers"] = round(s["runqueue_wait_ratio"] / max(peer_wait, 0.02), 2)
        if s.get("compute_s") is not None and peer_share is not None:
            # Over a window every rank of a synchronous job completes the same steps,
            # so the shares of step time outside collectives compare as the times do
            # (one last step each would not: a throttled rank's steps vary 10x).
            s["compute_ratio"] = round((1.0 - s["hb_comm_share"])
                                       / max(1.0 - peer_share, MIN_WORK_SHARE), 2)
        s["outworks_peers"] = bool((s.get("compute_ratio") or 0) >= OUTWORKS
                                   and (s.get("peer_comm_share") or 0) >= PEERS_WAIT
                                   and _works_on_a_cpu(s))
        others = set().union(*(models for node, models in models_by_node.items()
                               if node != s.get("node"))) - {s.get("cpu_model")}
        s["peer_cpu_model"] = ", ".join(sorted(others)) if others and s.get("cpu_model") \
            else None
    for s in ranks:
        if s.get("data_fp"):
            # With two ranks there is no majority to blame: every rank carries it.
            s["data_parity"] = len(fingerprints) > 1
            s["data_fps"] = ", ".join(f"{fp} ({n} rank{'s' if n > 1 else ''})"
                                      for fp, n in fingerprints.most_common())


@cross_rank(reads=("ddp_starting", "peers_blocked"),
            writes=("paused_peer", "pausing", "peers_paused"))
def link_pauses(ranks: list[dict]) -> None:
    """Who works outside the collectives while its peers wait
    (docs/judgement-over-time.md "Is anybody working?"): somebody working is a
    pause, nobody is a hang. After
    stack.link_start (ddp_starting) and window.link (cpu_wanted)."""
    for s in ranks:
        # Work is measured (work.py), never read from where a stack stands: idle
        # in estimate_loss, torch.save or a DataLoader's wait is how the hangs
        # people meet look (tests/daemon/test_pause_hangs.py). CPU alone for a
        # rank of another node whose daemon sends no `working` (an older one).
        working = bool(s.get("working")) or (cpu_wanted(s) or 0.0) >= IDLE_CPU
        # its workers work for it: ranks whose loaders refork at each epoch's start
        # all wait for them at once, nobody in a collective (tests/daemon/test_soak.py)
        data = s.get("pause_kind") == "data"
        s["pausing"] = bool(
            s.get("alive") and not _is_stopped(s) and not s.get("in_collective") and working
            and ((s.get("peers_blocked") or 0) >= 1 or data)
            and s.get("stack") not in ("rendezvous", "agent")
            and not s.get("ddp_starting") and not (s.get("warming_up")
                                                   and s.get("stack") == "compile"))
    pausing = [s for s in ranks if s["pausing"]]
    # named once; a rank's evidence names the first PAUSED_SHOWN of the others
    # (a DataLoader's refork at an epoch's start pauses every rank of the job)
    first = [(p, f"{rank_name(p)} ({p.get('pause_kind') or 'unknown'}"
              + (f" at {p['pause_site']}" if p.get("pause_site") else "")
              + (f": {p['work_evidence']}" if p.get("work_evidence") else "") + ")")
             for p in pausing[:PAUSED_SHOWN + 1]]
    for s in ranks:
        others = len(pausing) - s["pausing"]
        s["peers_paused"] = others
        shown = [name for p, name in first if p is not s][:PAUSED_SHOWN]
        more = f" and {others - len(shown)} more" if others > len(shown) else ""
        s["paused_peer"] = "; ".join(shown) + more if shown else None


PAUSED_SHOWN = 3


def _is_stopped(p: dict) -> bool:
    return bool(p.get("alive") and p.get("state") in ("T", "t"))
