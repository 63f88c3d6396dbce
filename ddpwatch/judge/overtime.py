"""Judgement over time: when a pause stops being one. Pure.

The classifier (classify.py) judges one window: a rank working outside the
collectives while its peers wait is `paused` (rules paused-working,
waits-for-paused-peer), whatever it does and however long. Whether that is still
normal depends on the job's past, which the daemon's per-job watch keeps
(watch/pauses.py) and hands here as a `Pause`: how long this pause has lasted,
and how long this job's earlier pauses at the same place lasted.

A pause becomes a hang, its working rank the culprit and its waiting peers the
victims, once it has lasted past its bound:
    bound = min(max(floor, factor x the longest earlier pause at that site),
                the collective timeout less a margin)
The floor (minutes by default: a big model's checkpoint takes minutes) keeps a
job with no history quiet; the learned part keeps a job whose evaluation
normally takes 10 minutes quiet for 10 minutes; the timeout part pages before
Gloo's 30 min (NCCL's 10) would kill the job and its evidence with it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .classify import Judgement, RankVerdict, job_verdict
from .pausekind import describe

# What kills a job whose ranks wait too long: torch's default timeouts per backend
DEFAULT_TIMEOUT_S = {"nccl": 600.0, "gloo": 1800.0}
TIMEOUT_MARGIN = 0.2      # page this share of the timeout before it (at least 60 s)
MIN_MARGIN_S = 60.0


@dataclass(frozen=True)
class Pause:
    """A pause in progress, as the job's watch has followed it."""
    rank: int
    pid: int
    kind: str              # judge/pausekind.KINDS
    site: str              # pause_site ("" when no stack named one)
    elapsed_s: float       # since it began (the peers' wait, when heartbeats say more)
    earlier: tuple[float, ...]  # this job's earlier pauses at `site`, seconds
    floor_s: float
    factor: float
    timeout_s: float       # the collective timeout that would end the job
    backend: str           # what the timeout is of ("gloo", "nccl", "" unknown)

    @property
    def learned_s(self) -> float:
        return self.factor * max(self.earlier) if self.earlier else 0.0

    @property
    def margin_s(self) -> float:
        return max(MIN_MARGIN_S, TIMEOUT_MARGIN * self.timeout_s)

    @property
    def bound_s(self) -> float:
        return min(max(self.floor_s, self.learned_s),
                   max(0.0, self.timeout_s - self.margin_s))

    @property
    def left_s(self) -> float:
        """Before the collective timeout ends the job."""
        return max(0.0, self.timeout_s - self.elapsed_s)

    @property
    def over(self) -> bool:
        return self.elapsed_s > self.bound_s

    def why(self) -> str:
        """What the bound is made of, for evidence."""
        if self.earlier:
            lo, hi = min(self.earlier), max(self.earlier)
            past = (f"its {len(self.earlier)} earlier pause(s) there lasted "
                    + (f"{hi:.1f}s" if hi - lo < 0.05 else f"{lo:.1f}-{hi:.1f}s"))
        else:
            past = "no earlier pause of this job ran there"
        return (f"{past}; bound {self.bound_s:.0f}s (floor {self.floor_s:.0f}s, "
                f"{self.factor:g}x the longest earlier there; {self.timeout_s:.0f}s "
                f"{self.backend or 'collective'} timeout)")


def timeout_for(backend: str, configured_s: float = 0.0) -> float:
    """The collective timeout the job runs under: the config's, else torch's
    default for its backend (Gloo's when unknown: a CPU job without heartbeats)."""
    if configured_s > 0:
        return configured_s
    return DEFAULT_TIMEOUT_S.get((backend or "").lower(), DEFAULT_TIMEOUT_S["gloo"])


# torch.compile while a peer waits: the classifier calls both ranks warming_up
# (rules compiling-while-peers-wait, waits-for-compiling-peer), unbounded. Over
# time it is a pause of kind compile like any other (a recompile mid-run: a new
# shape on one rank), learned per site and paged past its bound: a compile that
# never ends is a hang. Both compiling at once is nobody waiting: warming_up.
COMPILING, WAITS_FOR_COMPILE = "compiling-while-peers-wait", "waits-for-compiling-peer"


