"""A job's pauses over time: the one in progress, and how long its earlier ones
lasted at each place (learned per call site, so a job whose evaluation takes 4 s
is paged when one takes 40 s, and one whose checkpoint takes 3 min is not paged
at 2 min). The rules decide with what this keeps: watch/overtime.py gives the
pause's age and bound to the ranks in it as signals (rules pause-past-bound,
waits-past-pause-bound).

A pause begins on the first tick a rank is judged to work in one (`works_in`:
judged paused while it is pausing, or compiling while its peers wait) and ends
once no rank has been for END_GRACE_S: a tick judged from CPU alone (no fresh
stack) may miss a pause that goes on. Its kind and site follow what the stacks
say it does now. States: idle -> pausing -> idle (the length learned).

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

import collections
from dataclasses import dataclass

from ..judge.pausekind import describe

# What kills a job whose ranks wait too long: torch's default timeouts per backend
DEFAULT_TIMEOUT_S = {"nccl": 600.0, "gloo": 1800.0}
TIMEOUT_MARGIN = 0.2      # page this share of the timeout before it (at least 60 s)
MIN_MARGIN_S = 60.0
END_GRACE_S = 5.0   # not seen pausing this long: the pause ended
MAX_SITES = 64      # call sites learned per job (a user's code decides how many there are)
MAX_PER_SITE = 32   # lengths kept per site
MAX_LOG = 256       # ended pauses kept for evidence and the timeline


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
    def near_timeout(self) -> bool:
        """Within the timeout's margin: the page says how long is left."""
        return self.elapsed_s >= self.timeout_s - self.margin_s

    @property
    def over(self) -> bool:
        return self.elapsed_s > self.bound_s

    def doing(self) -> str:
        """What the working rank does and where, for evidence."""
        doing = describe(self.kind) if self.kind != "unknown" else "works outside the collectives"
        return doing + (f" at {self.site}" if self.site else "")

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


def works_in(r) -> str | None:
    """The kind of pause a rank judged `paused` works in, None for a rank that
    waits for it (or is not paused). Pausing (judge/signals/peers.py
    link_pauses: rules paused-working, paused-for-data), or compiling outside the
    collectives while its peers wait (rule compiling-while-peers-wait: the
    compiler's frames on its stack are its work; link_pauses leaves it out so
    that rule, not paused-working, names it)."""
    if r.verdict != "paused":
        return None
    s = r.signals
    if s.get("stack") == "compile" and not s.get("in_collective") and not s.get("pausing"):
        return "compile"
    if s.get("pausing"):
        return str(s.get("pause_kind") or "unknown")
    return None


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
        """Follow this tick's judgement (this window's, before the signals over
        time); the pause in progress, if any, with what is known of its site."""
        pausing = sorted((r for r in judgement.ranks if works_in(r) and not r.remote),
                         key=lambda r: r.rank)
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
            kind, site = works_in(r), r.signals.get("pause_site") or ""
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
