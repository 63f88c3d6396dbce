"""Signals over a sampled window (tests/daemon/test_daemon_healthy_watch.py): the
shares of readings a rank was stopped, running or asleep (observe/window/duty.py), and
its cgroup's CPU throttling. A rank stopped 70% of the time, or held back by a
CPU quota, still advances: it is a straggler and its peers wait on it, not
`stopped`. Pure.
"""
from __future__ import annotations

import bisect

from ...observe.snapshot import Snapshot
from .spec import NUMBER, declare
from .steps import cross_rank

SIGNALS = declare(
    ("duty_samples", int, "readings of the rank's thread states over the window", "count"),
    ("stopped_share", NUMBER, "share of those readings with the process stopped (state T)",
                              "share"),
    ("running_share", NUMBER, "share with a thread running or waiting for a CPU (R)", "share"),
    ("asleep_share", NUMBER, "share with every thread asleep (S, D)", "share"),
    ("stop_switches", int, "changes between stopped and running from one reading to the next",
                           "count"),
    ("duty_cycled", bool, "stopped and resumed over and over in the window (2+ switches; "
                          "true when not counted, in snapshots of older versions): not a "
                          "rank stopped, or resumed, once during it"),
    ("throttled_share", NUMBER, "share of its cgroup's CPU periods throttled over the window "
                                "(cpu.stat)", "share"),
    ("throttled_s", NUMBER, "seconds its cgroup was throttled over the window", "s"),
    ("cpu_quota", NUMBER, "its cgroup's CPU limit, in cores (None: unlimited)", "cores"),
    ("cgroup", str, "its CPU cgroup"),
    ("cpu_wanted", NUMBER, "CPU used plus time its threads waited for a CPU over the window, "
                           "in cores: what it would use alone; ranks sharing a crowded node "
                           "get little CPU yet are busy", "cores"),
    ("peers_starved", bool, "its peers on this node wait for a CPU too (median >= 0.25 cores "
                            "over the window) and it waits less than 4x as long: the node is "
                            "crowded for the whole job, which is slowed alike, not held back "
                            "by one rank"),
    ("rank_age_s", NUMBER, "seconds since the rank's process started", "s"),
    ("job_starting", bool, "the job's youngest rank started less than 30 s ago, no "
                           "heartbeat shows steps and no stack a backward pass with every "
                           "rank connected: imports and "
                           "set-up (Lightning's set-up collectives while the rank it "
                           "re-executed still imports) are no straggling"),
    ("seen_training", bool, "an earlier look of the daemon saw these ranks past their start "
                            "(Snapshot.seen_training): a look without stacks cannot say so"),
    ("straggles", bool, "slowed but not stopped: stopped part of the window (20-95%), "
                        "throttled by a CPU quota, starved of CPU next to its peers, or "
                        "working far longer per step than its peers on other nodes"),
    ("peer_straggles", bool, "another rank of the job straggles"),
    ("slow_while_starting", bool, "it waits for a CPU as a straggler does, but nothing this "
                                  "look read says its job trains yet (job_starting): the "
                                  "daemon reads its stacks to find out"),
)

DUTY_MIN_SAMPLES = 5      # fewer readings are no share
PART_STOPPED = (0.2, 0.95)
CYCLE_SWITCHES = 2
THROTTLED = 0.2
STARVED = 0.25  # cores waited for a CPU over the window
# A rank that waits this many times as long as its peers is held back by its own
# core, even where its peers wait too: nanoGPT's rank 1 beside two busy loops
# waited 1.2-1.4 cores, rank 0 0.25-0.45 beside the daemon and the launcher, 3-9x
# (tests/thirdparty/test_thirdparty_young.py); the crowded node of
# test_between_unit's 4 jobs on 2 cores was 3.8x in one window, and a window
# alone is never a straggler (watch/slow.py holds it straggler_after_s).
FAR_ABOVE = 4.0
STARTING_S = 30.0


def cpu_wanted(s: dict) -> float | None:
    """CPU used plus run-queue wait over the window, in cores (None: unmeasured)."""
    if s.get("cpu_ratio") is None:
        return None
    return round(s["cpu_ratio"] + max(s.get("runqueue_wait_ratio") or 0, 0), 3)


def measure(history: tuple[Snapshot, ...], pid: int) -> dict:
    age = _age(history[-1], pid)
    s = _duty(history, pid)
    if history[-1].seen_training:  # said only by the daemon, where it knows
        s["seen_training"] = True
    if age is not None:
        s["rank_age_s"] = age
    return s


def _age(snap: Snapshot, pid: int) -> float | None:
    procs = snap.processes
    if procs is None or procs.uptime_s < 0:
        return None
    mine = procs.by_pid.get(pid)  # a reading that failed has no start time
    return (round(procs.uptime_s - mine.start_time_s, 1)
            if mine is not None and mine.start_time_s >= 0 else None)


