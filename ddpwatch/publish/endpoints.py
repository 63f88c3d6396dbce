"""The daemon's HTTP endpoints: what each path answers (connections, workers and
slow readers are bounded_server.py's). /metrics, /status, /peer, /healthz,
/readyz, /incidents/ (the list) and /incidents/<id> (an incident's page, drawn
from its bundle, with its bundle's report.txt, report.json and snapshots.json
under /incidents/<id>/), /challenge (public: what a signed request must carry,
signed/auth.py); 404 elsewhere.
`/peer` is what other nodes' daemons read for the peer view (peers.py).
`/healthz` is the liveness a supervisor probes (deploy/kubernetes/daemonset.yaml):
503 once no tick has completed for `stale_after_s` (commands/run.py: systemd's
watchdog interval when it gives one, else STALE_AFTER_S). The HTTP threads
answer while the tick loop is stuck, so "the process answers" says nothing.
`/status?stacks=1` also asks the next tick for every job's stacks (py-spy runs
otherwise only on suspicion): at most once per `stacks_min_interval_s`, so asking
in a loop does not run py-spy in a loop (2 -> 16 runs in 8 s).

Only reads the latest published DaemonView (and the bundles of the incidents it
lists: a path in a request is only ever compared with the incidents' ids).
/status, /peer and /incidents need the token when one is configured (it must
be, off loopback: config.py): a request signed with it over a challenge of
this daemon, whose answer then carries a proof (auth.py: what ddpwatch's own
clients send, so the token never crosses the wire and a request is good once,
here), or `Authorization: Bearer <token>`.
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler

from prometheus_client import CONTENT_TYPE_LATEST

from .. import __version__
from ..signed import auth
from . import bundle, peers, report, viewer
from .page_list import incident_path, render_list
from ..codec import to_json
from ..errors import DdpwatchError
from .bounded_server import BoundedServer

log = logging.getLogger("ddpwatch")
BUNDLE_FILES = {"report.txt": "text/plain; charset=utf-8", "report.json": "application/json",
                "snapshots.json": "application/json"}
HTML = "text/html; charset=utf-8"


def finite(value):
    """`value` with every NaN or infinity made None: JSON has neither (a rank's
    record may hold them, and `NaN` breaks every strict JSON reader)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(doc, **kw) -> bytes:
    return json.dumps(finite(doc), allow_nan=False, **kw).encode()


def status_document(view) -> dict:
    """The same `job` and `ranks[]` as `diagnose --json` (for the most severe job),
    every job under `jobs`, and the incidents."""
    # looked_at: when the look this judgement is of was taken (a steady job's
    # tick keeps its last look: docs/architecture.md "Steady jobs")
    jobs = [dict(key=j.key, looked_at=j.last.wall_time, **report.as_json(j.judgement, j.last),
                 **report.over_time_json(j.over_time)) for j in view.jobs]
    first = jobs[0] if jobs else {"job": {"verdict": "healthy", "culprits": [],
                                          "summary": "No DDP job on this node."}, "ranks": []}
    return {"node": view.node, "tick": view.tick, "wall_time": view.wall_time,
            "version": __version__, "job": first["job"], "ranks": first["ranks"], "jobs": jobs,
            "incidents": [to_json(i) for i in view.incidents],
            "peers": [to_json(p) for p in view.peers],
            # why the daemon may be blind or behind: failed stages, probe errors
            "stage_failures": dict(view.stage_failures or {}),
            "probe_errors": {p.name: p.error for p in view.published_probes if not p.ok}}


STALE_AFTER_S = 60.0  # a tick with every py-spy dump timing out takes ~20 s


