"""Sockets probe: each rank's TCP connections, their queues and their silence.

Which sockets belong to a pid: the `socket:[INODE]` links in /proc/PID/fd. Their
addresses and states: /proc/PID/net/tcp{,6}, which is that pid's *network
namespace* view (ranks of a multi-node test run in their own namespaces). Byte
counters, retransmits, rtt and time since last send/receive: `ss -tineH`, run
inside the pid's namespace with nsenter when it is not ours, matched by inode.
For such a pid the namespace's interfaces too (`ip -o addr`): the host probe
lists the watcher's, and a rank in a container listens on the container's.

READ: `SocketsProbe`, `socket_inodes`, `read_table`, `read_ss`, `read_ip_addr`.
PARSE (pure): `parse_proc_net_tcp`, `parse_ss`, `parse_ip_addr`.
Unknown numbers are -1: a socket ss did not describe must not look freshly active.
"""
from __future__ import annotations

import errno
import ipaddress
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from functools import cached_property

from ... import codec
from ..system import programs
from ..budget import MAX_ADDRESSES, MAX_FDS, MAX_OUTPUT, TABLE_MAX_AGE_S, owner
from . import Look, Pass, Probe, ProbeContext, failure, register
from .host import SUSPECT_KINDS, Interface, interface_kind, plain_addr

# include/net/tcp_states.h; names as ss prints them, except ESTAB -> ESTABLISHED.
TCP_STATES = {
    1: "ESTABLISHED", 2: "SYN-SENT", 3: "SYN-RECV", 4: "FIN-WAIT-1", 5: "FIN-WAIT-2",
    6: "TIME-WAIT", 7: "CLOSE", 8: "CLOSE-WAIT", 9: "LAST-ACK", 10: "LISTEN",
    11: "CLOSING", 12: "NEW-SYN-RECV",
}
_SS_STATE = {"ESTAB": "ESTABLISHED", "UNCONN": "CLOSE"}


@dataclass(frozen=True)
class TableEntry:
    """One row of /proc/net/tcp{,6}."""
    inode: int
    family: str  # "tcp" | "tcp6"
    state: str
    local_addr: str
    local_port: int
    peer_addr: str
    peer_port: int
    send_q: int  # tx_queue: bytes not yet acked by the peer
    recv_q: int  # rx_queue: bytes not yet read by the process (LISTEN: accept backlog)
    retries: int  # consecutive unanswered retransmissions (SYN-SENT: SYN retries)


@dataclass(frozen=True)
class SsInfo:
    """One socket of `ss -tinH` / `-tineH` (inode 0 without -e)."""
    state: str
    local_addr: str
    local_port: int
    peer_addr: str
    peer_port: int
    recv_q: int
    send_q: int
    inode: int
    bytes_sent: int
    bytes_received: int
    bytes_acked: int
    retransmits: int  # total over the connection's life (retrans:cur/TOTAL)
    rtt_ms: float
    last_send_ms: int  # ms since the last send/receive; huge in SYN-SENT (never sent)
    last_recv_ms: int
    # times the retransmission timer fired in a row with no acknowledgement (ss
    # `backoff:`, the kernel's icsk_backoff; shown only when not 0): every RTO
    # doubles, so 3 or more is over a second of total silence from the far end
    backoff: int = -1


@dataclass(frozen=True)
class TcpSocket:
    inode: int
    family: str
    state: str
    local_addr: str
    local_port: int
    peer_addr: str
    peer_port: int
    recv_q: int
    send_q: int
    retries: int
    bytes_sent: int = -1
    bytes_received: int = -1
    bytes_acked: int = -1
    retransmits: int = -1
    rtt_ms: float = -1.0
    last_send_ms: int = -1
    last_recv_ms: int = -1
    backoff: int = -1  # SsInfo.backoff; -1 not read (a fixture older than the field)


@dataclass(frozen=True)
class PidSockets:
    """`error` non-empty: the pid could not be observed. `info_error`: ss failed for
    its namespace, so only the /proc fields are known."""
    pid: int
    net_ns: str = ""
    sockets: tuple[TcpSocket, ...] = ()
    error: str = ""
    info_error: str = ""
    # the interfaces of the pid's network namespace when it is not the watcher's
    # (None: the watcher's own, the host probe's; or not read on a lean pass)
    interfaces: tuple[Interface, ...] | None = None


