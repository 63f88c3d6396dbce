"""WatchedJob: everything the daemon remembers of one job between ticks
(docs/design.md "Per-job state in one place"; as Prometheus gives each scrape
target a scrapeLoop of its own).

    snapshots of the window -> (classify, pure) -> this window's judgement
    its pauses and spells of slowness (watch/pauses.py, watch/slow.py) -> signals
        over time (watch/overtime.py) -> (classify.again: the same rules) -> what is paged

The daemon keeps them in one map (`WatchedJobs`), feeds each its job every tick,
and forgets a job that is gone with one call (`WatchedJobs.forget`): everything
kept of a job while it is watched lives here or is reached only through here
(its readings between ticks, its departures, its standing toward an incident,
its label's grant). What outlives a job (its incident, open until calm, then
resolved; the post-mortem of a terminal job gone before its last rank ended) is
owned by publish/incidents.py `IncidentBook` and observe/jobs/departures.py
`Departures`; tests/unit/watch/test_forget_unit.py holds both."""
from __future__ import annotations

import collections
import collections.abc
import dataclasses
import re
from dataclasses import dataclass

from ..judge.classify import JobVerdict, again
from ..observe.jobs.departures import Ends
from ..observe.sampler import KeptStacks
from ..observe.window.between import BetweenTicks, JobReadings
from ..publish.incidents import Standing
from ..publish.label_budget import Grant
from ..observe.window.duty import merge as merge_duties
from . import overtime
from .look import suspicious
from .pauses import Pause, PauseTracker
from .slow import Slow, SlowTracker
from .timebook import TimeBook

# the label of a job known by its pid only (discovery.job_key's fallback)
ANONYMOUS = re.compile(r"pid\d+")


@dataclass(frozen=True)
class OverTime:
    """The job's judgement over time, as this tick leaves it: what /status, the
    metrics and the incident page show beside the verdict."""
    pause: Pause | None                       # in progress (a hang once over its bound)
    time: dict                                # rank -> state -> seconds since watched
    recent: dict                              # the same over the last 10 minutes
    timeline: tuple[tuple[float, str, str], ...]  # (wall, job verdict, pause kind)
    pauses: tuple                             # ended pauses (watch/pauses.Ended)
    note: str                                 # what the pauses cost, in words
    totals: dict = dataclasses.field(default_factory=dict)  # (rank, state, kind) -> s
    hour: dict = dataclasses.field(default_factory=dict)    # rank -> state -> s, last hour
    slow: Slow | None = None                  # a spell of slowness in progress
    # the signals over time given to this tick's ranks (RankVerdict.key -> signals):
    # what an incident bundle keeps, so that a replay judges what was judged
    signals: dict = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Looked:
    """The job's last look (watch/look.py), which its steady ticks keep (`steady`)."""
    judgement: object   # classify's, before over time (which each tick applies anew)
    last: object        # the snapshot it judged
    at: float           # when (the daemon's clock)
    job: object         # the Job looked at: its ranks, launcher and departures


def rank_numbers(before: dict[int, int], ranks) -> dict[int, int]:
    """pid -> rank of this tick's local ranks, a number once known kept for its
    pid: a rank that is ending can be judged once more with its number unknown
    (its environment unreadable as it exits), and its death was then paged as
    "rank -1" (benchmarks/faults.yaml interrupt/torchrun, once in a run of
    2026-11-29). A process's rank does not change while it lives."""
    return {r.pid: r.rank if r.rank >= 0 else before.get(r.pid, -1)
            for r in ranks if not r.remote}