class Server:
    def __init__(self, host: str, port: int, get_view, render_metrics, token: str = "",
                 request_stacks=lambda uid=None: None, stacks_min_interval_s: float = 5.0,
                 clock=time.monotonic, stale_after_s: float = STALE_AFTER_S, **limits):
        self.get_view = get_view
        self.stale_after_s = stale_after_s
        # the view last seen by a request, and when it was first seen: a view
        # that stays the same is a loop that completes no tick (before the
        # first, the time since start)
        self._seen_lock = threading.Lock()
        self._seen_view, self._seen_at = None, clock()
        self.request_stacks = request_stacks
        self.render_metrics = render_metrics
        self.token = token
        self.verifier = auth.Verifier()
        self.stacks_min_interval_s = stacks_min_interval_s
        self.clock = clock
        self._stacks_lock = threading.Lock()
        self._stacks_at = -1e9
        self.listen = (host, port)
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = limits.get("request_timeout_s", 5.0)

            def do_GET(self):
                server.handle(self)

            def log_message(self, *args):  # access logs would drown the daemon's own
                pass

        self.httpd = BoundedServer(host, port, Handler, **limits)

    @property
    def port(self) -> int:
        return self.httpd.port

    def start(self) -> None:
        self.httpd.start()

    def stop(self) -> None:
        self.httpd.stop()

    def _stacks_allowed(self) -> bool:
        """One on-demand dump per interval, whoever asks."""
        with self._stacks_lock:
            now = self.clock()
            if now - self._stacks_at < self.stacks_min_interval_s:
                return False
            self._stacks_at = now
            return True

    def _since_tick(self, view) -> float:
        """Seconds since `view` was first seen (since start, before the first)."""
        now = self.clock()
        with self._seen_lock:
            if view is not self._seen_view:
                self._seen_view, self._seen_at = view, now
            return now - self._seen_at

    def handle(self, req) -> None:
        path = req.path.split("?", 1)[0]
        view = self.get_view()
        since = self._since_tick(view)
        if path == "/metrics":
            self._send(req, 200, self.render_metrics(), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            if since <= self.stale_after_s:
                self._send(req, 200, b"ok\n", "text/plain")
            else:
                what = "no tick completed" if view is not None else "no first tick"
                self._send(req, 503, f"{what} for {since:.0f} s\n".encode(), "text/plain")
        elif path == "/readyz":
            ready = view is not None and view.ready
            self._send(req, 200 if ready else 503, b"ready\n" if ready else b"no tick yet\n",
                       "text/plain")
        elif path == "/challenge":
            self._challenge(req)
        elif path == "/incidents" or path.startswith("/incidents/"):
            refused = self._refused(req)
            if refused:
                self._send(req, 401, f"{refused}\n".encode(), "text/plain",
                           {"WWW-Authenticate": 'Bearer realm="ddpwatch"'})
            elif view is None:
                self._send(req, 503, b"no tick yet\n", "text/plain")
            else:
                self._incidents(req, path, self._visible(req, view)[0])
        elif path in ("/status", "/peer"):
            refused = self._refused(req)
            if refused:
                self._send(req, 401, dumps({"error": refused}) + b"\n", "application/json",
                           {"WWW-Authenticate": 'Bearer realm="ddpwatch"'})
            elif view is None:
                self._send(req, 503, b'{"error": "no tick yet"}\n', "application/json")
            else:
                view, uid = self._visible(req, view)
                if path == "/peer":
                    self._send(req, 200, dumps(peers.document(view)), "application/json")
                    return
                headers = {}
                if "stacks=1" in req.path.partition("?")[2].split("&"):
                    if self._stacks_allowed():
                        # the next tick dumps the stacks of every job this asker sees
                        self.request_stacks(uid)
                    else:
                        headers["X-Ddpwatch-Stacks"] = "rate-limited"
                self._send(req, 200, dumps(status_document(view), indent=1), "application/json",
                           headers)
        else:
            self._send(req, 404, b"not found\n", "text/plain")

    def _incidents(self, req, path: str, view) -> None:
        if path in ("/incidents", "/incidents/"):
            self._send(req, 200, render_list(view.incidents, view.node).encode(), HTML)
            return
        # /incidents/<quoted id>[/<file>]: the id is looked up, never used as a path
        quoted, _, name = path[len("/incidents/"):].partition("/")
        incident = next((i for i in view.incidents
                         if i.id == urllib.parse.unquote(quoted)), None)
        if incident is None or not incident.bundle or (name and name not in BUNDLE_FILES):
            self._send(req, 404, b"no such incident (or no bundle for it) on this node\n",
                       "text/plain")
            return
        try:
            if name:
                with open(os.path.join(incident.bundle, name), "rb") as f:
                    body = f.read()
                self._send(req, 200, body, BUNDLE_FILES[name])
                return
            page = bundle.render_page(incident.bundle, incident,
                                      evidence_base=incident_path(incident.id) + "/")
        except (OSError, DdpwatchError) as err:  # the bundle was removed or damaged
            log.warning("incident %s: bundle unreadable: %s", incident.id, err)
            self._send(req, 404, b"the incident's bundle cannot be read\n", "text/plain")
            return
        self._send(req, 200, page.encode(), HTML)

    def _challenge(self, req) -> None:
        """Public: what a signed request must carry (signed/auth.py), made for
        the asker's own nonce and the address it reached this daemon at, so
        the asker learns this daemon holds the token. Nothing is kept."""
        token = self.token  # one value: a reload may change it
        query = req.path.partition("?")[2]
        mine = query[2:] if query.startswith("c=") else ""
        if not token:
            self._send(req, 404, b"no token set: requests here are not signed\n", "text/plain")
        elif not auth.HEX32.fullmatch(mine):
            self._send(req, 400, b"GET /challenge?c=<32 lowercase hex digits: a fresh random "
                                 b"nonce of the asker's>, and nothing else\n", "text/plain")
        else:
            self._send(req, 200, dumps(self.verifier.challenge(token, _reached(req), mine)),
                       "application/json")

    def _visible(self, req, view):
        """(what this request may see, whose it is): everything with the token
        or from root (uid viewer.ALL), else its own uid's jobs and incidents
        (viewer.py)."""
        uid = viewer.viewer_of(req, token_used=bool(self.token))
        return viewer.visible(view, uid), uid

    def _refused(self, req) -> str:
        """Why the request may not be answered ("" if it may). A signed one
        leaves its nonce on `req`, and `_send` proves the answer to it."""
        token = self.token  # one value for the whole check: a reload may change it
        ok, nonce, why = self.verifier.check(token, req.headers.get("Authorization", ""),
                                             req.command, req.path, _reached(req))
        if nonce:
            req.ddpwatch_proof = (token, nonce)
        return "" if ok else why

    @staticmethod
    def _send(req, code, body: bytes, ctype: str, headers=None) -> None:
        req.send_response(code)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            req.send_header(k, v)
        signed = getattr(req, "ddpwatch_proof", None)
        if signed is not None:
            req.send_header(auth.PROOF_HEADER, auth.answer_proof(*signed, code, body))
        req.end_headers()
        req.wfile.write(body)


def _reached(req) -> str:
    """The address this request's connection reached the daemon at (what the
    client connected to, without a NAT between): challenges name it."""
    try:
        return auth.address(req.connection.getsockname())
    except (AttributeError, OSError, IndexError, TypeError, ValueError):
        return ""


def base_url(config) -> str:
    """Where people reach this daemon: the config's external_url, else the
    address it listens on (loopback helps only someone on this node)."""
    if config.external_url:
        return config.external_url.rstrip("/")
    host, port = config.host_port
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"