def compile_as_pause(judgement: Judgement) -> Judgement:
    """`judgement` with a rank compiling while its peers wait `paused` (kind
    compile, signal pausing) and its waiting peers `paused` too."""
    if not any(r.rule == COMPILING and not r.remote for r in judgement.ranks):
        return judgement
    ranks = []
    for r in judgement.ranks:
        if r.rule == COMPILING and not r.remote:
            ranks.append(dataclasses.replace(
                r, verdict="paused", rule="paused-compiling",
                evidence=r.evidence + ": a pause (compile), paged only past what is normal "
                                      "for this job",
                signals={**r.signals, "pausing": True, "pause_kind": "compile"}))
        elif r.rule == WAITS_FOR_COMPILE:
            ranks.append(dataclasses.replace(r, verdict="paused",
                                             rule="waits-for-compiling-peer"))
        else:
            ranks.append(r)
    return dataclasses.replace(judgement, ranks=tuple(ranks), job=job_verdict(ranks))


def escalate(judgement: Judgement, pause: Pause | None) -> Judgement:
    """`judgement` with a pause past its bound turned into the hang it has become:
    the pausing rank the culprit (hung_outside_collective, rule pause-past-bound),
    the ranks waiting for it victims (blocked_in_collective, rule
    waits-past-pause-bound). Unchanged otherwise."""
    if pause is None or not pause.over:
        return judgement
    ranks = []
    for r in judgement.ranks:
        if r.verdict != "paused":
            ranks.append(r)
        elif r.pid == pause.pid and not r.remote:
            ranks.append(_culprit(r, pause))
        else:
            ranks.append(_victim(r, pause))
    return dataclasses.replace(judgement, ranks=tuple(ranks), job=job_verdict(ranks))


def _culprit(r: RankVerdict, p: Pause) -> RankVerdict:
    where = f" at {p.site}" if p.site else ""
    doing = describe(p.kind) if p.kind != "unknown" else "works outside the collectives"
    near = (f"; the {p.backend or 'collective'} timeout ({p.timeout_s:.0f}s) ends the job in "
            f"about {p.left_s:.0f}s" if p.elapsed_s >= p.timeout_s - p.margin_s else "")
    evidence = (f"{doing}{where} for {p.elapsed_s:.0f}s while its peers wait in a collective, "
                f"longer than is normal for this job: {p.why()}{near}"
                + (f" (CPU {r.signals['cpu_ratio']:.0%})"
                   if isinstance(r.signals.get("cpu_ratio"), float) else ""))
    remedy = (f"See what it does: `py-spy dump --pid {r.pid}`. If it loops or waits on "
              f"something that never comes, fix that and restart; if this work really takes "
              f"so long, raise pause_floor_s (or the job's collective timeout) so that it "
              f"is not paged, or move it off the critical path (every rank evaluates, "
              f"asynchronous checkpoints).")
    return dataclasses.replace(r, verdict="hung_outside_collective", role="culprit",
                               rule="pause-past-bound", confidence=0.75, evidence=evidence,
                               remedy=remedy)


def _victim(r: RankVerdict, p: Pause) -> RankVerdict:
    return dataclasses.replace(
        r, verdict="blocked_in_collective", role="victim", rule="waits-past-pause-bound",
        confidence=0.75,
        evidence=f"waits in a collective for rank {p.rank}, which has worked outside the "
                 f"collectives for {p.elapsed_s:.0f}s, past its bound ({p.bound_s:.0f}s)",
        remedy="Nothing to fix on this rank: see the culprit.")


# --- a straggler is slow over many steps ------------------------------------
# The classifier judges one window of a few seconds: a rank that computes while
# its peers wait, or whose threads waited for a CPU, is a straggler there. Over a
# few seconds that is normal training on a busy host (a start-up beside other
# jobs, one rank's batch taking longer); a straggler is one that stays slow. The
# job's watch (watch/slow.py) follows how long its ranks have been slow; until
# that passes straggler_after_s the slow ranks are `slowing`, calm.
SLOW = frozenset({"straggler", "waiting_on_peer"})
SLOW_SHARE = 0.5   # slow in at least this share of the ticks since it began