@dataclass(frozen=True)
class Sockets:
    taken_at: float
    pids: tuple[PidSockets, ...]

    @cached_property
    def by_pid(self) -> dict[int, PidSockets]:
        """pid -> its first entry: judging 256 ranks looks each up in every
        snapshot of the window (judge/signals/lookup.py socket_entry)."""
        return {p.pid: p for p in reversed(self.pids)}

    @cached_property
    def ends(self) -> dict[tuple[str, int], int]:
        """(address, port) -> pid: the local ends of the established connections
        read. A rank's connection whose far end is another rank's links the two
        (judge/signals/sockets.py rank_links_idle_s); worked out once per reading,
        not once per rank."""
        return {(plain_addr(k.local_addr), k.local_port): p.pid for p in reversed(self.pids)
                for k in p.sockets if k.state == "ESTABLISHED"}


# ---------------------------------------------------------------- PARSE (pure)

def fmt_ip(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """IPv4-mapped IPv6 as '::ffff:10.0.0.1' (as ss prints it; Python < 3.13 would
    say '::ffff:a00:1'). Kept apart from plain IPv4: a v4/v6 family mismatch between
    ranks is itself a finding (Gloo's `ss_family == ss2.ss_family. 10 vs 2`)."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        return f"::ffff:{addr.ipv4_mapped}"
    return str(addr)


def _hex_addr(text: str, byteorder: str) -> str:
    """/proc/net/tcp prints addresses as 32-bit words in host byte order."""
    raw = bytes.fromhex(text)
    words = b"".join(int.from_bytes(raw[i:i + 4], byteorder).to_bytes(4, "big")
                     for i in range(0, len(raw), 4))
    return fmt_ip(ipaddress.ip_address(words))


def parse_proc_net_tcp(text: str, family: str = "tcp",
                       byteorder: str = sys.byteorder) -> tuple[TableEntry, ...]:
    """/proc/net/tcp or tcp6 (same columns, longer addresses)."""
    rows = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10:
            continue
        local, peer = f[1].split(":"), f[2].split(":")
        tx, rx = f[4].split(":")
        rows.append(TableEntry(
            inode=int(f[9]), family=family, state=TCP_STATES.get(int(f[3], 16), f[3]),
            local_addr=_hex_addr(local[0], byteorder), local_port=int(local[1], 16),
            peer_addr=_hex_addr(peer[0], byteorder), peer_port=int(peer[1], 16),
            send_q=int(tx, 16), recv_q=int(rx, 16), retries=int(f[6], 16)))
    return tuple(rows)


def _endpoint(text: str) -> tuple[str, int]:
    """ss endpoints: '10.0.0.1:29500', '[::ffff:127.0.0.1]:45840', '*:22',
    '127.0.0.1%lo:53' (bound to a device)."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]").partition("%")[0]
    if host == "*":
        host = "::"
    try:
        host = fmt_ip(ipaddress.ip_address(host))
    except ValueError:
        pass
    return host, int(port) if port.isdigit() else 0


def _ms(value: str) -> int:
    return int(float(value))


def parse_ss(text: str) -> tuple[SsInfo, ...]:
    """`ss -tin[e]H`: a socket line, then an indented info line (blank for
    TIME-WAIT). Only `key:value` tokens are read; `send 1bps` style pairs skipped."""
    out = []
    head: list[str] | None = None
    info: dict[str, str] = {}

    def flush():
        if head is None:
            return
        local, peer = _endpoint(head[3]), _endpoint(head[4])
        extra = dict(t.split(":", 1) for t in head[5:] if ":" in t)
        retrans = info.get("retrans", "0/0").partition("/")[2] or "0"
        has_info = bool(info)
        out.append(SsInfo(
            state=_SS_STATE.get(head[0], head[0]), local_addr=local[0],
            local_port=local[1], peer_addr=peer[0], peer_port=peer[1],
            recv_q=int(head[1]), send_q=int(head[2]), inode=int(extra.get("ino", "0")),
            bytes_sent=int(info.get("bytes_sent", "0")) if has_info else -1,
            bytes_received=int(info.get("bytes_received", "0")) if has_info else -1,
            bytes_acked=int(info.get("bytes_acked", "0")) if has_info else -1,
            retransmits=int(retrans) if has_info else -1,
            rtt_ms=float(info["rtt"].partition("/")[0]) if "rtt" in info else -1.0,
            last_send_ms=_ms(info["lastsnd"]) if "lastsnd" in info else -1,
            last_recv_ms=_ms(info["lastrcv"]) if "lastrcv" in info else -1,
            backoff=int(info.get("backoff", "0")) if has_info else -1))

    for line in text.splitlines():
        if not line.strip():
            continue
        if line[0].isspace():  # info line of the socket above
            info = dict(t.split(":", 1) for t in line.split() if ":" in t)
            continue
        flush()
        head, info = line.split(), {}
    flush()
    return tuple(out)