def _duty(history: tuple[Snapshot, ...], pid: int) -> dict:
    duty = history[-1].duty
    if duty is None:
        return {}
    mine = duty.by_pid.get(pid)
    if mine is None or mine.samples < DUTY_MIN_SAMPLES:
        return {"duty_samples": mine.samples if mine else 0}
    n = mine.samples
    s = {"duty_samples": n, "stopped_share": round(mine.stopped / n, 3),
         "running_share": round(mine.running / n, 3), "asleep_share": round(mine.asleep / n, 3),
         # a SIGSTOP (or SIGCONT) during the window leaves it partly stopped too: that
         # rank is stopped (or running), not duty-cycled (the daemon reads across ticks)
         "duty_cycled": mine.switches < 0 or mine.switches >= CYCLE_SWITCHES}
    if mine.switches >= 0:
        s["stop_switches"] = mine.switches
    if mine.cgroup:
        s["cgroup"] = mine.cgroup
        s["cpu_quota"] = round(mine.quota_cores, 3) if mine.quota_cores > 0 else None
    first, last = mine.throttle_first, mine.throttle_last
    if first is not None and last is not None and first.periods >= 0 and last.periods >= 0:
        periods = last.periods - first.periods
        if periods > 0:
            s["throttled_share"] = round((last.throttled_periods - first.throttled_periods)
                                         / periods, 3)
        if first.throttled_s >= 0 and last.throttled_s >= 0:
            s["throttled_s"] = round(last.throttled_s - first.throttled_s, 3)
    return s


def _without(ordered: list, own) -> list:
    """`ordered` less one copy of `own` (a rank's own value, among its peers')."""
    if own is None:
        return ordered
    i = bisect.bisect_left(ordered, own)
    return ordered[:i] + ordered[i + 1:] if i < len(ordered) and ordered[i] == own else ordered


@cross_rank(reads=("outworks_peers", "peers_remote", "runqueue_wait_vs_peers"),
            writes=("cpu_wanted", "job_starting", "peer_straggles", "peers_starved",
                    "slow_while_starting", "straggles"))
def link(ranks: list[dict]) -> None:
    """After the peers' signals (runqueue_wait_vs_peers): who straggles, and
    whether a peer does."""
    ages = [s["rank_age_s"] for s in ranks if s.get("rank_age_s") is not None]
    # heartbeats say how far it got: a job at step 118 four seconds in is no start
    stepped = any((s.get("hb_step") or 0) >= 2 for s in ranks)
    # without heartbeats, a rank's stack in backward with every rank connected:
    # a step ran forward, so every rank got through DDP's constructor
    # (tests/unit/observe/test_window_stacks_unit.py)
    trained = any((s.get("stack_backward") or 0) >= 1 for s in ranks) and all(
        (s.get("gloo_unconnected") or 0) == 0 for s in ranks)
    # a rank on another node (the peer view) has its own start, seen by its daemon
    remote = any(s.get("remote") for s in ranks)
    # the daemon reads stacks in a few looks only: one that saw training is enough
    trained = trained or any(s.get("seen_training") for s in ranks)
    # ranks of this node only: another node's run queue is another machine's
    local_waits = sorted(o["runqueue_wait_ratio"] for o in ranks
                         if o.get("runqueue_wait_ratio") is not None and not o.get("remote"))
    for s in ranks:
        s["job_starting"] = bool(ages) and min(ages) < STARTING_S and not (
            stepped or trained or remote)
        if s.get("cpu_ratio") is not None:
            s["cpu_wanted"] = cpu_wanted(s)
        waits = [] if s.get("remote") else _without(local_waits, s.get("runqueue_wait_ratio"))
        # 4 jobs x 2 ranks on 2 cores: every rank waits for a CPU, one more than its
        # peer for a window now and then; no straggler (tests/unit/observe/test_between_unit.py)
        median = waits[len(waits) // 2] if waits else 0.0
        s["peers_starved"] = bool(waits) and median >= STARVED and (
            s.get("runqueue_wait_ratio") or 0) < FAR_ABOVE * median
        part = s.get("stopped_share")
        # A rank that compiles or runs its first steps is slow by nature and
        # judged warming up, above the rules that would call it slow from its
        # durations or its run-queue wait: its peer waiting at the first
        # collective is no victim of it (a CI run: rank 0 compiling, 2.5x the
        # run-queue wait of rank 1, which waited "for a slower peer").
        starved = ((s.get("runqueue_wait_ratio") or 0) >= 0.25
                   and (s.get("runqueue_wait_vs_peers") or 0) >= 2.5
                   and not s.get("blocked") and not s["peers_starved"]
                   # a straggler is slow at training: one still connecting is starting
                   and (s.get("gloo_unconnected") or 0) == 0)
        s["slow_while_starting"] = bool(starved and s["job_starting"] and s.get("alive"))
        slow_pace = not s.get("warming_up") and bool(
            # across nodes, by each rank's own durations (peers.py,
            # tests/unit/judge/test_two_nodes_unit.py)
            (s.get("outworks_peers") and (s.get("peers_remote") or 0) >= 1)
            or (starved and not s["job_starting"]))
        s["straggles"] = bool(s.get("alive") and (
            (part is not None and PART_STOPPED[0] <= part < PART_STOPPED[1]
             and s.get("duty_cycled") is not False)
            or (s.get("throttled_share") or 0) >= THROTTLED
            or slow_pace))
    count = sum(s["straggles"] for s in ranks)
    for s in ranks:
        s["peer_straggles"] = count - s["straggles"] > 0
