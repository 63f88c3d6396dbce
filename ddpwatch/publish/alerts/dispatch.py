"""Background delivery: the daemon's tick calls `submit()` and moves on.

One lane per sink: a bounded FIFO and one worker thread, so a receiver that hangs
delays only its own alerts, and firing-before-resolved holds per sink because a
lane sends in order. When a lane is full the pending alert of the LEAST SEVERE
verdict goes (judge/vocabulary.py SEVERITY), the oldest of those (the newest
says the most about now: a resolved beats the firing it follows); the new alert
itself when nothing pending is less severe. A flood of alerts of lesser
verdicts never pushes out a graver one (tests/hostile/test_floods.py).

A failed attempt is retried with exponential backoff and full jitter (AWS
Architecture Blog, "Exponential Backoff And Jitter": uniform(0, min(cap, base*2^n))),
or after the receiver's Retry-After on 429/503, capped at max_delay_s so no
receiver parks a worker for longer. Sinks declaring `resend_s` get their open
(firing) incidents re-sent that often while the lane is idle (alertmanager.py).

Lifecycle of an alert in a lane: pending -> in flight -> sent | failed (gave up),
or pending -> dropped (overflow), or left undelivered when close() runs out of time.
"""
from __future__ import annotations

import collections
import logging
import math
import random
import threading
import time

from ...judge.vocabulary import SEVERITY
from .base import Alert, DeliveryError

log = logging.getLogger("ddpwatch.publish.alerts")
COUNTERS = ("sent", "failed", "retried", "dropped")


def drop_index(pending, new: Alert) -> int:
    """Which alert a full lane drops: an index into `pending`, or len(pending)
    for `new` itself. The least severe verdict (an unknown one least of all),
    and of those the oldest; `new` is the newest."""
    alerts = list(pending) + [new]

    def rank(i: int) -> tuple[int, int]:
        verdict = alerts[i].verdict
        return (SEVERITY.index(verdict) if verdict in SEVERITY else len(SEVERITY), -i)
    return max(range(len(alerts)), key=rank)


def backoff_delay(attempt: int, base_s: float, cap_s: float, uniform=random.uniform) -> float:
    """Wait before retry number `attempt` + 1 (attempt 0 = after the first failure)."""
    return uniform(0.0, min(cap_s, base_s * 2 ** attempt))


class _Lane:
    """One sink's queue, worker and counters; everything mutable is under `cond`."""

    def __init__(self, sink, size: int):
        self.sink, self.size = sink, size
        self.queue: collections.deque[Alert] = collections.deque()
        self.cond = threading.Condition()
        self.inflight: Alert | None = None
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.resend_s = float(getattr(sink, "resend_s", 0) or 0)
        self.open: dict[str, Alert] = {}  # incident_id -> latest firing alert (resend)
        self.next_resend = math.inf
        self.thread: threading.Thread | None = None