_SS_FIELDS = ("bytes_sent", "bytes_received", "bytes_acked", "retransmits", "rtt_ms",
              "last_send_ms", "last_recv_ms", "backoff")


def merge(entry: TableEntry, ss: SsInfo | None) -> TcpSocket:
    base = TcpSocket(entry.inode, entry.family, entry.state, entry.local_addr,
                     entry.local_port, entry.peer_addr, entry.peer_port,
                     entry.recv_q, entry.send_q, entry.retries)
    if ss is None:
        return base
    return replace(base, **{k: getattr(ss, k) for k in _SS_FIELDS})


def match(entries, infos) -> dict[int, SsInfo]:
    """{inode: SsInfo}. By `ino:` (ss -e); without it, by the 4-tuple."""
    by_ino = {i.inode: i for i in infos if i.inode}
    by_tuple = {(i.local_addr, i.local_port, i.peer_addr, i.peer_port): i for i in infos}
    out = {}
    for e in entries:
        hit = by_ino.get(e.inode) or by_tuple.get(
            (e.local_addr, e.local_port, e.peer_addr, e.peer_port))
        if hit is not None:
            out[e.inode] = hit
    return out


# ---------------------------------------------------------------- READ (impure)

def socket_inodes(procfs: str, pid: int, limit: int = 0) -> set[int]:
    """Inodes of the pid's sockets; raises OSError if the fd table is unreadable,
    or (with `limit`) holds more than `limit` files: a reader of every user's
    processes bounds what one of them costs it."""
    inodes = set()
    fd_dir = f"{procfs}/{pid}/fd"
    with os.scandir(fd_dir) as entries:
        fds = [e.name for _, e in zip(range(limit + 1 if limit else sys.maxsize), entries)]
    if limit and len(fds) > limit:
        raise OSError(errno.EMFILE, f"more than {limit} open files", fd_dir)
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue  # closed between listdir and readlink
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def read_table(procfs: str, pid: int) -> tuple[TableEntry, ...]:
    rows: tuple[TableEntry, ...] = ()
    for family in ("tcp", "tcp6"):
        try:
            with open(f"{procfs}/{pid}/net/{family}") as f:
                rows += parse_proc_net_tcp(f.read(), family)
        except FileNotFoundError:
            if family == "tcp":
                raise
            # tcp6 is absent when IPv6 is disabled
    return rows


