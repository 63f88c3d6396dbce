"""asyncwork and callbacks: pure bookkeeping, with stand-in Works (the real ones
run in test_instrumentation.py's jobs)."""
from __future__ import annotations

import gc

import pytest

from ddpwatch.rank import asyncwork, callbacks


class FakeWork:
    def __init__(self, completed=False):
        self.completed = completed

    def is_completed(self):
        return self.completed


@pytest.fixture(autouse=True)
def empty_hold(monkeypatch):
    monkeypatch.setattr(asyncwork, "_held", asyncwork.collections.deque())


def test_a_held_work_is_dropped_by_a_later_call_once_complete():
    first, second = FakeWork(), FakeWork()
    asyncwork.hold(first)
    asyncwork.hold(second)
    assert list(asyncwork._held) == [first, second]
    first.completed = True
    third = FakeWork()
    asyncwork.hold(third)
    assert list(asyncwork._held) == [second, third]


def test_a_work_that_never_completes_does_not_make_the_hold_grow():
    stuck = FakeWork()
    asyncwork.hold(stuck)
    for _ in range(500):
        asyncwork.hold(FakeWork(completed=True))
    assert len(asyncwork._held) <= asyncwork._HELD_SWEEP + 1
    assert asyncwork._held[0] is stuck


def test_hold_never_raises():
    class Broken(FakeWork):
        def is_completed(self):
            raise RuntimeError("backend gone")
    asyncwork.hold(Broken())
    work = FakeWork()
    asyncwork.hold(work)
    assert asyncwork._held[-1] is work


# A callback released without having run must go quietly too (no "Exception ignored").
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_exit_waits_only_for_callbacks_that_ran_until_torch_releases_them():
    calls = []
    ran = callbacks.completion_callback(lambda fut: calls.append(fut) or "value")
    never_ran = callbacks.completion_callback(lambda fut: None)
    assert ran("future") == "value" and calls == ["future"]
    assert len(callbacks._ran_not_released) == 1
    del never_ran
    del ran  # what torch does once the callback ran: releases it
    gc.collect()
    assert callbacks._ran_not_released == set()
    callbacks.wait_for_release(timeout_s=0.5)  # returns at once


def test_exit_gives_up_on_a_callback_never_released():
    held_by_torch = callbacks.completion_callback(lambda fut: None)
    held_by_torch(None)
    try:
        callbacks.wait_for_release(timeout_s=0.05)  # returns after its deadline
        assert len(callbacks._ran_not_released) == 1
    finally:
        del held_by_torch
    assert callbacks._ran_not_released == set()


def test_the_ctypes_keeper_runs_once_per_thread():
    callbacks.keep_thread_state_by_ctypes()
    callbacks.keep_thread_state_by_ctypes()
    assert len(callbacks._kept_threads) >= 1


def test_a_step_drops_completed_works_but_the_newest():
    works = [FakeWork(completed=True) for _ in range(3)]
    for work in works:
        asyncwork.hold(work)
    asyncwork.prune()  # what each step does
    assert list(asyncwork._held) == works[-1:]
    asyncwork.prune()
    assert list(asyncwork._held) == works[-1:]
