"""A line-based metrics server for jobs that log to one (tests/jobs/pausesites.py
--log-to): it answers every line with one line, until `mute()`; from then on it
reads and never answers, as a metrics server that hangs does. `unanswered` counts
the lines it kept silent about: one is the proof that the job is blocked on it."""
from __future__ import annotations

import socket
import threading


class LogServer:
    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.muted = threading.Event()
        self.unanswered = 0
        self.lines = 0
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buf = b""
        while True:
            try:
                chunk = conn.recv(4096)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                _, buf = buf.split(b"\n", 1)
                self.lines += 1
                if self.muted.is_set():
                    self.unanswered += 1
                    continue
                try:
                    conn.sendall(b"ok\n")
                except OSError:
                    return

    def mute(self):
        self.muted.set()

    def close(self):
        self.sock.close()
        for conn in self._conns:
            conn.close()