class Dispatcher:
    def __init__(self, sinks, *, queue_size: int = 100, max_attempts: int = 8,
                 base_delay_s: float = 0.5, max_delay_s: float = 60.0,
                 clock=time.monotonic, sleep=None):
        """`sleep` replaces backoff waits in tests; by default a wait is cut short by
        close(), so SIGTERM never waits out a 60 s backoff."""
        if queue_size < 1 or max_attempts < 1:
            raise ValueError("queue_size and max_attempts must be >= 1")
        names = [s.name for s in sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"sink names must be unique (they key stats): {names}")
        self.max_attempts, self.base_delay_s, self.max_delay_s = max_attempts, base_delay_s, max_delay_s
        self._clock, self._sleep = clock, sleep
        self._closing = threading.Event()
        self._deadline = math.inf
        self._lanes = [_Lane(s, queue_size) for s in sinks]
        for lane in self._lanes:
            lane.thread = threading.Thread(target=self._run, args=(lane,), daemon=True,
                                           name=f"ddpwatch-alerts-{lane.sink.name}")
            lane.thread.start()

    # --- the daemon's side: never blocks ----------------------------------------------
    def submit(self, alert: Alert) -> bool:
        """Queue `alert` for every sink. False if anything was dropped to make room
        (or the dispatcher is closed and the alert itself was dropped)."""
        closed, dropped = self._closing.is_set(), []
        for lane in self._lanes:
            with lane.cond:
                if closed:
                    lane.counts["dropped"] += 1
                    continue
                if len(lane.queue) >= lane.size:
                    lane.counts["dropped"] += 1
                    at = drop_index(lane.queue, alert)
                    if at == len(lane.queue):
                        dropped.append((lane.sink.name, alert))
                        continue
                    dropped.append((lane.sink.name, lane.queue[at]))
                    del lane.queue[at]
                lane.queue.append(alert)
                lane.cond.notify()
        for name, old in dropped:  # log outside the locks
            log.warning("alerts to %s: queue full, dropped the least severe (%s %s %s)",
                        name, old.status, old.verdict, old.incident_id)
        return not closed and not dropped

    def close(self, timeout_s: float) -> int:
        """Deliver what is pending for at most `timeout_s`, then stop the workers.
        Returns how many alerts were left undelivered (queued or still in flight)."""
        self._deadline = self._clock() + max(0.0, timeout_s)
        self._closing.set()  # after the deadline is set: workers read both
        for lane in self._lanes:
            with lane.cond:
                lane.cond.notify_all()
        end = time.monotonic() + max(0.0, timeout_s)
        for lane in self._lanes:
            lane.thread.join(max(0.0, end - time.monotonic()))
        left = sum(s["pending"] for s in self.stats().values())
        if left:
            log.warning("alerts: %d undelivered at shutdown", left)
        return left

    def stats(self) -> dict[str, dict[str, int]]:
        out = {}
        for lane in self._lanes:
            with lane.cond:
                out[lane.sink.name] = dict(
                    lane.counts, pending=len(lane.queue) + (lane.inflight is not None))
        return out

    # --- the worker's side ------------------------------------------------------------
    def _run(self, lane: _Lane) -> None:
        while True:
            job = self._next(lane)
            if job is None:
                return
            alerts, resend = job
            for alert in alerts:
                if not self._deliver(lane, alert, tracked=not resend):
                    return  # close() deadline passed
                with lane.cond:
                    if resend and lane.queue:
                        break  # fresh events first; the rest wait for the next round

    def _next(self, lane: _Lane):
        """Block until there is work: ([alert], False) from the queue, (open alerts,
        True) when a resend is due, or None when closing is over for this lane."""
        with lane.cond:
            while True:
                if lane.queue:
                    if self._closing.is_set() and self._clock() >= self._deadline:
                        return None
                    alert = lane.inflight = lane.queue.popleft()
                    self._remember(lane, alert)
                    return [alert], False
                if self._closing.is_set():
                    return None
                now = self._clock()
                if lane.open and now >= lane.next_resend:
                    lane.next_resend = now + lane.resend_s
                    return list(lane.open.values()), True
                lane.cond.wait(None if not lane.open else max(0.0, lane.next_resend - now))

    def _remember(self, lane: _Lane, alert: Alert) -> None:
        if lane.resend_s <= 0:
            return
        if alert.firing:
            if not lane.open:
                lane.next_resend = self._clock() + lane.resend_s
            lane.open[alert.incident_id] = alert
        else:
            lane.open.pop(alert.incident_id, None)

    def _deliver(self, lane: _Lane, alert: Alert, tracked: bool) -> bool:
        """Attempt until sent or given up (True), or False if close() ran out of time."""
        attempt = 0
        while True:
            try:
                lane.sink.send(alert)
                self._finish(lane, "sent", tracked)
                return True
            except DeliveryError as err:
                failure = err
            except Exception as err:  # a bug in one flavour must not kill its worker
                log.exception("alerts to %s: sink raised", lane.sink.name)
                failure = DeliveryError(f"{type(err).__name__}: {err}", retryable=False)
            attempt += 1
            if not failure.retryable or attempt >= self.max_attempts:
                log.warning("alerts to %s: gave up on %s %s after %d attempt(s): %s",
                            lane.sink.name, alert.status, alert.incident_id, attempt, failure)
                self._finish(lane, "failed", tracked)
                return True
            delay = (backoff_delay(attempt - 1, self.base_delay_s, self.max_delay_s)
                     if failure.retry_after is None else min(failure.retry_after, self.max_delay_s))
            log.debug("alerts to %s: attempt %d failed (%s); retry in %.2fs",
                      lane.sink.name, attempt, failure, delay)
            with lane.cond:
                lane.counts["retried"] += 1
            if not self._pause(delay):
                return False

    def _finish(self, lane: _Lane, outcome: str, tracked: bool) -> None:
        with lane.cond:
            lane.counts[outcome] += 1
            if tracked:
                lane.inflight = None

    def _pause(self, delay: float) -> bool:
        """Wait `delay` before a retry; False if close()'s deadline has passed. Once
        closing, retries go at once: the daemon is leaving, each attempt is bounded
        by the sink's timeout, and max_attempts still bounds the count."""
        if not self._closing.is_set():
            if self._sleep is not None:
                self._sleep(delay)
            else:
                self._closing.wait(delay)  # returns early when close() starts
        return not self._closing.is_set() or self._clock() < self._deadline
