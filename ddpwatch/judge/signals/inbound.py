"""Connects this node drops: a peer's SYNs that arrive for a rank and are never
answered (the traffic probe), while the rank listens on the port they dial.

The kernel answers a SYN to a listening port at once (SYN-ACK), and to a closed
one with a RST; silence for half a second, or the peer's retransmissions, mean
something between the wire and the socket threw it away: the node's firewall.
That node is the culprit of a job whose ranks sit at rendezvous, and the ranks
whose connects it drops (SYN-SENT on their own node) are its victims.

`measure` measures one rank; `link` ties each rank's stuck connect to the rank
whose node drops it. Pure.
"""
from __future__ import annotations

from ...observe.probes.host import plain_addr
from ...observe.snapshot import Snapshot
from .interfaces import dialled
from .lookup import proc_of, socket_entry, sockets_of
from .spec import NUMBER, declare
from .steps import cross_rank

SIGNALS = declare(
    ("syn_in_unanswered", int, "peers' connection attempts that arrived on this node for a port "
                               "the rank listens on and were never answered (traffic probe; "
                               "None: no capture, or the rank is in another network "
                               "namespace)", "count"),
    ("syn_in_from", str, "where those attempts come from"),
    ("syn_in_first_from", str, "where the first of them came from"),
    ("syn_in_port", int, "the port the first of them dials"),
    ("syn_in_ports", int, "how many of the rank's ports they dial", "count"),
    ("syn_in_last_s", NUMBER, "seconds since the last of them arrived", "s"),
    ("syn_in_iface", str, "the interface they arrive on"),
    ("syn_in_retries", int, "their retransmissions (each one the dialer giving up on an answer)",
                            "count"),
    ("syn_in_for_s", NUMBER, "seconds since the first of them arrived", "s"),
    ("syn_in_dropped_at", str, "the address:port pairs they dial (space-separated)"),
    ("syn_sent_dropped_by", int, "the rank whose node receives and drops this rank's stuck "
                                 "connect"),
    ("syn_sent_dropped_node", str, "that rank's node"),
)

ANSWER_WITHIN_S = 0.5  # a SYN-ACK takes microseconds on the node; 0.5 s is no answer


def measure(history: tuple[Snapshot, ...], pid: int) -> dict:
    last = history[-1]
    traffic, socks = last.traffic, sockets_of(last, pid)
    entry = socket_entry(last, pid)
    proc = proc_of(last, pid)
    if (traffic is None or entry is None or entry.error or proc is None
            or entry.net_ns != traffic.net_ns):
        return {}  # not captured, or the rank lives in another network namespace
    # the rank's own connections: an attempt it holds a socket for was answered,
    # whatever the capture missed
    held = {(plain_addr(k.peer_addr), k.peer_port) for k in socks if k.state != "LISTEN"}
    started = _monotonic_start(last, proc.start_time_s)
    dropped = [f for f in unanswered(traffic, listening_on(socks))
               if (f.src, f.sport) not in held and f.first_s >= started]
    s: dict = {"syn_in_unanswered": len(dropped)}
    if dropped:
        first, latest = min(dropped, key=lambda f: f.first_s), max(f.last_s for f in dropped)
        s.update(syn_in_from=", ".join(sorted({f.src for f in dropped})),
                 syn_in_first_from=first.src, syn_in_port=first.dport,
                 syn_in_ports=len({f.dport for f in dropped}), syn_in_iface=first.iface,
                 syn_in_retries=sum(f.syns - 1 for f in dropped),
                 syn_in_for_s=round(traffic.taken_at - first.first_s, 1),
                 syn_in_last_s=round(traffic.taken_at - latest, 1),
                 syn_in_dropped_at=" ".join(sorted({f"{f.dst}:{f.dport}" for f in dropped})))
    return s


def _monotonic_start(snap: Snapshot, start_since_boot: float) -> float:
    """A process's start (seconds after boot, /proc) on the monotonic clock the
    capture stamps with: the boot clock runs ahead of it by the time suspended."""
    procs = snap.processes
    if start_since_boot < 0 or procs is None or procs.uptime_s < 0:
        return float("-inf")
    return start_since_boot - (procs.uptime_s - procs.taken_at)


def listening_on(socks) -> set[tuple[str, int]]:
    """(address, port) of the LISTEN sockets among `socks`."""
    return {(plain_addr(k.local_addr), k.local_port) for k in socks if k.state == "LISTEN"}


def unanswered(traffic, listening: set[tuple[str, int]]) -> list:
    """Inbound attempts to `listening` that got no answer: retried by the dialer,
    or unanswered for ANSWER_WITHIN_S."""
    return [f for f in traffic.flows
            if f.direction == "in" and not f.answer and _listens(listening, f.dst, f.dport)
            and (f.syns > 1 or traffic.taken_at - f.first_s >= ANSWER_WITHIN_S)
            and f.first_s > traffic.last_loss_s]  # its answer may be among the lost


def _listens(listening: set, addr: str, port: int) -> bool:
    return (addr, port) in listening or ("0.0.0.0", port) in listening or ("::", port) in listening


@cross_rank(writes=("syn_sent_dropped_by", "syn_sent_dropped_node"))
def link(ranks: list[dict]) -> None:
    """For each rank whose connect sits in SYN-SENT, the rank whose node receives
    and drops it (`syn_sent_dropped_by`), with that node (`syn_sent_dropped_node`)."""
    drops = {}
    for p in ranks:
        for target in (p.get("syn_in_dropped_at") or "").split():
            drops[target] = p
    for s in ranks:
        peer = dialled(s, drops)
        if peer is None:
            continue
        s["syn_sent_dropped_by"] = peer.get("rank")
        s["syn_sent_dropped_node"] = peer.get("node") or "that node"
