"""The meeting: the master listens briefly on the store port (beside it, on
port+1, when something else holds it), workers connect and report their facts,
the master hands everyone the roster, every node probes every other node's
probe port (in the range Gloo will use) and reports, and the master hands out
the final set. Every wait has a deadline; a node that does not keep up is left
out and the checks say so.

Both sides return a `Meeting`: every node's facts (index 0 is the master),
every probe, which node this is, and why the meeting fell short, if it did.
"""
from __future__ import annotations

import errno
import ipaddress
import socket
import threading
import time
from dataclasses import dataclass, field

from ..observe.probes.host import plain_addr
from . import protocol
from .probe import connect, probe

MAX_PENDING = 16  # connections heard at once before they say hello
HELLO_S = 3.0  # a connection that says nothing in this long is not a worker
PROBE_PHASE_S = 20.0  # bound on probing and reporting (a dropped connect takes 2 s)
RETRY_S = 0.3


@dataclass
class Meeting:
    nodes: list = field(default_factory=list)
    probes: list = field(default_factory=list)
    me: int = 0
    error: str = ""  # why the meeting fell short ("" when everyone took part)
    secret: bool = False  # every message signed with the preflight secret (protocol.Channel)
    refused: int = 0  # the master's: connections whose hello was not signed with it


def probe_all(nodes: list[dict], me: int) -> list[dict]:
    """This node's probes of every other node's probe port, in parallel."""
    results: list[dict] = []
    lock = threading.Lock()

    def one(j):
        n = nodes[j]
        # from the network: only an IP literal (no DNS lookups steered by a peer)
        # and a real port are dialled
        if not _ip(n["seen_addr"]) or not 0 < n["probe_port"] < 65536:
            r = {"addr": n["seen_addr"], "port": n["probe_port"], "state": "not run",
                 "error": "the node offered no usable probe address and port", "bytes": 0,
                 "seconds": 0.0}
        else:
            r = probe(n["seen_addr"], n["probe_port"])
        with lock:
            results.append(dict(r, src=me, dst=j))

    threads = [threading.Thread(target=one, args=(j,), daemon=True)
               for j in range(len(nodes)) if j != me]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PROBE_PHASE_S)
    return sorted(results, key=lambda r: r["dst"])


def _ip(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr)
        return True
    except ValueError:
        return False


def _bind(port: int, family) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    # as TCPStore does: the launch right after must not trip over TIME-WAIT
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    try:
        sock.bind(("", port))
        sock.listen(protocol.MAX_NODES)
    except OSError:
        sock.close()
        raise
    return sock


def run_master(port: int, expected: int, facts: dict, wait_s: float, family,
               holder_of, secret: bytes = b"") -> Meeting:
    """`facts` is this node's; `holder_of(port)` names who holds a busy port;
    with a `secret`, only workers that sign with it take part."""
    meeting = Meeting(nodes=[facts], secret=bool(secret))
    facts["store_port"] = {"state": "free", "error": "", "holder": None, "port": port}
    try:
        server = _bind(port, family)
    except OSError as err:
        if err.errno != errno.EADDRINUSE:
            facts["store_port"].update(state="unknown", error=str(err))
            meeting.error = f"cannot listen on port {port}: {err}"
            meeting.nodes[0] = protocol.clean(facts, protocol.FACTS)
            return meeting
        facts["store_port"].update(state="held", holder=holder_of(port))
        try:
            server = _bind(port + 1, family)  # beside it: workers try there next
        except OSError as err2:
            meeting.error = f"cannot listen on port {port} nor {port + 1}: {err2}"
            meeting.nodes[0] = protocol.clean(facts, protocol.FACTS)
            return meeting
    meeting.nodes[0] = protocol.clean(facts, protocol.FACTS)  # every node judges the same data
    workers: list = []
    try:
        heard, refused = _gather_workers(server, expected - 1, time.monotonic() + wait_s,
                                         secret)
        meeting.refused = refused
        meeting.nodes += [w for w, _ in heard]
        workers = [channel for _, channel in heard]
        if len(meeting.nodes) < expected:
            meeting.error = (f"{len(meeting.nodes)} of {expected} nodes took part within "
                             f"{wait_s:.0f}s")
            if refused:
                meeting.error += (f"; {refused} connection(s) did not sign with the preflight "
                                  f"secret (not set, or another value, on those nodes?)")
        live = []
        for i, channel in enumerate(workers, 1):
            try:
                channel.send("roster", you=i, nodes=meeting.nodes)
                live.append((i, channel))
            except (OSError, protocol.ProtocolError):
                channel.sock.close()
        meeting.probes = probe_all(meeting.nodes, 0)
        deadline = time.monotonic() + PROBE_PHASE_S
        for i, channel in live:
            try:
                report = channel.recv("probes", deadline)
            except protocol.ProtocolError as err:
                meeting.error = meeting.error or f"node {i} sent no probe results: {err}"
                continue
            # a node reports its own probes only
            meeting.probes += [p for p in report["results"] if p["src"] == i
                               and 0 <= p["dst"] < len(meeting.nodes) and p["dst"] != i]
        for i, channel in live:
            try:
                channel.send("final", nodes=meeting.nodes, probes=meeting.probes)
            except (OSError, protocol.ProtocolError):
                pass
    finally:
        for channel in workers:
            channel.sock.close()
        server.close()
    return meeting


