"""Which interface a rank's Gloo listens on, and whether its peers can use it.

Gloo tells its peers, through the store, the address it listens on: the one
of GLOO_SOCKET_IFNAME, else what the hostname resolves to. Peers on other
nodes then connect there: for each pair of ranks the one with the higher
address connects to the other (this torch's Gloo). The field's failures: a
hostname resolving to 127.0.1.1 (Debian's /etc/hosts, nsswitch `myhostname`),
so peers are told to dial their own loopback; a docker bridge or a VPN
address only one node has; IPv6 on one node and IPv4 on another.

`measure` measures one rank; `link` then ties a rank's connect that gets no
answer to the peer whose Gloo address it dials. Pure.
"""
from __future__ import annotations

from ...observe.probes.host import (IFACE_KINDS, SUSPECT_KINDS, Interface, interface_of,
                                    is_loopback, plain_addr)
from ...observe.snapshot import Snapshot
from .host import ns_view
from .lookup import proc_of, socket_entry, sockets_of
from .spec import declare, one_of
from .steps import cross_rank

SIGNALS = declare(
    ("gloo_addr", str, "the address the rank's Gloo listens on and tells its peers to connect "
                       "to (its listening socket other than MASTER_PORT)"),
    ("gloo_port", int, "the port of that listening socket"),
    ("gloo_iface", str, "the interface holding gloo_addr"),
    ("gloo_iface_kind", one_of(*IFACE_KINDS), "what gloo_iface is, by its name (tailscale0, "
                                              "docker0...)"),
    ("gloo_loopback", bool, "gloo_addr is a loopback address (127.x, ::1)"),
    ("gloo_ifname", str, "GLOO_SOCKET_IFNAME of the rank ('' unset: Gloo resolves the "
                         "hostname)"),
    ("master_route_addr", str, "this rank's address on its connection to "
                               "MASTER_ADDR:MASTER_PORT: the route to the other nodes"),
    ("master_route_iface", str, "the interface holding master_route_addr"),
    ("gloo_unconnected", int, "peers this rank has no Gloo data connection with: world size - "
                              "1 - its established TCP connections off MASTER_PORT (0 once "
                              "the group is up)", "count"),
    ("gloo_off_route", bool, "Gloo listens on another address than the rank reaches the master "
                             "from, and one picked by the hostname (GLOO_SOCKET_IFNAME unset), "
                             "on a VPN/bridge/veth interface, or of the other address family"),
    ("syn_sent_to_rank", int, "the rank whose Gloo address this rank's stuck connect dials"),
    ("syn_sent_to_gloo_off_route", bool, "that rank's Gloo listens off its own route to the "
                                         "master (its gloo_off_route)"),
    ("syn_sent_to_gloo_loopback", bool, "that rank's Gloo listens on loopback (its "
                                        "gloo_loopback)"),
    ("gloo_unreached_by", int, "peers whose connects to this rank's Gloo address sit in "
                               "SYN-SENT", "count"),
    ("loopback_peer", int, "another rank of a multi-node job whose Gloo listens on loopback and "
                           "is not connected to all its peers (None: no such rank)"),
)


