"""Completion of async collectives (`async_op=True`), recorded without waiting.

A Work's future calls back when the work completes. Where a backend's Work has
no future (field report: Gloo's `Work::getFuture not implemented`; on torch
2.13, Gloo's isend/irecv and reduce_scatter_tensor), the Work is wrapped so
completion is recorded when the caller waits on it or finds it completed.
Imports no torch: it only calls what the Work objects offer.
"""
from __future__ import annotations

import threading


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
    try:
        future = work.get_future()
        future.then(lambda _fut: call_quietly(done))
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
