"""A job's pauses over time: the one in progress, and how long its earlier ones
lasted at each place (learned per call site, so a job whose evaluation takes 4 s
is paged when one takes 40 s, and one whose checkpoint takes 3 min is not paged
at 2 min). judge/overtime.py decides with what this keeps.

A pause begins on the first tick a rank is judged pausing (signal `pausing`:
busy outside the collectives while a peer waits) and ends once no rank has been
pausing for END_GRACE_S: a tick judged from CPU alone (no fresh stack) may miss a
pause that goes on. Its kind and site follow what the stacks say it does now. States: idle -> pausing -> idle (the length learned)."""
from __future__ import annotations

import collections
from dataclasses import dataclass

from ..judge.overtime import Pause, timeout_for

END_GRACE_S = 5.0   # not seen pausing this long: the pause ended
MAX_SITES = 64      # call sites learned per job (a user's code decides how many there are)
MAX_PER_SITE = 32   # lengths kept per site
MAX_LOG = 256       # ended pauses kept for evidence and the timeline


@dataclass(frozen=True)
class Ended:
    rank: int
    kind: str
    site: str
    started_wall: float
    length_s: float


class _Current:
    def __init__(self, rank: int, pid: int, now: float, wall: float, waited_s: float):
        self.rank, self.pid = rank, pid
        self.started, self.wall = now - waited_s, wall - waited_s
        self.last_seen = now
        self.kind, self.site = "unknown", ""


class PauseTracker:
    def __init__(self):
        self._current: _Current | None = None
        self._learned: collections.OrderedDict[str, collections.deque] = \
            collections.OrderedDict()
        self.ended: collections.deque[Ended] = collections.deque(maxlen=MAX_LOG)

    def update(self, judgement, now: float, wall: float, *, floor_s: float, factor: float,
               timeout_s: float = 0.0) -> Pause | None:
        """Follow this tick's judgement (before judge/overtime.py); the pause in
        progress, if any, with what is known of its site."""
        pausing = sorted((r for r in judgement.ranks
                          if r.verdict == "paused" and r.signals.get("pausing")
                          and not r.remote), key=lambda r: r.rank)
        cur = self._current
        if pausing:
            r = pausing[0]
            if cur is None or cur.pid != r.pid:
                if cur is not None:
                    self._end(cur)
                # the waiting peers' heartbeats say how long they have waited
                waited = max([float(o.signals.get("hb_inside_s") or 0.0)
                              for o in judgement.ranks if o.pid != r.pid] + [0.0])
                cur = self._current = _Current(r.rank, r.pid, now, wall, waited)
            cur.last_seen = now
            # the pause is what it does now: rank 0 of a nanoGPT loop evaluates, then
            # saves, in one pause (tests/daemon/test_soak.py's checkpoint job); its length
            # is learned at the place it ended
            kind, site = r.signals.get("pause_kind"), r.signals.get("pause_site") or ""
            if kind and kind != "unknown":
                cur.kind, cur.site = kind, site or cur.site
            elif not cur.site and site:
                cur.site = site
        elif cur is not None and now - cur.last_seen >= END_GRACE_S:
            self._end(cur)
            cur = self._current = None
        if cur is None:
            return None
        backend = _backend(judgement)
        return Pause(rank=cur.rank, pid=cur.pid, kind=cur.kind, site=cur.site,
                     elapsed_s=round(now - cur.started, 1),
                     earlier=tuple(self._learned.get(cur.site, ())) if cur.site else (),
                     floor_s=floor_s, factor=factor,
                     timeout_s=timeout_for(backend, timeout_s), backend=backend or "gloo")

    def _end(self, cur: _Current) -> None:
        length = round(cur.last_seen - cur.started, 1)
        self.ended.append(Ended(cur.rank, cur.kind, cur.site, cur.wall, length))
        if not cur.site:
            return
        lengths = self._learned.pop(cur.site, None) or collections.deque(maxlen=MAX_PER_SITE)
        lengths.append(length)
        self._learned[cur.site] = lengths  # most recently used last
        while len(self._learned) > MAX_SITES:
            self._learned.popitem(last=False)

    def summary(self, now_wall: float, span_s: float = 600.0) -> str:
        """What the job's pauses cost, for people: "rank 0 evaluation every ~40s for
        ~4.5s (12 in the last 10 min)"."""
        recent = [e for e in self.ended if now_wall - e.started_wall <= span_s]
        groups: dict[tuple, list[Ended]] = collections.defaultdict(list)
        for e in recent:
            groups[(e.rank, e.kind, e.site)].append(e)
        parts = []
        for (rank, kind, site), items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            mean = sum(e.length_s for e in items) / len(items)
            starts = sorted(e.started_wall for e in items)
            every = (f" every ~{(starts[-1] - starts[0]) / (len(starts) - 1):.0f}s"
                     if len(starts) > 1 else "")
            where = f" at {site}" if site else ""
            parts.append(f"rank {rank} {kind}{where}{every} for ~{mean:.1f}s "
                         f"({len(items)} in the last {span_s / 60:.0f} min)")
        return "; ".join(parts)


def _backend(judgement) -> str:
    for r in judgement.ranks:
        backend = r.signals.get("hb_backend")
        if isinstance(backend, str) and backend:
            return backend
    return ""
