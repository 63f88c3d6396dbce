"""`ddpwatch diagnose <pid>`: probe the job of <pid> over a short window (a
snapshot at each end; thread states every 50 ms and stack dumps in between),
judge it as the daemon does when a person asks (watch/look.py, stacks
requested), print the report. `--replay FILE` judges a saved snapshot history."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
import time

from ..judge import classify
from ..observe.jobs import discovery
from .. import errors
from ..publish import report, stackless
from ..publish.terminal import printable_lines
from ..judge import signals
from ..judge.vocabulary import FINE
from ..observe.window.between import jittered
from ..observe.window.duty import DutyWatch
from ..observe.system.netns import net_ns
from ..observe.system import ptrace
from ..observe.probes import Look, Outcome, ProbeContext, outcome
from ..observe.sampler import Sampler, Survey
from ..observe.jobs.job import Job
from ..observe.snapshot import Snapshot, load, load_over_time, load_remote, save
from ..observe.window.window_stacks import WindowStacks, dump_times
from ..watch import look
from ..watch.job import WatchedJob
from . import load_rules
from .token import token

CAP_SYS_PTRACE = 19  # bit in /proc/<pid>/status CapEff


def missing_capability(target_uid: int, my_uid: int, cap_eff: int) -> str | None:
    """What stops us from reading a rank's environment, sockets and stacks, if anything:
    another user's process needs CAP_SYS_PTRACE (root has it)."""
    if target_uid == my_uid or cap_eff & (1 << CAP_SYS_PTRACE):
        return None
    return "CAP_SYS_PTRACE"


