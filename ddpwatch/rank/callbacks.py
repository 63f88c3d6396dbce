"""Python callbacks that torch runs on a backend's own thread (Gloo's worker).

ddpwatch learns that async work or a DDP gradient bucket completed from a
callback on the work's future (`Future.then`). torch runs that callback on the
thread that completed the work, which is not a Python thread, and two things
follow:

* pybind11 creates a Python thread state for each call and deletes it after: a
  malloc, a 16 KiB mmap for the frame stack and its munmap, whose TLB shootdown
  interrupts the rank's other threads (strace: 2 mmap + 2 munmap per step of
  the bundled trainer, one per gradient bucket). `keep_thread_state()` keeps the
  thread's state for the thread's life instead.
* The thread takes the GIL once more to release the callback, after the waiter
  was already woken. A script that exits right then (its last collective
  waited on, then the end of the file) is finalizing when that thread asks for
  the GIL, and CPython ends the thread inside C++: the rank aborts with
  "terminate called without an active exception" (torch 2.13; 6 runs in 10 of
  tests/jobs/exit_after_async.py before ddpwatch took care). The same happens
  when the thread destroys a Work whose tensor has a Python object, a sync
  collective's too. At exit, `wait_for_release()` lets those threads finish
  first.

Imports no torch.
"""
from __future__ import annotations

import threading
import time
import weakref

from ..heartbeat.native import hotpath

_kept_threads: set = set()


def keep_thread_state_by_ctypes():
    """keep_thread_state() where the C module was not built."""
    # A reused thread id skips its new thread: a lost saving, never a fault.
    ident = threading.get_ident()
    if ident not in _kept_threads:
        _kept_threads.add(ident)
        try:
            import ctypes
            ctypes.pythonapi.PyGILState_Ensure()  # never released: the state stays
        except Exception:  # no ctypes here: callbacks still work, only slower
            pass


def _keeper():
    return getattr(hotpath(), "keep_thread_state", None) or keep_thread_state_by_ctypes


keep_thread_state = _keeper()

# How long exit hands the GIL to backend threads, whatever they wait for: a sync
# collective's Work is out of ddpwatch's reach (its wrapper only sees None).
EXIT_YIELD_S = 0.01

# Weak references to callbacks that ran and that torch has not released yet.
# Set operations are atomic under the GIL, which every caller holds.
_ran_not_released: set = set()


def completion_callback(fn):
    """`fn(future)` made fit for `Future.then`: it keeps the calling thread's
    state, and exit waits for torch to release it once it has run."""
    def callback(future):
        keep_thread_state()
        _ran_not_released.add(ref)
        return fn(future)
    # Fires while torch releases `callback` (the closure still holds `ref` then).
    ref = weakref.ref(callback, _ran_not_released.discard)
    hash(ref)  # now, while `callback` lives: a dead referent's ref cannot be hashed
    return callback


def wait_for_release(timeout_s: float = 1.0) -> None:
    """At exit, before the interpreter finalizes: let backend threads finish
    what they need the GIL for. First a short yield, for a thread destroying a
    Work that the caller already dropped (a sync collective's: torch drops it
    right after the wait); then until torch released every callback that ran
    (at most `timeout_s`; callbacks whose work never completed do not count)."""
    deadline = time.monotonic() + timeout_s
    time.sleep(EXIT_YIELD_S)
    while _ran_not_released and time.monotonic() < deadline:
        time.sleep(0.001)  # lets the backend's thread take the GIL and release them
