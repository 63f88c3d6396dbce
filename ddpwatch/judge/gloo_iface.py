"""Which interface a rank's Gloo listens on, and whether its peers can use it.

Gloo tells its peers, through the store, the address it listens on: the one
of GLOO_SOCKET_IFNAME, else what the hostname resolves to. Peers on other
nodes then connect there: for each pair of ranks the one with the higher
address connects to the other (this torch's Gloo). The field's failures: a
hostname resolving to 127.0.1.1 (Debian's /etc/hosts, nsswitch `myhostname`),
so peers are told to dial their own loopback; a docker bridge or a VPN
address only one node has; IPv6 on one node and IPv4 on another.

`interface_signals` measures one rank; `link_unreached` then ties a rank's
connect that gets no answer to the peer whose Gloo address it dials. Pure.
"""
from __future__ import annotations

from ..observe.probes.host import Interface, is_loopback
from .signals import proc_of, socket_entry, sockets_of
from ..observe.snapshot import Snapshot

SUSPECT_KINDS = ("vpn", "bridge", "veth")


def interface_signals(history: tuple[Snapshot, ...], pid: int) -> dict:
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
    probe when it is not the watcher's (a container's), else the host probe's."""
    entry = socket_entry(snap, pid)
    if entry is not None and entry.interfaces is not None:
        return entry.interfaces
    return snap.host.interfaces if snap.host else ()


def interface_of(addr: str, interfaces: tuple[Interface, ...]) -> tuple[str | None, str | None]:
    """(name, kind) of the interface holding `addr`, (None, None) when none of
    `interfaces` does (a rank in another network namespace, not read on a lean
    pass). All of 127/8 is loopback though `lo` lists only 127.0.0.1."""
    plain = plain_addr(addr)
    for iface in interfaces:
        if plain in (a.partition("%")[0] for a in iface.addresses):
            return iface.name, iface.kind
    return ("lo", "loopback") if is_loopback(plain) else (None, None)


def dialled(rank: dict, by_endpoint: dict) -> dict | None:
    """The rank of `by_endpoint` ("addr:port" -> rank signals) that `rank`'s
    connect stuck in SYN-SENT dials, if any (never `rank` itself)."""
    host, _, port = (rank.get("syn_sent_to") or "").rpartition(":")
    peer = by_endpoint.get(f"{plain_addr(host.strip('[]'))}:{port}")
    return peer if peer is not rank and rank.get("syn_sent") else None


def plain_addr(addr: str) -> str:
    """'::ffff:10.0.0.1' (an IPv4 peer on an IPv6 socket) as '10.0.0.1'."""
    return addr[7:] if addr.startswith("::ffff:") else addr


def _wildcard(addr: str) -> bool:
    return addr in ("0.0.0.0", "::", "")


def link_unreached(ranks: list[dict]) -> None:
    """Tie each connect stuck in SYN-SENT to the rank whose Gloo address it dials
    (`syn_sent_to_rank`), and count, for that rank, the peers whose connects to
    it get no answer (`gloo_unreached_by`). A rank listening off its route to
    the master is then the cause, not the firewall the connecting rank's own
    evidence suggests. And name, for each rank, a peer whose Gloo listens on
    loopback (`loopback_peer`): the cause of a rank that failed to start."""
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
        s["syn_sent_to_off_route"] = bool(peer.get("gloo_off_route") or peer.get("gloo_loopback"))
        peer["gloo_unreached_by"] += 1
