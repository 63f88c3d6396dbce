"""Ports and waits the benchmark shares (benchmarks/common.py has the same two;
this package is imported as `faultbench` from benchmarks/ and from the tests)."""
from __future__ import annotations

import socket
import time


class NotReached(RuntimeError):
    """A state the benchmark waited for never came: the scenario's injection or its
    job is wrong, and it must fail loudly, not be scored."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, tail=None, interval: float = 0.2):
    """Poll `predicate` until truthy (returned); NotReached naming `what` (and the
    tail of `tail()`, a log) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    said = f"\n{tail()[-2000:]}" if tail else ""
    raise NotReached(f"timed out after {timeout:.0f}s waiting for {what}{said}")
