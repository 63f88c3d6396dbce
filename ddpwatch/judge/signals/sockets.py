"""Sockets family: a rank's TCP connections, from the sockets probe. Pure."""
from __future__ import annotations

from ...observe.snapshot import Snapshot
from .lookup import proc_of, sockets_of
from .spec import NUMBER, declare

SIGNALS = declare(
    ("holds_master_port", bool, "the process listens on the job's MASTER_PORT"),
    ("syn_sent", int, "TCP connects stuck in SYN-SENT (a firewall or wrong address)"),
    ("syn_sent_to", str, "where a SYN-SENT socket points (a data connection's, if any)"),
    ("syn_sent_data", bool, "a stuck connect goes to a port other than MASTER_PORT: Gloo's "
                            "data connection to a port a peer picked at run time, past the "
                            "rendezvous"),
    ("peer_idle_s", NUMBER,
     "seconds since any established TCP socket of the rank sent or received"),
    ("retransmits", int, "retransmitted segments over the rank's sockets"),
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
    return s
