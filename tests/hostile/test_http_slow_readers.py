"""Slow readers: clients with a 1 KB receive window asking for large answers once
held every worker of the HTTP server (/metrics answered 503 for seconds at a
time). Now a worker only computes an answer; the accepting thread sends it as
the client reads, and cuts it past its deadline or below the minimum byte rate
(publish/bounded_server.py). Pure parts, the server alone over real sockets, and an
unprivileged user (uid 65534) against a real daemon watching a real job."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from http.server import BaseHTTPRequestHandler

from attacker import (need_root, no_traceback, keeps_ticking, python_as_nobody,
                      refused_counts)
from conftest import wait_until
from daemons import DaemonRun, get, our_status, rank_pid, trainer_job

from ddpwatch.publish import bounded_server
from ddpwatch.publish.bounded_server import BoundedServer, request_class, too_slow


def test_request_class_by_path():
    assert request_class(b"GET /metrics HTTP/1.0\r\n\r\n") == "light"
    assert request_class(b"GET /readyz?x=1 HTTP/1.1\r\nHost: a\r\n\r\n") == "light"
    assert request_class(b"GET /healthz HTTP/1.0\n\n") == "light"
    for head in (b"GET /status HTTP/1.0\r\n\r\n", b"GET /metrics/x HTTP/1.0\r\n\r\n",
                 b"GET /incidents/a HTTP/1.0\r\n\r\n", b"garbage\r\n\r\n", b"\r\n\r\n",
                 b"GET /\xff HTTP/1.0\r\n\r\n"):
        assert request_class(head) == "heavy", head


def test_too_slow_by_deadline_and_rate():
    grace = bounded_server.GRACE_S
    assert not too_slow(0, grace, 20.0, 1000.0)              # within the grace: never
    assert too_slow(0, grace + 0.1, 20.0, 1000.0)            # nothing sent after it
    assert not too_slow(1000, grace + 1.0, 20.0, 1000.0)     # exactly the rate
    assert too_slow(999, grace + 1.0, 20.0, 1000.0)
    assert too_slow(10**9, 20.1, 20.0, 1000.0)               # fast, but past the deadline


BIG = 4 * 2**20  # an answer no socket buffer holds


class BigHandler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"m\n" if self.path == "/metrics" else b"x" * BIG
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def slow_client(port: int, path: str) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # before connect: the window
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    return s


def closed_by_server(s: socket.socket) -> bool:
    """Whether the server ended the connection, without reading from it (which
    would make the client a reader): its TCP state is no longer ESTABLISHED
    (TCP_INFO's first byte; 1 is TCP_ESTABLISHED in linux/tcp_states.h)."""
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != 1


def test_non_reading_clients_hold_no_worker_and_are_cut_by_rate():
    server = BoundedServer("127.0.0.1", 0, BigHandler, workers=4, light_workers=1,
                           response_deadline_s=8.0, min_bytes_per_s=256 * 1024, max_writers=64)
    server.start()
    try:
        clients = []
        for n in range(1, 13):  # 4x the heavy workers, each answered before the next asks
            clients.append(slow_client(server.port, "/big"))
            wait_until(lambda: len(server._writing) + server.stats["slow_reader"] == n, 5,
                       what=f"answer {n} being sent")
        for _ in range(5):  # heavy and light both answered while the 12 do not read
            started = time.monotonic()
            s = slow_client(server.port, "/metrics")
            s.settimeout(5)
            assert s.recv(100).startswith(b"HTTP/1.0 200"), "metrics not answered"
            s.close()
            assert time.monotonic() - started < 1.0
        reader = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        reader.sendall(b"GET /big HTTP/1.0\r\n\r\n")
        got = b""
        while chunk := reader.recv(1 << 20):
            got += chunk
        assert got.endswith(b"x" * 1000) and len(got) > BIG  # a reading client gets it all
        # the non-readers are cut once behind the rate after the grace, not at the deadline
        started = time.monotonic()
        wait_until(lambda: all(closed_by_server(c) for c in clients), 5,
                   what="the non-reading clients cut")
        assert time.monotonic() - started < 5
        assert server.stats["slow_reader"] >= 12 and server.stats["busy_503"] == 0
    finally:
        server.stop()


def test_writers_beyond_the_cap_cut_the_oldest_of_their_class_only():
    server = BoundedServer("127.0.0.1", 0, BigHandler, workers=4, light_workers=1,
                           response_deadline_s=30.0, min_bytes_per_s=1.0, max_writers=3)
    server.start()
    try:
        clients = []
        for n in range(1, 6):
            clients.append(slow_client(server.port, "/big"))
            wait_until(lambda: len(server._writing) + server.stats["writers_full"] == n, 5,
                       what=f"answer {n} being sent")
        wait_until(lambda: server.stats["writers_full"] == 2, 10, what="two cut for room")
        assert closed_by_server(clients[0]) and closed_by_server(clients[1])
        assert not any(closed_by_server(c) for c in clients[2:])
        s = slow_client(server.port, "/metrics")  # another class: not counted with them
        s.settimeout(5)
        assert s.recv(100).startswith(b"HTTP/1.0 200")
        assert server.stats["writers_full"] == 2
    finally:
        server.stop()


# --- uid 65534 against a real daemon ------------------------------------------------

SLOW_READERS = r"""
import socket, sys, time
port, n, seconds, path = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
def connect():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.connect(("127.0.0.1", port))
    s.sendall(("GET %s HTTP/1.0\r\n\r\n" % path).encode())
    s.setblocking(False)
    return [s, time.monotonic()]
conns, lives, end = [], [], time.monotonic() + seconds
print("reading slowly", flush=True)
while time.monotonic() < end:
    while len(conns) < n:
        try:
            conns.append(connect())
        except OSError:
            break
    for c in list(conns):
        try:
            c[0].recv(2)  # two bytes a round: a reader that barely reads
        except OSError:
            pass
        # ended by the server (TCP_INFO's state no longer ESTABLISHED): a reset is
        # seen at once, where reading on would take minutes through the buffer
        if c[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != 1:
            lives.append(time.monotonic() - c[1])
            c[0].close()
            conns.remove(c)
    time.sleep(0.5)
# still open at the end count as long as they have lasted
longest = max(lives + [time.monotonic() - c[1] for c in conns], default=0.0)
print("ended", len(lives), "longest %.1f" % longest, flush=True)
"""


def test_slow_readers_of_status_leave_metrics_answered_and_the_real_job_paged(
        start_job, tmp_path, hb_dir):
    need_root()
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"tick_s": 0.5, "resolve_after_s": 2})
    trainer = trainer_job(start_job)
    healthy = wait_until(lambda: (lambda s: s if len(s["ranks"]) == 2 and s["job"]["verdict"]
                                  == "healthy" else None)(our_status(daemon, trainer)), 240,
                         what="healthy job")
    size = len(get(daemon.url + "/status")[1])
    # far more than a 1 KB window takes: the answer waits on the reader
    assert size > 8 * 1024, size
    attacker = start_job(python_as_nobody("-c", SLOW_READERS, str(daemon.port), "24", "25",
                                          "/status"), name="slow-readers")
    wait_until(lambda: "reading slowly" in attacker.output(), 60, what="the slow readers")
    time.sleep(2)  # let them take their places (not a synchronisation)
    os.kill(rank_pid(healthy, 1), signal.SIGSTOP)
    slowest = 0.0
    for _ in range(16):  # 8 s of scrapes while 24 connections read 4 bytes a second
        started = time.monotonic()
        code, body = get(daemon.url + "/metrics")
        slowest = max(slowest, time.monotonic() - started)
        assert code == 200 and b"ddpwatch_up 1.0" in body, code
        time.sleep(0.5)
    assert slowest < 2.0, slowest
    # the real job is paged meanwhile
    incident = wait_until(lambda: next((i for i in daemon.status()["incidents"]
                                        if i["job"] == healthy["key"]
                                        and i["state"] != "resolved"), None), 60,
                          what="the real job's incident beside the slow readers")
    assert incident["culprits"] == [1]
    os.kill(rank_pid(healthy, 1), signal.SIGCONT)
    wait_until(lambda: "ended" in attacker.output(), 60, what="the end of the attack")
    ended = re.search(r"ended (\d+) longest (\S+)", attacker.output())
    # each slow answer was cut within the server's response deadline, most by rate
    assert int(ended.group(1)) >= 24, attacker.output()
    assert float(ended.group(2)) <= bounded_server.BoundedServer.__init__.__kwdefaults__[
        "response_deadline_s"] + 2, attacker.output()
    # cut by rate or deadline, or (24 > max_writers) to make room for newer ones of
    # their class; bursts of 24 heavy requests also meet 503 (never /metrics: above),
    # more of them on a loaded machine, where answers wait for a worker
    refused = refused_counts(daemon.metrics())
    assert sum(refused.get(k, 0) for k in ("slow_reader", "writers_full", "busy_503")) >= 24, \
        refused
    assert daemon.job.proc.poll() is None
    keeps_ticking(daemon)
    no_traceback(daemon)
    json.loads(get(daemon.url + "/status")[1])  # and /status still answers whole
