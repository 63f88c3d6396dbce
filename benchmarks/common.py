"""What the benchmark scripts share."""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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


def tagged_pids(var: str, tag: str) -> list[int]:
    """Every process now running with `var=tag` in its environment: torchrun starts
    each worker in a session of its own, and a worker whose agent died is
    re-parented; the tag finds them all (tests/conftest.py does the same)."""
    needle = f"{var}={tag}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        out.append(int(entry))
            except OSError:
                continue
    return out


class Receiver:
    """A generic webhook receiver on loopback (or `host`: the bridge address that
    namespace nodes reach, benchmarks/faultbench/nodes.py): every message kept
    with its arrival time (monotonic)."""

    def __init__(self, host: str = "127.0.0.1"):
        self.messages: list[tuple[float, dict]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    receiver.messages.append((time.monotonic(), json.loads(body or b"{}")))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def firing(self, job: str | None = None, since: float = 0.0) -> list[tuple[float, dict]]:
        """The firing messages (of `job`'s key, if given) that arrived at `since` or later."""
        with self.lock:
            return [(t, m) for t, m in self.messages if t >= since
                    and m.get("status") == "firing" and (job is None or m.get("job") == job)]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