def measure(history: tuple[Snapshot, ...], pid: int) -> dict:
    """Where the rank's Gloo listens, against where it reaches the master from.

    The address on the rank's own connection to the master is the yardstick:
    that route reaches the other nodes. Off it is suspect when the hostname chose
    the address (a VPN's DNS resolves hostnames to its own addresses), or it is a
    VPN, bridge or veth, or of the other family. A deliberate data network
    (GLOO_SOCKET_IFNAME=ib0, the store over eth0) is none of these and is not
    flagged; nor is a rank connected to all its peers (gloo_unconnected 0)."""
    last = history[-1]
    now = proc_of(last, pid)
    if now is None or last.sockets is None:
        return {}
    port = now.env.get("MASTER_PORT", "")
    master = int(port) if port.isdigit() else -1
    socks = sockets_of(last, pid)
    s: dict = {"gloo_ifname": now.env.get("GLOO_SOCKET_IFNAME", "")}
    listening = [k for k in socks if k.state == "LISTEN"
                 and k.local_port != master and not _wildcard(k.local_addr)]
    # any state: a connection the master closed (CLOSE-WAIT) still took the route
    routes = [k.local_addr for k in socks if k.peer_port == master and k.state != "LISTEN"]
    world = now.env.get("WORLD_SIZE", "")
    if world.isdigit():
        data = sum(1 for k in socks if k.state == "ESTABLISHED"
                   and master not in (k.peer_port, k.local_port))
        s["gloo_unconnected"] = max(int(world) - 1 - data, 0)
    ifaces = _interfaces(last, pid)
    if listening:
        gloo = listening[0].local_addr
        name, kind = interface_of(gloo, ifaces)
        s.update(gloo_addr=plain_addr(gloo), gloo_port=listening[0].local_port, gloo_iface=name,
                 gloo_iface_kind=kind, gloo_loopback=is_loopback(plain_addr(gloo)))
    if routes:
        s["master_route_addr"] = plain_addr(routes[0])
        s["master_route_iface"] = interface_of(routes[0], ifaces)[0]
    if listening and routes and not is_loopback(plain_addr(routes[0])):
        gloo, route = s["gloo_addr"], s["master_route_addr"]
        s["gloo_off_route"] = gloo != route and not s["gloo_loopback"] and (
            not s["gloo_ifname"] or s["gloo_iface_kind"] in SUSPECT_KINDS
            or (":" in gloo) != (":" in route))
    return s


def _interfaces(snap: Snapshot, pid: int) -> tuple[Interface, ...]:
    """The interfaces of the rank's network namespace: read there by the sockets
    or the nshost probe when it is not the watcher's (a container's), else the
    host probe's."""
    entry = socket_entry(snap, pid)
    if entry is not None and entry.interfaces is not None:
        return entry.interfaces
    view = ns_view(snap, pid)
    if view is not None and "net:" in view.namespaces:
        return view.interfaces or ()  # unread there: unknown, never the watcher's
    return snap.host.interfaces if snap.host else ()


def dialled(rank: dict, by_endpoint: dict) -> dict | None:
    """The rank of `by_endpoint` ("addr:port" -> rank signals) that `rank`'s
    connect stuck in SYN-SENT dials, if any (never `rank` itself)."""
    host, _, port = (rank.get("syn_sent_to") or "").rpartition(":")
    peer = by_endpoint.get(f"{plain_addr(host.strip('[]'))}:{port}")
    return peer if peer is not rank and rank.get("syn_sent") else None


def _wildcard(addr: str) -> bool:
    return addr in ("0.0.0.0", "::", "")


@cross_rank(writes=("gloo_unreached_by", "loopback_peer", "syn_sent_to_gloo_loopback",
                    "syn_sent_to_gloo_off_route", "syn_sent_to_rank"))
def link(ranks: list[dict]) -> None:
    """Tie each connect stuck in SYN-SENT to the rank whose Gloo address it dials
    (`syn_sent_to_rank`, with whether that rank listens off its route or on
    loopback), and count, for that rank, the peers whose connects to it get no
    answer (`gloo_unreached_by`). A rank listening off its route to the master,
    or on loopback (rule unreachable-peer-off-route takes either), is then the
    cause, not the firewall the connecting rank's own evidence suggests. And
    name, for each rank, a peer whose Gloo listens on loopback (`loopback_peer`):
    the cause of a rank that failed to start."""
    listeners = {}
    for p in ranks:
        if p.get("gloo_addr") and p.get("gloo_port"):
            listeners[f"{plain_addr(p['gloo_addr'])}:{p['gloo_port']}"] = p
    # Refused rather than unanswered: a peer's Gloo on loopback sends this
    # node's ranks to their own loopback.
    on_loopback = [p.get("rank") for p in ranks if p.get("alive") and p.get("gloo_loopback")
                   and (p.get("gloo_unconnected") or 0) >= 1 and not p.get("all_ranks_local")]
    for p in ranks:
        p.setdefault("gloo_unreached_by", 0 if p.get("gloo_addr") else None)
        p["loopback_peer"] = next((r for r in on_loopback if r != p.get("rank")), None)
    for s in ranks:
        peer = dialled(s, listeners)
        if peer is None:
            continue
        s["syn_sent_to_rank"] = peer.get("rank")
        s["syn_sent_to_gloo_off_route"] = bool(peer.get("gloo_off_route"))
        s["syn_sent_to_gloo_loopback"] = bool(peer.get("gloo_loopback"))
        peer["gloo_unreached_by"] += 1