def _gather_workers(server: socket.socket, wanted: int, deadline: float,
                    secret: bytes = b"") -> tuple[list, int]:
    """(up to `wanted` workers' (facts, channel) in the order their hellos
    arrive before `deadline`, how many hellos were not signed with `secret`).
    Each connection is heard in a thread of its own, so a silent or
    junk-sending one (a scanner, a stale client) delays nobody; at most
    MAX_PENDING are heard at once."""
    arrived: list = []
    refused = [0]
    cond = threading.Condition()
    pending = threading.BoundedSemaphore(MAX_PENDING)

    def hear(conn, peer):
        nonce = protocol.new_nonce() if secret else ""
        channel = protocol.Channel(conn, protocol.LineReader(conn), "master", secret, nonce)
        try:
            conn.sendall(protocol.greeting(nonce))
            hello = channel.recv("hello", min(time.monotonic() + HELLO_S, deadline))
            if secret:  # the worker's facts come once this side proved the secret
                channel.send("proven")
                hello = channel.recv("facts", min(time.monotonic() + HELLO_S, deadline))
        except (protocol.ProtocolError, OSError) as err:
            conn.close()  # junk, a scanner, a stranger, or a worker gone: not a node
            if secret and "secret" in str(err):
                with cond:
                    refused[0] += 1
            return
        finally:
            pending.release()
        worker = hello["facts"]
        worker.update(role="worker", seen_addr=plain_addr(peer[0]), store_port=None)
        with cond:
            if len(arrived) < wanted and time.monotonic() < deadline:
                arrived.append((worker, channel))
                cond.notify()
                return
        conn.close()

    server.settimeout(0.2)
    while time.monotonic() < deadline:
        with cond:
            if len(arrived) >= wanted:
                break
        try:
            conn, peer = server.accept()
        except (socket.timeout, OSError):
            continue
        if not pending.acquire(blocking=False):
            conn.close()
            continue
        threading.Thread(target=hear, args=(conn, peer), daemon=True).start()
    with cond:
        return list(arrived[:wanted]), refused[0]


def _session(addr: str, port: int, reach: dict | None, secret: bytes, untrusted: list):
    """A channel to a preflight master at addr:port, or (None, reach) where
    reach records how the store port itself answered. A master whose greeting
    does not match this node's use of the secret is no master of ours: it is
    noted in `untrusted` and nothing is sent to it."""
    state, sock, error = connect(addr, port)
    if reach is None:
        reach = {"state": state, "error": error, "port": port, "preflight": False}
    if sock is None:
        return None, reach
    reader = protocol.LineReader(sock, limit=protocol.GREETING_MAX)
    try:
        nonce = protocol.read_greeting(reader.line(time.monotonic() + 1.5))
    except protocol.ProtocolError:
        nonce = None
    if nonce is not None and bool(nonce) == bool(secret):
        if reach["port"] == port:
            reach["preflight"] = True
        return protocol.Channel(sock, protocol.LineReader(sock), "worker", secret, nonce), reach
    if nonce is not None:
        untrusted.append(
            f"{addr}:{port} " + ("does not use the preflight secret: not trusted, "
                                 "nothing sent to it" if secret else
                                 f"wants the preflight secret: set {protocol.SECRET_ENV} here too"))
    sock.close()
    return None, reach


def run_worker(addr: str, port: int, facts: dict, wait_s: float, iface_of,
               secret: bytes = b"") -> Meeting:
    """`iface_of(addr)` names the local interface holding addr (the route to the master)."""
    meeting = Meeting(nodes=[facts], me=0, secret=bool(secret))
    deadline = time.monotonic() + wait_s
    session, reach, untrusted = None, None, []
    while session is None and time.monotonic() < deadline:
        started = time.monotonic()
        session, reach = _session(addr, port, None, secret, untrusted)
        if session is None and reach["state"] == "open":
            # something that is not our preflight holds the store port: the master's
            # is beside it
            session, _ = _session(addr, port + 1, dict(reach), secret, untrusted)
        if session is None:
            time.sleep(max(RETRY_S - (time.monotonic() - started), 0))
    facts["store_reach"] = reach
    if session is None:
        meeting.error = f"no preflight master answered at {addr}:{port} within {wait_s:.0f}s"
        if untrusted:
            meeting.error += f" ({untrusted[-1]})"
        return meeting
    channel = session
    facts["route_addr"] = plain_addr(channel.sock.getsockname()[0])
    facts["route_iface"] = iface_of(facts["route_addr"]) or ""
    with channel.sock:
        try:
            if secret:
                # nothing of this node before the master proves the secret
                # (protocol.py): a squatter's greeting is easy to copy
                channel.send("hello", facts={})
                channel.recv("proven", time.monotonic() + HELLO_S)
                channel.send("facts", facts=facts)
            else:
                channel.send("hello", facts=facts)
            # the master waits up to its own --wait for the other workers
            roster = channel.recv("roster", time.monotonic() + wait_s + HELLO_S)
            meeting.nodes, meeting.me = roster["nodes"], roster["you"]
            # the master is probed where this node reached it, whatever its roster says
            meeting.nodes[0]["seen_addr"] = plain_addr(addr)
            mine = probe_all(meeting.nodes, meeting.me)
            meeting.probes = mine
            channel.send("probes", results=mine)
            final = channel.recv("final", time.monotonic() + 2 * PROBE_PHASE_S)
            if len(final["nodes"]) == len(meeting.nodes):
                meeting.nodes, meeting.probes = final["nodes"], final["probes"]
            else:
                meeting.error = "the master's final list of nodes differs from its roster"
        except (protocol.ProtocolError, OSError) as err:
            meeting.error = f"the exchange with the master failed: {err}"
    return meeting
