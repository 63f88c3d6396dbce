"""What the benchmark scripts share."""
from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on loopback now (for a job's store or a daemon)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
