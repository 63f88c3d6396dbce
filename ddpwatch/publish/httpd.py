"""HTTP for the daemon: /metrics, /status, /peer, /healthz, /readyz; 404 elsewhere.
`/peer` is what other nodes' daemons read for the peer view (peers.py).
`/status?stacks=1` also asks the next tick for every job's stacks (py-spy runs
otherwise only on suspicion).

Only reads the latest published DaemonView. /status and /peer need
`Authorization: Bearer <token>` when a token is configured (it must be, off
loopback: config.py).
"""
from __future__ import annotations

import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST

from .. import __version__
from . import peers, report
from ..codec import to_json


def status_document(view) -> dict:
    """The same `job` and `ranks[]` as `diagnose --json` (for the most severe job),
    every job under `jobs`, and the incidents."""
    jobs = [dict(key=j.key, **report.as_json(j.judgement, j.last)) for j in view.jobs]
    first = jobs[0] if jobs else {"job": {"verdict": "healthy", "culprits": [],
                                          "summary": "No DDP job on this node."}, "ranks": []}
    return {"node": view.node, "tick": view.tick, "wall_time": view.wall_time,
            "version": __version__, "job": first["job"], "ranks": first["ranks"], "jobs": jobs,
            "incidents": [to_json(i) for i in view.incidents],
            "peers": [to_json(p) for p in view.peers],
            # why the daemon may be blind or behind (issue 14): failed stages, probe errors
            "stage_failures": dict(view.stage_failures or {}),
            "probe_errors": {p.name: p.error for p in view.probes if not p.ok}}


class Server:
    def __init__(self, host: str, port: int, get_view, render_metrics, token: str = "",
                 request_stacks=lambda: None):
        self.get_view = get_view
        self.request_stacks = request_stacks
        self.render_metrics = render_metrics
        self.token = token
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                server.handle(self)

            def log_message(self, *args):  # access logs would drown the daemon's own
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="ddpwatch-http",
                                       daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def handle(self, req) -> None:
        path = req.path.split("?", 1)[0]
        view = self.get_view()
        if path == "/metrics":
            self._send(req, 200, self.render_metrics(), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._send(req, 200, b"ok\n", "text/plain")
        elif path == "/readyz":
            ready = view is not None and view.ready
            self._send(req, 200 if ready else 503, b"ready\n" if ready else b"no tick yet\n",
                       "text/plain")
        elif path in ("/status", "/peer"):
            if self.token and not self._authorized(req):
                self._send(req, 401, b'{"error": "bearer token required"}\n', "application/json",
                           {"WWW-Authenticate": 'Bearer realm="ddpwatch"'})
            elif view is None:
                self._send(req, 503, b'{"error": "no tick yet"}\n', "application/json")
            else:
                if path == "/peer":
                    body = json.dumps(peers.document(view)).encode()
                    self._send(req, 200, body, "application/json")
                    return
                if "stacks=1" in req.path.partition("?")[2].split("&"):
                    self.request_stacks()  # the next tick dumps every job's stacks
                body = json.dumps(status_document(view), indent=1).encode()
                self._send(req, 200, body, "application/json")
        else:
            self._send(req, 404, b"not found\n", "text/plain")

    def _authorized(self, req) -> bool:
        given = req.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode())

    @staticmethod
    def _send(req, code, body: bytes, ctype: str, headers=None) -> None:
        req.send_response(code)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            req.send_header(k, v)
        req.end_headers()
        req.wfile.write(body)
