"""What crosses the network between preflight nodes, and the checks on it.

Lines of JSON, one message per line, each at most MAX_LINE bytes, read under a
deadline. Everything received is hostile input: only known fields of known
types are kept, strings are cut, lists bounded; anything else is dropped, and a
message that is not a JSON object of the expected kind is a ProtocolError.

    master -> worker  GREETING (on accept: tells preflight from a stale store)
    worker -> master  {"kind": "hello", "facts": {...}, "nonce": "..."}
    master -> worker  {"kind": "roster", "you": i, "nodes": [facts...]}
    worker -> master  {"kind": "probes", "results": [probe...]}
    master -> worker  {"kind": "final", "nodes": [...], "probes": [...]}

With a preflight secret (DDPWATCH_PREFLIGHT_SECRET, the same on every node)
the greeting carries a fresh nonce of the master's for this connection
(`GREETING_AUTH` + nonce), and every message is `<mac> <json>`: an HMAC-SHA256
with the secret over who sends it, its number in that direction, both sides'
nonces and the JSON (`Channel`). Whoever lacks the secret (a program that took
the store port first, a stranger's hello) can neither play master to a worker
nor take a worker's slot, and a message of one connection is worth nothing in
another (tests/nodes/test_preflight.py). With a secret the worker says nothing
of itself until the master proved it holds the secret too: its hello carries
its nonce and no facts, the master answers `{"kind": "proven"}` (whose MAC over
both nonces only a holder of the secret can make), and only then does the
worker send `{"kind": "facts", "facts": {...}}`: a program that took the store
port and sends a well-formed greeting learns no hostname, version, address,
interface or port range (tests/unit/preflight/test_preflight_unit.py).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import socket
import time

GREETING = b"DDPWATCH-PREFLIGHT 1\n"
GREETING_AUTH = b"DDPWATCH-PREFLIGHT 1 secret "  # + 32 hex digits of the master's nonce
GREETING_MAX = len(GREETING_AUTH) + 32 + 1
SECRET_ENV = "DDPWATCH_PREFLIGHT_SECRET"
MAX_LINE = 256 << 10
MAX_NODES = 64
MAX_STR = 300
MAX_LIST = 16


class ProtocolError(Exception):
    pass


# field -> (type, default). Nested dicts are schemas of their own.
HOLDER = {"pid": (int, 0), "user": (str, ""), "command": (str, ""), "started": (float, 0.0),
          "ppid": (int, 0), "parent_alive": (bool, False), "error": (str, "")}
STORE_PORT = {"state": (str, ""), "error": (str, ""), "holder": (HOLDER, None), "port": (int, 0)}
STORE_REACH = {"state": (str, ""), "error": (str, ""), "port": (int, 0), "preflight": (bool, False)}
FACTS = {
    "role": (str, ""), "hostname": (str, ""), "hostname_addrs": ([str], []),
    "hostname_error": (str, ""), "hostname_loopback_cause": (str, ""),
    "gloo_ifname": (str, ""), "gloo_addr": (str, ""), "gloo_iface": (str, ""),
    "gloo_iface_kind": (str, ""), "gloo_source": (str, ""), "gloo_error": (str, ""),
    "port_range": ([int], []), "port_range_source": (str, ""), "probe_port": (int, 0),
    "torch": (str, ""), "python": (str, ""), "cpu_model": (str, ""), "cpu_bf16": ([str], []),
    "cpu_flags_read": (bool, False), "gpu": (bool, False), "seen_addr": (str, ""),
    "route_addr": (str, ""), "route_iface": (str, ""),
    "store_port": (STORE_PORT, None), "store_reach": (STORE_REACH, None),
}
PROBE = {"src": (int, -1), "dst": (int, -1), "addr": (str, ""), "port": (int, 0),
         "state": (str, ""), "error": (str, ""), "bytes": (int, 0), "seconds": (float, 0.0)}
PROBE_STATES = ("open", "refused", "dropped", "unreachable", "not run")


def clean(obj, schema: dict) -> dict:
    """The fields of `schema` found in `obj` with the right type (else the
    default), strings cut to MAX_STR, lists to MAX_LIST. Pure."""
    if not isinstance(obj, dict):
        raise ProtocolError(f"expected an object, got {type(obj).__name__}")
    out = {}
    for key, (kind, default) in schema.items():
        out[key] = _value(obj.get(key), kind, default)
    return out


def _value(v, kind, default):
    if isinstance(kind, dict):
        return clean(v, kind) if isinstance(v, dict) else default
    if isinstance(kind, list):
        if not isinstance(v, list):
            return list(default)
        items = [_value(x, kind[0], None) for x in v[:MAX_LIST]]
        return [x for x in items if x is not None]
    if kind is bool:
        return v if isinstance(v, bool) else default
    if kind is int:
        ok = isinstance(v, int) and not isinstance(v, bool) and -(1 << 53) < v < (1 << 53)
        return v if ok else default
    if kind is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        return float(v) if ok else default
    if kind is str:
        return _text(v) if isinstance(v, str) else default
    return default


def _text(s: str) -> str:
    """Printable only: a peer's string must not drive the terminal."""
    return "".join(c if c.isprintable() else "?" for c in s[:MAX_STR])


def clean_probe(obj) -> dict:
    p = clean(obj, PROBE)
    if p["state"] not in PROBE_STATES:
        p["state"] = "not run"
        p["error"] = "the peer sent an unknown probe state"
    return p