@dataclass(frozen=True)
class Slow:
    """A spell of slowness in progress, as the job's watch has followed it."""
    elapsed_s: float   # since the first slow tick of the spell
    share: float       # of the spell's ticks judged slow
    after_s: float     # straggler_after_s
    # each rank's last slow verdict in the spell and the seconds since, for the
    # ranks slow within GAP_S (watch/slow.py): what a confirmed spell holds
    held: tuple[tuple[RankVerdict, float], ...] = ()

    @property
    def confirmed(self) -> bool:
        return self.elapsed_s >= self.after_s and self.share >= SLOW_SHARE


def hold_slow(judgement: Judgement, slow: Slow | None) -> Judgement:
    """`judgement` with its stragglers and their waiting peers `slowing` (calm,
    role none) while their spell is shorter than straggler_after_s, the verdict
    they would have in signals `slow_as`. Once the spell is confirmed, a rank
    judged healthy in this window keeps the slow verdict it had within the
    spell's gap: the windows of a rank held to a fraction of a core alternate
    slow and healthy, and the page must not flip with them (one spell, as
    watch/slow.py counts it; tests/nodes/test_two_nodes.py asks six ticks in a
    row of a quota-throttled rank on another node)."""
    if slow is None:
        return judgement
    if slow.confirmed:
        return _held(judgement, slow)
    if not any(r.verdict in SLOW for r in judgement.ranks):
        return judgement
    ranks = tuple(_slowing(r, slow) if r.verdict in SLOW else r for r in judgement.ranks)
    return dataclasses.replace(judgement, ranks=ranks, job=job_verdict(ranks))


def rank_key(r: RankVerdict) -> tuple:
    """A rank of the judgement, whichever node it is on (pids repeat across nodes)."""
    return r.remote, r.host, r.pid


def _held(judgement: Judgement, slow: Slow) -> Judgement:
    then = {rank_key(r): (r, age) for r, age in slow.held}
    if not any(r.verdict == "healthy" and rank_key(r) in then for r in judgement.ranks):
        return judgement
    ranks = tuple(_still_slow(r, *then[rank_key(r)])
                  if r.verdict == "healthy" and rank_key(r) in then else r
                  for r in judgement.ranks)
    return dataclasses.replace(judgement, ranks=ranks, job=job_verdict(ranks))


def _still_slow(now: RankVerdict, then: RankVerdict, age_s: float) -> RankVerdict:
    """`now` (healthy in this window) as the slow rank it was `age_s` ago; its
    signals and findings are this window's."""
    return dataclasses.replace(
        now, verdict=then.verdict, role=then.role, rule=then.rule,
        confidence=then.confidence, remedy=then.remedy,
        evidence=f"{then.evidence} ({age_s:.0f}s ago; this window alone looked like its "
                 f"peers', as the windows of a slow rank alternate)",
        signals={**now.signals, "slow_as": then.verdict, "slow_rule": then.rule,
                 "slow_seen_s": age_s})


def _slowing(r: RankVerdict, s: Slow) -> RankVerdict:
    what = "falls behind its peers" if r.verdict == "straggler" else "waits for a slower peer"
    evidence = (f"{what} for {s.elapsed_s:.0f}s so far ({s.share:.0%} of the readings): "
                f"{r.evidence}; a {r.verdict.replace('_', ' ')} once it lasts "
                f"{s.after_s:.0f}s (straggler_after_s)")
    return dataclasses.replace(
        r, verdict="slowing", role="none", rule="slowing-briefly", confidence=r.confidence,
        evidence=evidence,
        remedy="Nothing to do while it is brief: a busy host or one long batch slows a "
               "rank for a few seconds; if it lasts, it is named a straggler.",
        signals={**r.signals, "slow_as": r.verdict, "slow_rule": r.rule})