def _uid_and_caps(procfs: str, pid: int | str) -> tuple[int, int]:
    uid, caps = -1, 0
    with open(f"{procfs}/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                uid = int(line.split()[2])  # effective uid
            elif line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
    return uid, caps


def find_job(ctx: ProbeContext, survey: Survey, pid: int) -> Job:
    """The job of `pid`, from a survey of the node."""
    if not os.path.exists(f"{ctx.procfs}/{pid}"):
        raise errors.Unavailable(f"pid {pid}: no such process")
    try:
        target_uid, _ = _uid_and_caps(ctx.procfs, pid)
        my_uid, my_caps = _uid_and_caps(ctx.procfs, "self")
    except (OSError, ValueError, IndexError):
        target_uid = my_uid = my_caps = 0  # unreadable: the probes will say what they can
    missing = missing_capability(target_uid, my_uid, my_caps)
    if missing:
        raise errors.NoPermission(
            f"pid {pid} belongs to uid {target_uid}: reading its environment, sockets and "
            f"stacks needs {missing}; run as uid {target_uid} or as root (sudo)")
    info = survey.table.get(pid)
    if info is None:
        raise errors.Unavailable(f"pid {pid}: exited while being looked at")
    if not (info.python or discovery.is_launcher(info.cmdline)
            or pid in survey.live_record_pids):
        name = os.path.basename(info.cmdline[0]) if info.cmdline else "a kernel thread"
        raise errors.Unavailable(f"pid {pid} is {name}, not a Python process")
    return survey.job_of(pid)


def sample(sampler: Sampler, job: Job, closeness: Look = Look.STACKS,
           survey: Survey | None = None) -> Snapshot:
    """The node surveyed again (records advance; or `survey`, just taken) and
    the job looked at."""
    snap = sampler.sample(job, survey if survey is not None else sampler.survey(), closeness)
    if snap.processes is not None:
        denied = [p for p in snap.processes.procs if outcome(p.error) is Outcome.DENIED]
        if denied and denied[0].pid == job.target_pid:
            raise errors.NoPermission(
                f"pid {job.target_pid}: {denied[0].error}: run as the ranks' user or root "
                f"(reading another user's /proc needs CAP_SYS_PTRACE)")
    return snap


def collect(ctx: ProbeContext, pid: int, window_s: float, with_stacks: bool,
            syn_wait_s: float = 0.0, native: bool = False, rules=(),
            peers=lambda last: ()) -> tuple[object, tuple[Snapshot, ...], tuple[dict, ...]]:
    """(judgement, history, the peers' signals judged with): two samples
    `window_s` apart, the window's readings and stack dumps in the second
    (`_watched`), looked at as closely as the daemon looks when a person asks
    (`closest`). With `syn_wait_s`, a job whose ranks wait for peers on other
    nodes that should dial them is watched up to `syn_wait_s` longer for the
    peers' connection attempts, then sampled twice again. `native`: the
    samples' stacks with native frames (--native). `peers(last)`: the signals
    of the job's ranks on other nodes (main: the daemons of --peer, asked
    about `last`'s job)."""
    switch = StacksSwitch(with_stacks)
    # the capture watches the whole window (opened with the sampler)
    with Sampler(ctx, switch.enabled, options={"stacks": {"native": native}}) as sampler:
        job = find_job(ctx, sampler.survey(), pid)
        switch.refusal = switch.check(ctx, job)
        if _all_elsewhere(ctx.procfs, job):  # ranks on a namespace node: its wire
            sampler.probe("traffic").capture_net_of(ctx, pid)
        first = sample(sampler, job)
        second, survey = _watched(ctx, sampler, job, first.taken_at + window_s)
        if syn_wait_s > 0 and _waits_for_peers(second):
            _watch_connects(ctx, sampler, job, second, syn_wait_s)
            # judged over a window like any other, not over the wait
            first = sample(sampler, job)
            second, survey = _watched(ctx, sampler, job, first.taken_at + window_s)
        remote = peers(second)
        judgement, history = closest(sampler, survey, first, second,
                                     lambda h: classify.judge(h, rules, remote))
        refusal = switch.refusal or (stackless.refused_dump(history[-1]) if with_stacks
                                     else None)
        return stackless.mark(judgement, refusal), history, remote, refusal


class StacksSwitch:
    """Whether the stacks probe runs for the job being looked at: off when asked
    (--no-stacks) or when the kernel would refuse the attach (`check`); the
    sampler asks `enabled` at each look, so one sampler serves a node's jobs."""

    def __init__(self, wanted: bool):
        self.wanted, self.refusal = wanted, None

    def enabled(self, name: str) -> bool:
        return name != "stacks" or (self.wanted and self.refusal is None)

    def check(self, ctx: ProbeContext, job: Job) -> ptrace.Refusal | None:
        return ptrace.job_refusal(ctx.procfs, job.rank_pids) if self.wanted else None


def closest(sampler: Sampler, survey: Survey, first: Snapshot, second: Snapshot, judge):
    """(judgement, history): the daemon's one look at a job (watch/look.py), with
    stacks requested as a person's GET /status?stacks=1 requests them: `second`
    (read in detail over the window) judged, then looked at with stacks
    (sampler.look_closer, forced) and judged again. The history is `first` and
    that closest look."""
    watched = WatchedJob(discovery.job_key(first.job), first.taken_at)
    watched.window(first, None, math.inf)
    eyes = look.Eyes(
        sample=lambda _closeness: second,
        closer=lambda last, force: sampler.look_closer(last, survey, watched.stacks,
                                                       force_stacks=force),
        judge=judge)
    judgement, _ = look.look(watched, None, eyes, requested=True, gone=False,
                             now=second.taken_at, window_s=math.inf)
    return judgement, tuple(watched.history)


DUTY_INTERVAL_S = 0.05
# each reading's spacing is at random within +-50% of DUTY_INTERVAL_S, as the
# daemon's (observe/window/between.py jittered): a rank stopped 70 ms of every
# 100 ms was read at a fixed 50 ms in the stopped phase every time and called
# `stopped`, not a straggler (benchmarks/faults.yaml stop-resume, in the suite's
# quick run)


def _all_elsewhere(procfs: str, job: Job) -> bool:
    """No rank of the job shares our network namespace: watched from the host,
    they live on a namespace node, and our own wire shows nothing of theirs. A
    job with a rank here keeps our capture (this node's firewall drops a peer's
    connects on our wire)."""
    here = net_ns(procfs, "self")
    return bool(here) and all(net_ns(procfs, p) not in ("", here) for p in job.rank_pids)


def _watched(ctx: ProbeContext, sampler: Sampler, job: Job,
             deadline: float) -> tuple[Snapshot, Survey]:
    """The second sample, in detail, and the survey it was taken in (`watched`
    for one job)."""
    (second,), survey = watched(ctx, sampler, (job,), deadline)
    return second, survey


def watched(ctx: ProbeContext, sampler: Sampler, jobs, deadline: float,
            stacks=lambda job: True) -> tuple[tuple[Snapshot, ...], Survey]:
    """The second sample of each of `jobs`, in detail, and the survey they were
    taken in: the ranks' states read every DUTY_INTERVAL_S until `deadline`
    (observe/window/duty.py) and their stacks dumped in between
    (observe/window/window_stacks.py; only for the jobs `stacks(job)` allows):
    the window's evidence, not two points (`closest` adds the last stacks).
    All jobs share the one window: a node's jobs are judged together, not one
    after the other."""
    watches = [DutyWatch(job.rank_pids, ctx.clock, ctx.procfs) for job in jobs]
    dumps = [WindowStacks(ctx, job.rank_pids, dump_times(ctx.clock(), deadline)
                          if sampler.enabled("stacks") and stacks(job) else ())
             for job in jobs]
    for watch in watches:
        watch.read()
    try:
        while ctx.clock() < deadline:
            gap = jittered(DUTY_INTERVAL_S, random.random)
            time.sleep(min(gap, max(deadline - ctx.clock(), 0)))
            for watch in watches:
                watch.read()
    finally:
        middles = [d.stop() for d in dumps]
    survey = sampler.survey()
    return tuple(dataclasses.replace(sample(sampler, job, Look.DETAIL, survey),
                                     duty=watch.freeze(), window_stacks=middle)
                 for job, watch, middle in zip(jobs, watches, middles)), survey


def _waits_for_peers(snap: Snapshot) -> bool:
    """A rank of a multi-node job waits for peers on other nodes that should dial
    it, and this node would see their attempts dropped: the judge's own signal
    (judge/signals/state.py awaits_dialers), over the last sample alone."""
    return any(s.get("awaits_dialers") for s in signals.local((snap,)))


def _watch_connects(ctx, sampler: Sampler, job, second, wait_s: float) -> None:
    """Sample lean (/proc and the capture) until the peers' attempts show up as
    dropped, the peers connect, or `wait_s` ends."""
    print(f"ddpwatch diagnose: ranks wait for peers on other nodes; watching this node's "
          f"interfaces for their connection attempts (up to {wait_s:g} s, --syn-wait)",
          file=sys.stderr, flush=True)
    deadline, snap = ctx.clock() + wait_s, second
    while ctx.clock() < deadline and _waits_for_peers(snap):
        time.sleep(min(1.0, max(deadline - ctx.clock(), 0)))
        snap = sample(sampler, job, Look.DETAIL)  # lean: the capture's counts


def peer_signals(args, last: Snapshot) -> tuple[dict, ...]:
    """The job's ranks on other nodes, asked once of the daemons given with --peer
    (the daemon's peer view, for one judgement). A peer that does not answer is
    said on stderr; the judgement goes on without it."""
    if not args.peer:
        return ()
    from ..config import PEER_URL
    from ..observe.peers import PeerPoller
    for url in args.peer:
        if not PEER_URL.fullmatch(url):
            raise errors.UsageError(f"--peer {url!r} is not a daemon's base URL (http://HOST:PORT)")
    poller = PeerPoller(args.peer, token(args),
                        timeout_s=5.0, max_age_s=60.0)
    poller.poll_once()
    for state in poller.states():
        if state.error:
            print(f"ddpwatch diagnose: peer {state.url}: {state.error}; judged without it",
                  file=sys.stderr)
    return poller.remote_signals(discovery.job_key(last.job))


def main(args) -> int:
    token(args)  # a token on the command line is refused before anything is watched
    rules = load_rules("diagnose", args.rules)
    refusal, over = None, None
    if args.replay:
        history = load(args.replay)
        # the peers asked now, else those the saved judgement was made with
        remote = peer_signals(args, history[-1]) if args.peer else load_remote(args.replay)
        # and the job's past as the daemon's watch gave it (an incident bundle's
        # snapshots.json): judged by the rules of stage over-time as it was
        over = load_over_time(args.replay)
        judgement = classify.judge(history, rules, remote, over)
    else:
        if args.pid is None:
            raise errors.UsageError("give a pid, or --replay FILE")  # diagnose_node.main's
        ctx = ProbeContext(heartbeat_dir=args.dir)
        judgement, history, remote, refusal = collect(
            ctx, args.pid, args.window, not args.no_stacks, args.syn_wait, args.native, rules,
            lambda last: peer_signals(args, last))
    if args.save_snapshot:
        save(history, args.save_snapshot, remote, over)
    if args.json:
        print(json.dumps(job_json(judgement, history[-1], refusal), indent=2))
    else:
        print(printable_lines(job_text(judgement, history[-1], refusal)))
    return exit_code(judgement)


def job_json(judgement, last: Snapshot, refusal=None) -> dict:
    return dict(report.as_json(judgement, last), stacks=stackless.as_json(refusal))


def job_text(judgement, last: Snapshot, refusal=None) -> str:
    text = report.as_text(judgement, last)
    return text if refusal is None else f"{text}\n\n{refusal.line()}"


def exit_code(judgement) -> int:
    return errors.OK if judgement.job.verdict in FINE and not any(
        f.severity != "info" for r in judgement.ranks for f in r.findings) else errors.PROBLEM_FOUND