class WatchedJob:
    def __init__(self, key: str, first_seen: float, readings: JobReadings | None = None):
        self.key = key
        self.readings = readings   # read between ticks (observe/window/between.py)
        self.ends = Ends()         # its ranks' ends (observe/jobs/departures.py)
        self.incident = Standing()  # toward its incident (publish/incidents.py)
        self.grant = Grant()       # its label's value (publish/label_budget.py)
        self.first_seen = first_seen
        self.history: collections.deque = collections.deque()
        self._duties: collections.deque = collections.deque()
        self.verdict: str | None = None       # last tick's job verdict
        self.view = None                       # last tick's JobView
        self.pauses = PauseTracker()
        self.slow = SlowTracker()
        self.time = TimeBook()
        self._started: frozenset = frozenset()  # rank pids a judgement saw past their start
        self.label = ""            # what people call it (see `name`)
        self.run_id = ""           # what its other nodes call it (see `name`)
        self.alive_at: float | None = None  # boot-time seconds its ranks were last seen
        self.worked = False        # judged healthy on some tick (publish/limits.py too_young)
        self.shown = False         # a look saw a record or socket of a rank (limits.shows_a_job)
        self.stacks = KeptStacks()  # its last stack dump (observe/sampler.py look_closer)
        self.logged = "none"       # the verdict the journal last told (publish/journal.py)
        self.looked: Looked | None = None  # the last look, kept by steady ticks
        self.progress: dict = {}   # rank pid -> (collective seq, step) at the last tick

    def steady(self, job, progress: dict, calm: bool, now: float, steady_s: float) -> bool:
        """Whether this tick may keep the last look's judgement rather than look
        again (docs/architecture.md "Steady jobs"): the job was judged healthy,
        nothing in it worth a stack dump (look.suspicious: a young job's rank
        starved as a straggler would be), no pause or spell of slowness open
        (`unsettled`), less than `steady_s` ago, its processes are those looked at, every rank's
        record moved on since the last tick (`progress`: pid -> (collective seq,
        step) of its live record) and the readings since that look saw every
        rank and none stopped (`calm`: observe/window/between.py). A hang stops
        its rank's record, a death or a new rank changes the job, a stop shows in
        the readings: each makes the next tick look. What only a look sees (a
        rank slower than its peers, starved, throttled) waits `steady_s` at most,
        records that move by their writer's will no longer: they are the job
        owner's, and only ever make a look wait that long."""
        looked = self.looked
        if (steady_s <= 0 or looked is None or not calm or not job.rank_pids
                or now - looked.at >= steady_s or self.verdict != "healthy"
                or looked.judgement.job.verdict != "healthy" or looked.job != job
                or suspicious(looked.judgement, looked.at - self.first_seen)
                or self.unsettled()):
            return False
        before = self.progress
        for pid in job.rank_pids:
            moved, was = progress.get(pid), before.get(pid)
            # on, not back: a record gone back is another writer's (a rank
            # restarted under that pid), not progress
            if moved is None or was is None or moved <= was:
                return False
        return True

    def name(self, label: str, run_id: str = "") -> str:
        """The label the job is known by, kept once it came from its run id: a job
        whose ranks are ending (torchrun's agent alone a tick before it exits) has
        no run id left to read, and its page must carry the name its status had
        (tests/thirdparty/test_thirdparty_killed.py). A job's first ticks, before its ranks
        are read, have only its pid ("pid123"): the run id replaces that. `run_id`
        (the label before this node told its jobs sharing one apart) is kept alike."""
        self.label = _kept(self.label, label)
        self.run_id = _kept(self.run_id, run_id or label)
        return self.label

    def window(self, snap, duty, window_s: float):
        """(first, last) snapshots of the judging window, `snap` added; the last
        carries the readings taken between the window's first snapshot and now
        (observe/window/between.py), so what is kept (bundles) replays as judged."""
        history = self.history
        ranks = set(snap.job.rank_pids)
        if ranks and ranks <= self._started:
            snap = dataclasses.replace(snap, seen_training=True)
        history.append(snap)
        while len(history) > 2 and snap.taken_at - history[1].taken_at >= window_s:
            history.popleft()
        duties = self._duties
        duties.append((snap.taken_at, duty))
        while len(duties) > 1 and duties[0][0] <= history[0].taken_at:
            duties.popleft()
        merged = merge_duties([d for _, d in duties])
        if merged is not None:
            history[-1] = dataclasses.replace(snap, duty=merged)
        return history[0], history[-1]

    def replace_last(self, snap) -> None:
        self.history[-1] = snap

    def unsettled(self) -> bool:
        """A pause or a spell of slowness is in progress (as the last tick left
        them): each is judged by the share of its ticks that saw it, so every
        one of its ticks must look (a kept healthy look would count as a calm
        tick again and again: a straggler slow in half its windows never
        confirmed)."""
        over = self.view.over_time if self.view is not None else None
        return over is None or over.pause is not None or over.slow is not None

    def over_time(self, judgement, now: float, wall: float, config, rules):
        """(the judgement to publish and page, OverTime): this window's judgement
        with the job's past given to its ranks as signals (watch/overtime.py)
        and judged again by the same `rules` (classify.again): a pause past what
        is normal for this job is the hang it became, a rank slow for a few
        seconds is not yet a straggler."""
        # a job's start, once over, is over for these ranks (a look with stacks saw
        # a backward pass): the lean looks between say nothing of it. New ranks (a
        # launcher's restart) start again.
        local = [r for r in judgement.ranks if not r.remote]
        if local and any(r.signals.get("job_starting") is False for r in local):
            self._started = frozenset(r.pid for r in local)
        pause = self.pauses.update(judgement, now, wall, floor_s=config.pause_floor_s,
                                   factor=config.pause_factor,
                                   timeout_s=config.collective_timeout_s)
        slow = self.slow.update(judgement, now, config.straggler_after_s)
        given = overtime.signals(judgement, pause, slow)
        judged = again(judgement, rules, given)
        note = "; ".join(filter(None, (self.pauses.summary(wall), self.time.idle_note(wall))))
        if pause is not None:
            judged = dataclasses.replace(judged, job=_with_pause(judged.job, pause, note))
        # the timeline names the pause's kind where the job is judged paused (or the
        # pause became the hang): a pause in its end grace is healthy training again
        shown = pause is not None and (judged.job.verdict == "paused" or pause.over)
        self.time.add(judged, now, wall, pause.kind if shown else "")
        self.verdict = judged.job.verdict
        # the rank of a rank that ends next, from whatever evidence named it
        self.ends.ranks = rank_numbers(self.ends.ranks, judged.ranks)
        return judged, OverTime(pause, self.time.by_rank(), self.time.recent(wall),
                                tuple(self.time.timeline), tuple(self.pauses.ended), note,
                                dict(self.time.totals), self.time.recent(wall, 3600.0), slow,
                                given)


