"""Completion of async collectives (`async_op=True`), recorded without waiting.

A Work's future calls back when the work completes. Where a backend's Work has
no future (field report: Gloo's `Work::getFuture not implemented`; on torch
2.13, Gloo's isend/irecv and reduce_scatter_tensor), the Work is wrapped so
completion is recorded when the caller waits on it or finds it completed.
The future's callback runs on the backend's thread (callbacks.py says what
that takes). Imports no torch: it only calls what the Work objects offer.
"""
from __future__ import annotations

import collections
import threading

from .callbacks import completion_callback

# Works of async collectives (and DDP's bucket all-reduces), each dropped by a
# later call once complete, so on the training thread, or at exit on the main
# one. Why: a Work holds its tensors, and a tensor made in Python has a Python
# object. Were Gloo's worker thread the last to hold the Work, destroying it
# there needs the GIL, and at interpreter exit that ends the thread inside C++:
# the rank aborts, "terminate called without an active exception" (torch 2.13;
# also without ddpwatch: 2-4 runs in 10 of tests/jobs/exit_after_async.py, which
# drops each Work right after waiting on it; benchmarks/exit_aborts.py).
# The price: a Work's tensors may live until a later call or step drops it.
_held: collections.deque = collections.deque()
_HELD_SWEEP = 64  # past this many, drop every completed one, not only the oldest


def hold(work) -> None:
    """Keep `work` referenced here until a later call finds it completed."""
    prune(keep=0)
    _held.append(work)


def prune(keep: int = 1) -> None:
    """Drop the held Works found completed, but the newest `keep`. Each step
    prunes too, so a run of steps without async ops holds one Work at most; that
    one stays, as the script may be about to exit right after it."""
    global _held
    held = _held
    try:
        while len(held) > keep and held[0].is_completed():
            held.popleft()
        if len(held) >= _HELD_SWEEP:  # an old one never completes: do not grow with it
            _held = collections.deque(w for w in held if not w.is_completed())
    except Exception:  # another thread's call pruned meanwhile: never raise into training
        pass


def when_done(result, done):
    """Call `done()` once when the async `result` (a Work, or a list of them)
    completes; returns what the caller should get back instead of `result`.
    Raises only before anything was attached (so the caller may then call
    `done()` itself, once)."""
    if isinstance(result, list):
        works = [w for w in result if w is not None]
        if not works:
            done()
            return result
        remaining = [len(works)]
        lock = threading.Lock()

        def one_done():
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                done()
        return [_watch(w, one_done) for w in works]
    if not hasattr(result, "wait"):
        done()
        return result
    return _watch(result, done)


def _watch(work, done):
    hold(work)
    try:
        future = work.get_future()
        future.then(completion_callback(lambda _fut: call_quietly(done)))
    except Exception:  # this backend's Work has no future (RuntimeError)
        return WaitRecordingWork(work, done)
    return work


def call_quietly(fn):
    try:
        fn()
    except Exception:
        pass


class WaitRecordingWork:
    """A Work whose completion is recorded when waited on or found complete."""

    def __init__(self, work, done):
        self._work = work
        self._done = done
        self._recorded = False

    def _record(self):
        if not self._recorded:
            self._recorded = True
            call_quietly(self._done)

    def wait(self, *args, **kwargs):
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._record()

    def is_completed(self):
        completed = self._work.is_completed()
        if completed:
            self._record()
        return completed

    def __getattr__(self, name):
        return getattr(self._work, name)