def clean_nodes(v) -> list[dict]:
    if not isinstance(v, list) or not 0 < len(v) <= MAX_NODES:
        raise ProtocolError("nodes: expected a list of 1 to 64 objects")
    return [clean(n, FACTS) for n in v]


def parse(line: bytes, kind: str) -> dict:
    """One received line as a message of `kind`, cleaned. Pure."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ProtocolError(f"not JSON: {err}") from None
    if not isinstance(obj, dict) or obj.get("kind") != kind:
        raise ProtocolError(f"expected a {kind!r} message")
    if kind == "hello":  # the nonce a signed hello carries (Channel), "" if none
        nonce = obj.get("nonce")
        return {"facts": clean(obj.get("facts"), FACTS),
                "nonce": _text(nonce) if isinstance(nonce, str) else ""}
    if kind == "proven":
        return {}
    if kind == "facts":
        return {"facts": clean(obj.get("facts"), FACTS)}
    if kind == "roster":
        you = obj.get("you")
        nodes = clean_nodes(obj.get("nodes"))
        if not isinstance(you, int) or isinstance(you, bool) or not 0 < you < len(nodes):
            raise ProtocolError("roster: 'you' is not a worker's index")
        return {"you": you, "nodes": nodes}
    results = obj.get("results" if kind == "probes" else "probes")
    if not isinstance(results, list) or len(results) > MAX_NODES * MAX_NODES:
        raise ProtocolError(f"{kind}: expected a bounded list of probes")
    probes = [clean_probe(p) for p in results]
    if kind == "probes":
        return {"results": probes}
    return {"nodes": clean_nodes(obj.get("nodes")), "probes": probes}


def greeting(nonce: str) -> bytes:
    """What the master says on accept: GREETING, or with a secret its nonce."""
    return GREETING_AUTH + nonce.encode() + b"\n" if nonce else GREETING


def read_greeting(line: bytes) -> str | None:
    """None if `line` is no preflight greeting, "" for one without a secret,
    else the master's nonce."""
    if line + b"\n" == GREETING:
        return ""
    if line.startswith(GREETING_AUTH):
        nonce = line[len(GREETING_AUTH):].decode("ascii", "replace")
        if len(nonce) == 32 and all(c in "0123456789abcdef" for c in nonce):
            return nonce
    return None


def new_nonce() -> str:
    return os.urandom(16).hex()


class Channel:
    """One connection's messages, signed with the secret when there is one.
    `me` is "master" or "worker"; `master_nonce` from the greeting; the
    worker's nonce rides in its hello and binds every later message."""

    def __init__(self, sock: socket.socket, reader: "LineReader", me: str, secret: bytes = b"",
                 master_nonce: str = "", worker_nonce: str = ""):
        self.sock, self.reader, self.me = sock, reader, me
        self.secret, self.master_nonce, self.worker_nonce = secret, master_nonce, worker_nonce
        self.sent = self.received = 0

    def _mac(self, sender: str, seq: int, body: bytes) -> str:
        head = f"{sender}\n{seq}\n{self.master_nonce}\n{self.worker_nonce}\n".encode()
        return hmac.new(self.secret, head + body, hashlib.sha256).hexdigest()

    def send(self, kind: str, **fields) -> None:
        if self.secret and kind == "hello":
            self.worker_nonce = ""  # the hello's MAC covers the nonce inside it
            fields["nonce"] = nonce = new_nonce()
        body = json.dumps({"kind": kind, **fields}, separators=(",", ":")).encode()
        line = (self._mac(self.me, self.sent, body).encode() + b" " + body) if self.secret \
            else body
        if len(line) + 1 > MAX_LINE:
            raise ProtocolError(f"{kind} message of {len(line)} bytes exceeds {MAX_LINE}")
        self.sock.sendall(line + b"\n")
        if self.secret and kind == "hello":
            self.worker_nonce = nonce
        self.sent += 1

    def recv(self, kind: str, deadline: float) -> dict:
        line = self.reader.line(deadline)
        if self.secret:
            mac, _, line = line.partition(b" ")
            sender = "worker" if self.me == "master" else "master"
            want = self._mac(sender, self.received, line).encode()
            if not hmac.compare_digest(mac, want):
                raise ProtocolError(f"a {kind!r} message not signed with the preflight secret")
        message = parse(line, kind)
        if self.secret and kind == "hello":
            if len(message["nonce"]) != 32:
                raise ProtocolError("a hello without its nonce")
            self.worker_nonce = message["nonce"]
        self.received += 1
        return message


class LineReader:
    """Lines from a socket, each at most `limit` bytes, under a deadline."""

    def __init__(self, sock: socket.socket, limit: int = MAX_LINE):
        self.sock, self.limit, self.buf = sock, limit, b""

    def line(self, deadline: float) -> bytes:
        while b"\n" not in self.buf:
            if len(self.buf) > self.limit:
                raise ProtocolError(f"a line longer than {self.limit} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError("timed out waiting for the peer")
            self.sock.settimeout(left)
            try:
                part = self.sock.recv(65536)
            except socket.timeout:
                raise ProtocolError("timed out waiting for the peer") from None
            except OSError as err:
                raise ProtocolError(f"connection failed: {err}") from None
            if not part:
                raise ProtocolError("the peer closed the connection")
            self.buf += part
        line, _, self.buf = self.buf.partition(b"\n")
        if len(line) > self.limit:
            raise ProtocolError(f"a line longer than {self.limit} bytes")
        return line
