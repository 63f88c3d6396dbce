"""Where a job's time goes (docs/judgement-over-time.md "Where the time goes"):
per rank, seconds computing, inside collectives, waiting for a peer, paused (by
kind), stalled, from each tick's verdicts, accumulated since the daemon began
watching the job (counters, /metrics) and per minute over the last hour (the
incident page's bars, and "rank 1 idled 38% of the last 10 min").

A tick's time is given to the state each rank was judged in. A rank that
advances is split between computing and collectives by its heartbeat's share of
step time in collectives (hb_comm_share); without heartbeats its time is
counted as computing (no measurement says more). The job's verdicts over time
are kept too (the timeline: the pauses before a stall)."""
from __future__ import annotations

import collections

from ..judge.vocabulary import VERDICTS
from .pauses import works_in

STATES = ("computing", "collective", "waiting", "paused", "stalled", "starting", "unknown")
# rank verdict -> state: each verdict's `time` (judge/vocabulary.py; paused splits
# by role below, slowing counts as what it would be)
_BY_VERDICT = {v.name: v.time for v in VERDICTS}
MAX_GAP_S = 10.0        # a tick later than this after the last (the daemon was busy or
                        # stopped) counts only this much: no reading says what happened
MINUTES = 60            # per-minute buckets kept (the last hour)
MAX_RANKS = 256         # ranks accounted per job (records are a user's claim)
MAX_TIMELINE = 512      # verdict changes kept


class TimeBook:
    def __init__(self):
        self.totals: dict[tuple[int, str, str], float] = collections.defaultdict(float)
        # (minute since epoch) -> {(rank, state): seconds}
        self.minutes: collections.OrderedDict[int, dict] = collections.OrderedDict()
        self.timeline: collections.deque[tuple[float, str, str]] = collections.deque(
            maxlen=MAX_TIMELINE)  # (wall, job verdict, pause kind or "")
        self._last: float | None = None

    def add(self, judgement, now: float, wall: float, pause_kind: str = "") -> None:
        dt = 0.0 if self._last is None else min(MAX_GAP_S, max(0.0, now - self._last))
        self._last = now
        verdict = judgement.job.verdict
        if not self.timeline or self.timeline[-1][1:] != (verdict, pause_kind):
            self.timeline.append((round(wall, 1), verdict, pause_kind))
        if dt <= 0:
            return
        minute = int(wall // 60)
        bucket = self.minutes.setdefault(minute, collections.defaultdict(float))
        while len(self.minutes) > MINUTES:
            self.minutes.popitem(last=False)
        for r in judgement.ranks[:MAX_RANKS]:
            for state, kind, share in split(r):
                seconds = dt * share
                self.totals[(r.rank, state, kind)] += seconds
                bucket[(r.rank, state)] += seconds

    def by_rank(self) -> dict[int, dict[str, float]]:
        """rank -> state -> seconds since watched (pause kinds summed)."""
        out: dict[int, dict[str, float]] = collections.defaultdict(dict)
        for (rank, state, _), seconds in self.totals.items():
            out[rank][state] = round(out[rank].get(state, 0.0) + seconds, 1)
        return dict(out)

    def recent(self, wall: float, span_s: float = 600.0) -> dict[int, dict[str, float]]:
        """rank -> state -> seconds over the last `span_s` (whole minutes)."""
        first = int((wall - span_s) // 60)
        out: dict[int, dict[str, float]] = collections.defaultdict(dict)
        for minute, bucket in self.minutes.items():
            if minute > first:
                for (rank, state), seconds in bucket.items():
                    out[rank][state] = out[rank].get(state, 0.0) + seconds
        return dict(out)

    def idle_note(self, wall: float, span_s: float = 600.0) -> str:
        """"rank 1 waited 38% of the last 10 min" for ranks that waited a tenth or more."""
        notes = []
        for rank, states in sorted(self.recent(wall, span_s).items()):
            total = sum(states.values())
            waited = states.get("waiting", 0.0)
            if total > 0 and waited / total >= 0.1:
                span = min(span_s, total)
                notes.append(f"rank {rank} waited {waited / total:.0%} of the last "
                             + (f"{span / 60:.0f} min" if span >= 60 else f"{span:.0f}s"))
        return "; ".join(notes)


def split(r) -> list[tuple[str, str, float]]:
    """(state, pause kind, share) of one rank's verdict for one tick."""
    if r.verdict == "slowing":  # its time is what it would be as a straggler or victim
        return [(_BY_VERDICT.get(str(r.signals.get("slow_as")), "computing"), "", 1.0)]
    if r.verdict == "paused":
        kind = works_in(r)
        return [("paused", kind, 1.0)] if kind else [("waiting", "", 1.0)]
    state = _BY_VERDICT.get(r.verdict, "unknown")
    share = r.signals.get("hb_comm_share")
    if state == "computing" and isinstance(share, (int, float)) and 0 <= share <= 1:
        return [("computing", "", 1.0 - share), ("collective", "", float(share))]
    return [(state, "", 1.0)]
