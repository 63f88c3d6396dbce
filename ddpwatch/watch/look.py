"""How closely one tick looks at one job: lean, then detail, then stacks.

    glance (a healthy job: its /proc and records)       -> judged healthy: done
      -> detail (sockets, traffic, the node's view)     -> judged again
        -> stacks on suspicion or on request (py-spy)   -> judged again

A healthy job costs its ranks nothing but a glance; a job that was not healthy
last tick (or is asked about) starts at detail; py-spy, which stops a rank for
milliseconds, runs only when a judgement is suspicious (sampler.look_closer
rate-limits it per job). Each step replaces the window's last snapshot
(WatchedJob.window), so what is judged, published and bundled is the closest
look taken. The daemon calls `look` once per job per tick (watch/judging.py `Judging.job`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from ..judge import vocabulary
from ..observe.probes import Look

# A job no rule can judge yet in its first seconds is starting (importing torch,
# meeting at rendezvous): py-spy would only show that, at a CPU cost the ranks
# pay. Problems at start-up have verdicts of their own (sockets are still read).
STARTUP_GRACE_S = 10.0


@dataclass(frozen=True)
class Eyes:
    """What one look at one job may use, bound by the caller to its job."""
    sample: Callable       # Look -> Snapshot: the job surveyed this closely
    closer: Callable       # (Snapshot, force_stacks: bool) -> Snapshot with stacks
    judge: Callable        # (first, last) -> JobJudgement


def look(watched, snap_duty, eyes: Eyes, *, requested: bool, gone: bool, now: float,
         window_s: float):
    """(judgement, the window's last snapshot as judged). `snap_duty`: the ranks'
    states read since the last tick (observe/window/between.py); `requested`: a person
    asked for stacks (GET /status?stacks=1); `gone`: a job held after its ranks
    ended, with no process left to look closer at."""
    detailed = watched.verdict != "healthy" or requested
    first, last = watched.window(eyes.sample(Look.DETAIL if detailed else Look.GLANCE),
                                 snap_duty, window_s)
    judgement = eyes.judge((first, last))
    if not detailed and judgement.job.verdict != "healthy":
        # Something changed since the last tick: look again, in detail.
        last = dataclasses.replace(eyes.sample(Look.DETAIL), duty=last.duty)
        watched.replace_last(last)
        judgement = eyes.judge((first, last))
    if (suspicious(judgement, now - watched.first_seen) or requested) and not gone:
        last = eyes.closer(last, requested)
        watched.replace_last(last)
        judgement = eyes.judge((first, last))
    return judgement, last


def suspicious(judgement, age_s: float) -> bool:
    """Worth a stack dump: a verdict that is not fine, or a young job's rank
    starved of CPU as a straggler would be (its stacks say whether the job trains
    yet: judge/signals/window.py slow_while_starting). A job no rule can judge
    ("unknown") is worth it only past its start-up grace."""
    if judgement.job.verdict == "unknown":
        return age_s >= STARTUP_GRACE_S
    return judgement.job.verdict not in vocabulary.FINE or any(
        r.signals.get("slow_while_starting") for r in judgement.ranks)