def parse_ip_addr(text: str) -> tuple[Interface, ...]:
    """`ip -o addr show up`: one line per address, e.g.
    `5: eth0@if6    inet 10.0.0.2/24 brd 10.0.0.255 scope global eth0\\ ...`.
    Link-local IPv6 gets its %scope, as psutil (the host probe) writes it."""
    addrs: dict[str, list[str]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ("inet", "inet6"):
            continue
        name = fields[1].partition("@")[0]  # veth peers: eth0@if6
        addr = fields[3].partition("/")[0]
        if fields[2] == "inet6" and addr.lower().startswith("fe80:"):
            addr = f"{addr}%{name}"
        addrs.setdefault(name, []).append(addr)
    # only up ones are listed; mtu and speed are not said (0)
    return tuple(Interface(name, tuple(ips), True, 0, 0, interface_kind(name),
                           interface_kind(name) in SUSPECT_KINDS)
                 for name, ips in sorted(addrs.items()))


def read_ip_addr(ns_path: str, timeout_s: float) -> str:
    """`ip -o addr show up` inside the namespace `ns_path` (needs root), its
    first MAX_ADDRESSES lines: any user may give a namespace of theirs 20 000."""
    nsenter, ip = _tool("nsenter"), _tool("ip")
    cmd = [nsenter, f"--net={ns_path}", ip, "-o", "addr", "show", "up"]
    text = programs.run_bounded(cmd, timeout_s, MAX_OUTPUT)
    return "\n".join(text.splitlines()[:MAX_ADDRESSES])


def read_ss(ns_path: str | None, timeout_s: float) -> str:
    """`ss -tineH`, inside the namespace `ns_path` (needs root) when given."""
    cmd = [_tool("ss"), "-tineH"]
    if ns_path:
        cmd = [_tool("nsenter"), f"--net={ns_path}"] + cmd
    return programs.run_bounded(cmd, timeout_s, MAX_OUTPUT)


def _tool(name: str) -> str:
    """A helper's absolute path, resolved once (observe/system/programs.py)."""
    found = programs.path(name)
    if found is None:
        raise FileNotFoundError(f"{name} ({'util-linux' if name == 'nsenter' else 'iproute2'})"
                                f" not found")
    return found


def _ns(procfs: str, pid: int | str) -> str:
    try:
        return os.readlink(f"{procfs}/{pid}/ns/net")
    except OSError:
        return ""


IFACES_MAX_AGE_S = 60.0  # as nshost.MAX_AGE_S
LEFT_OUT_NETNS = ("left out: its user's network namespaces past what one pass reads "
                  "(observe/budget.py)")


class LeftOut(Exception):
    """A read its user's budget for the pass refused (observe/budget.py)."""


# Per-rank TCP sockets: state, queues, bytes, retransmits, idle ms.
# Sooner for a job without heartbeats: its connections to its peers then say it
# got past start-up (rules/default.yaml `starting`); again at STACKS with `ss -ti`.
@register("sockets", look=Look.DETAIL, sooner_if_silent=Look.GLANCE, again_at=Look.STACKS)
class SocketsProbe(Probe):
    """Keeps what it read of network namespaces other than the watcher's
    (`kept`: ("table" | "ip", namespace) -> (read at, what was read)): a
    namespace's socket table stands TABLE_MAX_AGE_S for a user past their
    budget, its interfaces IFACES_MAX_AGE_S (nshost reads them through this
    probe too)."""

    def __init__(self):
        self.kept: dict = {}

    def run(self, ctx: ProbeContext, seen: Pass, pids: tuple[int, ...]) -> Sockets:
        socket_info = seen.look >= Look.STACKS  # `ss -ti` too; the daemon's lean passes: /proc
        if socket_info:
            _tool("ss")  # blind without it
        taken_at = ctx.clock()
        self._forget_old(taken_at)
        # ss runs in our namespace unless told otherwise. "self" under ctx.procfs, so a
        # daemon reading a host /proc mounted elsewhere compares like with like; a
        # fixture tree has no self: "" then means never nsenter.
        own_ns = _ns(ctx.procfs, "self")
        # one read per namespace, shared by the pass's jobs when there is a budget
        budget = seen.budget
        memo = budget.memo if budget is not None else {}
        tables: dict[str, tuple[TableEntry, ...]] = {}
        infos: dict[str, tuple[tuple[SsInfo, ...], str]] = {}
        ifaces: dict[str, tuple[Interface, ...] | None] = {}
        # namespace -> inode -> (place in its table, entry): a job of n ranks over
        # Gloo holds ~n^2 connections, and each rank's are looked up in them
        indexes: dict[str, dict[int, tuple[int, TableEntry]]] = {}
        out = []
        for pid in pids:
            foreign = False
            try:
                try:
                    inodes = socket_inodes(ctx.procfs, pid, MAX_FDS)
                except OSError as err:
                    if err.errno != errno.EMFILE:
                        raise
                    if budget is not None:
                        budget.count("fds")
                    out.append(PidSockets(pid, error=f"left out: {err.strerror}"))
                    continue
                ns = _ns(ctx.procfs, pid)
                foreign = bool(ns and own_ns and ns != own_ns)
                if not inodes:
                    pass  # no socket to look up: a namespace's table costs a walk of the
                    # kernel's whole connection hash (observe/budget.py)
                elif ns and ("table", ns) in memo:
                    tables[ns] = memo["table", ns]
                elif ns not in tables or not ns:
                    kept = self.kept.get(("table", ns)) if foreign else None
                    if foreign and budget is not None and not budget.take(
                            "netns", owner(ctx.procfs, pid)):
                        if kept is None or ctx.clock() - kept[0] >= TABLE_MAX_AGE_S:
                            out.append(PidSockets(pid, ns, error=LEFT_OUT_NETNS))
                            continue
                        tables[ns] = kept[1]  # its user's namespaces are read in turn
                    else:
                        tables[ns] = read_table(ctx.procfs, pid)
                        if foreign:
                            self.kept["table", ns] = (ctx.clock(), tables[ns])
                    if ns:
                        memo["table", ns] = tables[ns]
            except (FileNotFoundError, ProcessLookupError, PermissionError) as err:
                out.append(PidSockets(pid, error=failure(err)))
                continue
            if ns not in infos and not socket_info:
                infos[ns] = ((), "")  # states and queues from /proc are enough this time
            if ns not in infos and ns and ("ss", ns) in memo:
                infos[ns], ifaces[ns] = memo["ss", ns]
            if ns not in infos:
                infos[ns], ifaces[ns] = self._ss_and_interfaces(ctx, budget, pid, ns, foreign)
                if ns:
                    memo["ss", ns] = (infos[ns], ifaces[ns])
            ss_rows, info_error = infos[ns]
            index = indexes.get(ns)
            if index is None:
                index = indexes[ns] = {}
                for i, e in enumerate(tables.get(ns, ())):
                    index.setdefault(e.inode, (i, e))
            mine = [e for _, e in sorted((index[i] for i in inodes if i in index),
                                         key=lambda found: found[0])]
            found = match(mine, ss_rows)
            out.append(PidSockets(pid, ns, tuple(merge(e, found.get(e.inode)) for e in mine),
                                  info_error=info_error, interfaces=ifaces.get(ns)))
        return Sockets(taken_at, tuple(out))

    def namespace_addresses(self, ctx: ProbeContext, budget, pid: int,
                            ns: str) -> tuple[Interface, ...]:
        """The interfaces and addresses of pid's network namespace `ns`, by `ip -o
        addr` (MAX_ADDRESSES at most), kept IFACES_MAX_AGE_S: this probe and nshost
        both ask, and a namespace of 20 000 addresses then costs an `ip` run a
        minute, not one per probe and tick. LeftOut past its user's helper runs
        in the pass's `budget`; OSError, RuntimeError or SubprocessError when `ip`
        fails."""
        self._forget_old(ctx.clock())
        kept = self.kept.get(("ip", ns))
        if kept is not None and ctx.clock() - kept[0] < IFACES_MAX_AGE_S:
            return kept[1]
        if budget is not None and not budget.take("helper_runs", owner(ctx.procfs, pid)):
            raise LeftOut("its user's helper runs past what one pass allows")
        ifaces = parse_ip_addr(read_ip_addr(f"{ctx.procfs}/{pid}/ns/net", ctx.timeout_s))
        self.kept["ip", ns] = (ctx.clock(), ifaces)
        return ifaces

    def _ss_and_interfaces(self, ctx: ProbeContext, budget, pid: int, ns: str, foreign: bool):
        """((`ss -ti` rows, error), the namespace's interfaces or None) for pid's
        namespace `ns`: one helper run each, within the pass's budget for its user."""
        if budget is not None and not budget.take("helper_runs", owner(ctx.procfs, pid)):
            return ((), "left out: its user's helper runs past what one pass allows"), None
        try:
            info = (parse_ss(read_ss(f"{ctx.procfs}/{pid}/ns/net" if foreign else None,
                                     ctx.timeout_s)), "")
        except (OSError, RuntimeError, subprocess.SubprocessError) as err:
            info = ((), f"{type(err).__name__}: {err}")
        if not foreign:
            return info, None
        try:
            return info, self.namespace_addresses(ctx, budget, pid, ns)
        except LeftOut:
            why = "interfaces: left out"
        except (OSError, RuntimeError, subprocess.SubprocessError) as err:
            why = f"interfaces: {type(err).__name__}: {err}"
        return (info[0], "; ".join(filter(None, (info[1], why)))), None

    def _forget_old(self, now: float) -> None:
        """What no read would stand on any more (every kind is older than it may be)."""
        for key in [k for k, (at, _) in self.kept.items() if now - at >= IFACES_MAX_AGE_S]:
            del self.kept[key]


def from_json(obj) -> Sockets:
    return codec.from_json(Sockets, obj)
