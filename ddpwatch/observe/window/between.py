"""The daemon's window evidence: its jobs' ranks read between ticks.

`diagnose` reads every thread of every rank each 50 ms over its window
(observe/window/duty.py); the daemon watches for days within 1% of a core, so it reads
as closely as a job deserves: the ranks' main threads a few times a second while
the job is healthy (enough to see a rank stopped most of the time, or a cgroup
throttling it), every thread ten times a second while it is under suspicion.
Each tick takes (`JobReadings.take`) what was read since the last one and starts a new window; the
cgroup's cpu.stat is read once per tick, not per reading. The readings go on in a
thread of their own (`start`), during ticks too: on a crowded node a tick takes
most of its second, and readings only between ticks were two or three a window.

The readings are spaced at random within +-50% of the interval: a rank stopped
and resumed with the period of the readings would otherwise be read in the same
phase every time (all stopped, or never).
"""
from __future__ import annotations

import random
import threading

from .duty import Duty, DutyWatch

GLANCE_INTERVAL_S = 0.25  # healthy jobs: main threads, ~8 readings per 2 s window
CLOSE_INTERVAL_S = 0.1    # jobs under suspicion: every thread
JITTER = 0.5


def jittered(interval: float, rand) -> float:
    """`interval` moved at random within +-JITTER of itself: readings at a fixed
    spacing alias with a rank stopped and resumed at a multiple of it (a fixed
    50 ms read a 100 ms stop/resume cycle in its stopped phase every time)."""
    return interval * (1 - JITTER + 2 * JITTER * rand())


class JobReadings:
    """One job's readings between ticks: a DutyWatch over its current window and
    how closely to read it. Its WatchedJob holds it (watch/job.py); the reader
    (`BetweenTicks`) holds it only while the job is watched, to read it in its
    thread. `take`, `calm` and `watch` are called by the daemon's thread."""

    def __init__(self, reader: "BetweenTicks"):
        self._reader = reader
        self.duty: DutyWatch | None = None
        self.closely = False
        self.due: float | None = None

    def take(self, pids: tuple[int, ...]) -> Duty | None:
        """What was read of the job since the last take (None: nothing, or its
        ranks changed), and a new window from now."""
        r = self._reader
        with r.lock:
            watch, duty, cgroups = self.duty, None, None
            if watch is not None and watch.pids == pids and watch.readings:
                duty = watch.freeze()
            if watch is not None:  # the end of this window begins the next
                cgroups = watch.handed_on()
            self.duty = DutyWatch(pids, r.clock, r.procfs, r.cgroot, cgroups)
            if self.due is None:
                self.due = r.clock()
            return duty

    def calm(self, pids: tuple[int, ...]) -> bool:
        """Whether the readings since the last `take` saw each of `pids` (the
        job's ranks, as that window began) and none of them stopped: what lets
        a tick keep a steady job's last judgement (watch/job.py `steady`). No
        readings (switched off, or the thread starved) is no evidence: False."""
        with self._reader.lock:
            watch = self.duty
            if watch is None or watch.pids != pids:
                return False
            return all(c[0] > 0 and c[1] == 0 for c in watch.counts.values())

    def watch(self, closely: bool) -> None:
        """Read the job's every thread at the close rate from now on, or its main
        threads at the glance rate."""
        with self._reader.lock:
            if self.duty is None:
                return
            if closely and not self.closely:
                self.due = self._reader.clock()  # suspicion: read now, not a glance later
            self.closely = closely


class BetweenTicks:
    """The reader of the watched jobs' JobReadings, in a thread of its own. It
    keeps no job of its own: `open` gives a job its readings (its WatchedJob
    keeps them), `close` ends them when the job is forgotten."""

    def __init__(self, clock, procfs: str = "/proc", cgroot: str = "/sys/fs/cgroup",
                 rand=random.random, glance_s: float = GLANCE_INTERVAL_S):
        """`glance_s`: the glance interval (config reading_s); 0 reads nothing."""
        self.clock, self.procfs, self.cgroot, self.rand = clock, procfs, cgroot, rand
        self.glance_s = glance_s
        self.jobs: list[JobReadings] = []  # the watched jobs' readings, read in turn
        self.readings = 0  # passes over a job's ranks since start (for the benchmark)
        self.lock = threading.Lock()  # the reading thread against the tick's calls
        self._thread: threading.Thread | None = None
        self.failures = 0  # failed passes of the reading thread

    def open(self) -> JobReadings:
        """A newly watched job's readings (nothing read until its first `take`)."""
        job = JobReadings(self)
        with self.lock:
            self.jobs.append(job)
        return job

    def close(self, job: JobReadings) -> None:
        """The job is no longer watched: nothing of it is read or kept here."""
        with self.lock:
            if job in self.jobs:
                self.jobs.remove(job)
            job.duty = None

    def read_due(self) -> float:
        """Read the jobs whose reading is due; the time the next one is."""
        with self.lock:
            now = self.clock()
            for job in self.jobs:
                if job.duty is None:
                    continue
                if (job.due if job.due is not None else now) <= now:
                    closely = job.closely
                    job.duty.read(threads=closely)
                    self.readings += 1
                    interval = min(CLOSE_INTERVAL_S, self.glance_s) if closely else self.glance_s
                    job.due = now + jittered(interval, self.rand)
            return min((j.due for j in self.jobs if j.duty is not None and j.due is not None),
                       default=now + self.glance_s)

    def start(self, stop: threading.Event, on_error) -> None:
        """Read in a thread of its own until `stop` (once; later calls do nothing).
        A failed pass is counted (`failures`) and `on_error()` called (in the
        reading thread: it must only log); the thread goes on."""
        if self._thread is not None:
            return

        def loop():
            while not stop.is_set():
                try:
                    self.wait(float("inf"), stop)
                except Exception:  # the loop never dies: the next pass may do
                    self.failures += 1
                    on_error()
                    stop.wait(1.0)
        self._thread = threading.Thread(target=loop, name="ddpwatch-readings", daemon=True)
        self._thread.start()

    def wait(self, deadline: float, stop: threading.Event) -> None:
        """Until `deadline` (the next tick) or `stop`, read what is due."""
        while not stop.is_set():
            if self.glance_s <= 0:  # switched off (reading_s: 0): no evidence between ticks
                stop.wait(max(0.0, deadline - self.clock()))
                return
            next_at = self.read_due()
            now = self.clock()
            if now >= deadline:
                return
            stop.wait(max(0.0, min(deadline, next_at) - now))
