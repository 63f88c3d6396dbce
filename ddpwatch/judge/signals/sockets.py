"""Sockets family: a rank's TCP connections, from the sockets probe. Pure."""
from __future__ import annotations

from ...observe.snapshot import Snapshot
from ...observe.probes.host import plain_addr
from .lookup import proc_of, sockets_of
from .spec import NUMBER, declare

# retransmission timeouts in a row (each RTO doubles from at least 200 ms): 3 is
# over 1.4 s without a single acknowledgement from the far end; a busy or lossy
# link that still delivers acknowledges something long before (docs/design.md
# "A link that went silent")
LINK_BACKOFF = 3

SIGNALS = declare(
    ("holds_master_port", bool, "the process listens on the job's MASTER_PORT"),
    ("syn_sent", int, "TCP connects stuck in SYN-SENT (a firewall or wrong address)", "count"),
    ("syn_sent_to", str, "where a SYN-SENT socket points (a data connection's, if any)"),
    ("syn_sent_data", bool, "a stuck connect goes to a port other than MASTER_PORT: Gloo's "
                            "data connection to a port a peer picked at run time, past the "
                            "rendezvous"),
    ("peer_idle_s", NUMBER,
     "seconds since any established TCP socket of the rank sent or received", "s"),
    ("rank_links_idle_s", NUMBER,
     "seconds since the rank's connections to the job's other ranks on this node (Gloo's "
     "pairs; not the store, not a framework's own) last sent or received; None: none read",
     "s"),
    ("retransmits", int, "retransmitted segments over the rank's sockets", "count"),
    ("remote_addrs", str, "other hosts the rank holds established TCP connections with (its "
                          "peers and store on other nodes; None none)"),
    ("link_backoff", int, "the most times in a row a retransmission timer of the rank's "
                          "established connections to other hosts fired unacknowledged (ss "
                          "`backoff`); None: not read", "count"),
    ("link_silent_to", str, "other hosts whose connections with the rank went silent: "
                            f"{LINK_BACKOFF} or more retransmission timeouts in a row, no "
                            "acknowledgement (None none)"),
    ("link_silent_between", str, "those silent connections' two ends, as 'A and B' (the "
                                 "lower address first: both sides name a link alike)"),
)


def measure(history: tuple[Snapshot, ...], pid: int) -> dict:
    last = history[-1]
    now = proc_of(last, pid)
    if now is None:
        return {}
    port = now.env.get("MASTER_PORT", "")
    socks = sockets_of(last, pid)
    s: dict = {"holds_master_port": bool(port.isdigit() and any(
        k.state == "LISTEN" and k.local_port == int(port) for k in socks))}
    syn = [k for k in socks if k.state in ("SYN-SENT", "SYN_SENT")]
    data = [k for k in syn if port.isdigit() and k.peer_port != int(port)]
    s["syn_sent"] = len(syn)
    s["syn_sent_data"] = bool(data) if port.isdigit() else None
    first = (data or syn)[0] if syn else None
    s["syn_sent_to"] = f"{first.peer_addr}:{first.peer_port}" if first else ""
    established = [k for k in socks if k.state == "ESTABLISHED" and k.last_send_ms >= 0]
    if established:
        s["peer_idle_s"] = round(min(min(k.last_send_ms, k.last_recv_ms)
                                     for k in established) / 1000, 3)
        s["retransmits"] = sum(max(k.retransmits, 0) for k in established)
        # Gloo's pairs: connections whose far end is another rank of the job here;
        # not the store (MASTER_PORT, rank 0's under mp.spawn), not a framework's
        # own sockets (Ray's gRPC)
        master = int(port) if port.isdigit() else -1
        links = [k for k in established if master not in (k.local_port, k.peer_port)
                 and _far_end_rank(last, k) not in (None, pid)]
        if links:
            s["rank_links_idle_s"] = round(min(min(k.last_send_ms, k.last_recv_ms)
                                               for k in links) / 1000, 3)
    s["remote_addrs"] = remote_addrs(socks)
    far = [k for k in established if k.backoff >= 0 and _remote(k)]
    s["link_backoff"] = max((k.backoff for k in far), default=None)
    silent = [k for k in far if k.backoff >= LINK_BACKOFF]
    s["link_silent_to"] = " ".join(sorted({plain_addr(k.peer_addr) for k in silent})) or None
    s["link_silent_between"] = "; ".join(sorted({" and ".join(sorted(
        (plain_addr(k.local_addr), plain_addr(k.peer_addr)))) for k in silent})) or None
    return s


def _remote(k) -> bool:
    here, there = plain_addr(k.local_addr), plain_addr(k.peer_addr)
    return here != there and not _loopback(there)


def _far_end_rank(snap: Snapshot, k) -> int | None:
    """The pid of the job's rank here that holds connection `k`'s far end (None: none)."""
    owner = snap.sockets.ends.get((plain_addr(k.peer_addr), k.peer_port))
    return owner if owner in snap.job.rank_set else None


def remote_addrs(socks) -> str:
    """The far ends of established connections that are not this host: a connection
    whose two ends differ, neither on loopback, reaches another node (the
    node a lone daemon's waiting rank waits for)."""
    far = {plain_addr(k.peer_addr) for k in socks if k.state == "ESTABLISHED" and _remote(k)}
    return " ".join(sorted(far)) or None


def _loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr == "::1"