class WatchedJobs(collections.abc.Mapping):
    """The daemon's one map of its jobs: owner key -> WatchedJob. A job is
    watched from the first `of` and forgotten with one call, `forget`."""

    def __init__(self, clock, reader: BetweenTicks):
        self.clock, self.reader = clock, reader
        self._jobs: dict[str, WatchedJob] = {}
        self.ends = _EndsOf(self)  # Departures' view of them

    def __getitem__(self, key: str) -> WatchedJob:
        return self._jobs[key]

    def __iter__(self):
        return iter(list(self._jobs))

    def __len__(self) -> int:
        return len(self._jobs)

    def of(self, key: str) -> WatchedJob:
        """The job `key`, watched from now on if it was not."""
        watched = self._jobs.get(key)
        if watched is None:
            watched = self._jobs[key] = WatchedJob(key, self.clock(), self.reader.open())
        return watched

    def forget(self, keys) -> None:
        """The jobs `keys` are no longer watched: all that was kept of them goes
        with their WatchedJob, and the reader stops reading them."""
        for key in keys:
            watched = self._jobs.pop(key, None)
            if watched is not None and watched.readings is not None:
                self.reader.close(watched.readings)

    def standings(self, keys) -> dict[str, Standing]:
        return {key: self._jobs[key].incident for key in keys}


class _EndsOf(collections.abc.Mapping):
    """The watched jobs' Ends by owner key, as observe/jobs/departures.py reads
    and keeps them; `setdefault` watches a job it holds."""

    def __init__(self, jobs: WatchedJobs):
        self._jobs = jobs

    def __getitem__(self, key: str) -> Ends:
        return self._jobs[key].ends

    def __iter__(self):
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def setdefault(self, key: str, default: Ends | None = None) -> Ends:
        if key in self._jobs:
            return self._jobs[key].ends
        watched = self._jobs.of(key)
        if default is not None:
            watched.ends = default
        return watched.ends


def _kept(known: str, new: str) -> str:
    return new if not known or (ANONYMOUS.fullmatch(known) and not ANONYMOUS.fullmatch(new)) \
        else known


def _with_pause(job: JobVerdict, pause: Pause, note: str) -> JobVerdict:
    """The job's summary says what the pause is, how long it may last, and what the
    job's pauses cost."""
    cost = f" This job's pauses: {note}." if note else ""
    if job.verdict == "paused":
        summary = (f"rank {pause.rank} {pause.doing()} while its peers wait: a "
                   f"pause ({pause.kind}), {pause.elapsed_s:.0f}s so far; paged past "
                   f"{pause.bound_s:.0f}s ({pause.why()}).{cost} Remedy: nothing while it is "
                   f"short; if the others wait long or often, do the work on every rank, less "
                   f"often, or asynchronously.")
        return dataclasses.replace(job, summary=summary)
    if job.verdict == "hung_outside_collective" and pause.over:
        return dataclasses.replace(job, summary=job.summary + cost)
    return job
