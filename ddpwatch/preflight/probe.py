"""Connect to a peer's port and say what happened, and measure the link.

A firewall shows itself in three ways, and the fix differs: *open* (the
handshake completed), *refused* (an RST or ICMP port-unreachable came back:
a REJECT rule, or nothing listening), *dropped* (no answer at all before the
timeout: a DROP rule; the field's silent hang at rendezvous). *unreachable*
is the route's answer (no route, host unreachable).

`ProbeListener` is what a node offers the others: a port in the range Gloo
will use. A connection to it may stream bytes for a short while; the listener
counts them and answers the count, so the sender can time the link. It reads
nothing else, and bounds time, bytes and connections (hostile input).
"""
from __future__ import annotations

import errno
import socket
import struct
import threading
import time

CONNECT_TIMEOUT_S = 2.0
STREAM_S = 0.4  # how long a prober streams to time the link
MAX_STREAM_BYTES = 256 << 20
LISTEN_CONN_S = 4.0  # the listener's bound on one connection
MAX_CONNS = 32
CHUNK = b"\0" * (64 << 10)


def classify_error(err: BaseException) -> str:
    """open/refused/dropped/unreachable from a connect's exception. Pure."""
    if isinstance(err, (socket.timeout, TimeoutError)):
        return "dropped"
    code = getattr(err, "errno", None)
    if code == errno.ECONNREFUSED:
        return "refused"
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EACCES, errno.EPERM,
                errno.EADDRNOTAVAIL):
        return "unreachable"
    if code == errno.ETIMEDOUT:
        return "dropped"
    return "unreachable"


def connect(addr: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S):
    """(state, socket or None, error text)."""
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(fam, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect((addr, port))
    except OSError as err:
        sock.close()
        return classify_error(err), None, str(err) or err.__class__.__name__
    return "open", sock, ""


def probe(addr: str, port: int, measure: bool = True) -> dict:
    """Connect to a ProbeListener at addr:port; when open, stream for STREAM_S
    and time until the listener acknowledges what arrived."""
    state, sock, error = connect(addr, port)
    out = {"addr": addr, "port": port, "state": state, "error": error, "bytes": 0,
           "seconds": 0.0}
    if sock is None or not measure:
        if sock is not None:
            sock.close()
        return out
    with sock:
        try:
            sock.settimeout(LISTEN_CONN_S)
            start = time.monotonic()
            sent = 0
            while time.monotonic() - start < STREAM_S and sent < MAX_STREAM_BYTES:
                sock.sendall(CHUNK)
                sent += len(CHUNK)
            sock.shutdown(socket.SHUT_WR)
            reply = _recv_exact(sock, 8)
            elapsed = time.monotonic() - start
            (count,) = struct.unpack("!Q", reply)
            out.update(bytes=min(count, sent), seconds=round(elapsed, 4))
        except (OSError, ValueError, struct.error) as err:
            out["error"] = f"timing the link failed: {err or err.__class__.__name__}"
    return out


def _recv_exact(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ValueError("connection closed early")
        data += part
    return data


class ProbeListener:
    """A listening port in `port_range` (None: let the kernel pick an ephemeral
    one, as Gloo does), served from a daemon thread until `close()`."""

    def __init__(self, port_range: tuple[int, int] | None, family=socket.AF_INET):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_INET6:
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        self.sock.bind(("", self._pick(port_range, family)))
        self.sock.listen(MAX_CONNS)
        self.port = self.sock.getsockname()[1]
        self._slots = threading.BoundedSemaphore(MAX_CONNS)
        self._closed = False
        threading.Thread(target=self._serve, name="preflight-probe", daemon=True).start()

    @staticmethod
    def _pick(port_range, family) -> int:
        if port_range is None:
            return 0
        lo, hi = port_range
        span = hi - lo + 1
        start = int(time.monotonic_ns()) % span
        for i in range(min(span, 200)):
            port = lo + (start + i) % span
            with socket.socket(family, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("", port))
                    return port
                except OSError:
                    continue
        raise OSError(f"no free port in {lo}-{hi}")

    def _serve(self):
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                conn.close()  # too many at once: a flood is not served
                continue
            threading.Thread(target=self._count, args=(conn,), daemon=True).start()

    def _count(self, conn):
        try:
            conn.settimeout(LISTEN_CONN_S)
            deadline = time.monotonic() + LISTEN_CONN_S
            count = 0
            while time.monotonic() < deadline and count <= MAX_STREAM_BYTES + len(CHUNK):
                part = conn.recv(1 << 16)
                if not part:
                    conn.sendall(struct.pack("!Q", count))
                    break
                count += len(part)
        except OSError:
            pass
        finally:
            conn.close()
            self._slots.release()

    def close(self):
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
