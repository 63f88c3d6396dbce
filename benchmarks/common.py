"""What the benchmark scripts share."""
from __future__ import annotations

import socket
import time


def free_port() -> int:
    """A TCP port free on loopback now (for a job's store or a daemon)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    """Poll `predicate` until it returns a truthy value (returned); TimeoutError
    naming `what` once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
