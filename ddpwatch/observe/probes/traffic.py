"""Traffic probe: TCP connection attempts seen on this node's interfaces.

The sockets probe shows a connect stuck in SYN-SENT on the node that dials; the
node that drops it shows nothing at all: its rank just waits at rendezvous. On
the wire the dropping node is plain to see: the peer's SYNs arrive, again and
again, and no SYN-ACK (nor RST) leaves. That is the field's first failure, a
worker's firewall that lets MASTER_PORT in and drops Gloo's data connections.

A packet socket (AF_PACKET, cooked, every interface but loopback) with a classic
BPF filter that the kernel runs before anything is copied: only TCP segments
with SYN or RST set pass, the few packets that open or refuse connections, so a
training job's gigabytes cost nothing. Packet sockets see inbound frames before
the firewall (netfilter INPUT) drops them, and outbound ones after it passed
them. Needs CAP_NET_RAW; sees the watcher's network namespace only.

The capture is opened once (`SynCapture`) and kept by the probe's object
(`TrafficProbe`, made once for the daemon or a diagnose) while the probe is on,
drained every pass: SYN retries come seconds apart, so a connect is judged over
what accumulated, not over one instant. Headers are parsed with struct: scapy
would cost the daemon some 40 MB for 40 bytes.

READ: `SynCapture`, `TrafficProbe`. PARSE (pure): `parse_segment`, `SynLedger`.
"""
from __future__ import annotations

import ctypes
import dataclasses
import ipaddress
import os
import socket
import struct
import time
from dataclasses import dataclass

from ... import codec
from ..system.netns import net_ns, run_in_net_ns
from . import Pass, Probe, ProbeContext, register

ETH_P_ALL = 0x0003
ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
SO_ATTACH_FILTER = 26
SO_TIMESTAMPNS = SCM_TIMESTAMPNS = 35  # each packet's arrival, not when we got to it
SOL_PACKET, PACKET_STATISTICS = 263, 6
PACKET_HOST, PACKET_OUTGOING = 0, 4
SYN, RST, ACK = 0x02, 0x04, 0x10
KEEP_S = 300.0      # a flow not seen again for this long is forgotten
MAX_FLOWS = 4096    # and at most this many are kept (a SYN flood must not grow us)

# Classic BPF over a cooked packet (offsets from the network header): IPv4 (not a
# later fragment) or IPv6 (no extension headers), protocol TCP, flags & (SYN|RST):
# keep the first 96 bytes (headers); anything else: drop. (jt, jf: instructions
# to skip.)
_BPF = (
    (0x28, 0, 0, 0xFFFFF000),  # 0  ld   proto (SKF_AD_PROTOCOL)
    (0x15, 0, 7, ETH_P_IP),    # 1  jeq  #IPv4 ? 2 : 9
    (0x30, 0, 0, 9),           # 2  ldb  [9]           IPv4 protocol
    (0x15, 0, 11, 6),          # 3  jeq  #TCP ? 4 : 15
    (0x28, 0, 0, 6),           # 4  ldh  [6]           flags, fragment offset
    (0x45, 9, 0, 0x1FFF),      # 5  jset #offset ? 15 : 6
    (0xB1, 0, 0, 0),           # 6  ldxb 4*([0]&0xf)   IPv4 header length
    (0x50, 0, 0, 13),          # 7  ldb  [x+13]        TCP flags
    (0x45, 5, 6, SYN | RST),   # 8  jset ? 14 : 15
    (0x15, 0, 5, ETH_P_IPV6),  # 9  jeq  #IPv6 ? 10 : 15
    (0x30, 0, 0, 6),           # 10 ldb  [6]           next header
    (0x15, 0, 3, 6),           # 11 jeq  #TCP ? 12 : 15
    (0x30, 0, 0, 53),          # 12 ldb  [53]          TCP flags (40 + 13)
    (0x45, 0, 1, SYN | RST),   # 13 jset ? 14 : 15
    (0x06, 0, 0, 96),          # 14 ret  #96
    (0x06, 0, 0, 0),           # 15 ret  #0
)
_REJECT_ALL = ((0x06, 0, 0, 0),)


@dataclass(frozen=True)
class SynFlow:
    """One connection attempt (a 4-tuple), as seen on this node's interfaces."""
    direction: str   # "in": a peer dials us; "out": we dial a peer
    src: str
    sport: int
    dst: str
    dport: int
    iface: str
    syns: int        # SYNs seen: more than one means the dialer got no answer and retried
    first_s: float   # monotonic
    last_s: float
    answer: str      # "syn-ack" | "rst" | "" (none seen)


@dataclass(frozen=True)
class Traffic:
    taken_at: float
    since: float     # the capture runs since: attempts before it are unknown
    net_ns: str      # the namespace captured ("net:[...]"): other namespaces' ranks not
    flows: tuple[SynFlow, ...]
    lost: int = 0             # packets the kernel dropped for want of buffer, since open
    last_loss_s: float = -1.0  # when a drain last found some lost: answers may be missing


def local_ports(sockets) -> set[int]:
    """The local ports of a sockets probe's result (probes/sockets.Sockets)."""
    if sockets is None:
        return set()
    return {k.local_port for p in sockets.pids for k in p.sockets}


def for_ports(traffic: Traffic | None, ports: set[int]) -> Traffic | None:
    """Only the attempts to or from these local ports (a job's sockets'): what a
    snapshot of the job keeps, not the node's other connections."""
    if traffic is None:
        return None
    flows = tuple(f for f in traffic.flows
                  if (f.dport if f.direction == "in" else f.sport) in ports)
    return dataclasses.replace(traffic, flows=flows)


# ---------------------------------------------------------------- PARSE (pure)

def parse_segment(data: bytes, ethertype: int) -> tuple[str, int, str, int, int] | None:
    """(src, sport, dst, dport, tcp flags) of a cooked IPv4/IPv6 TCP packet."""
    try:
        if ethertype == ETH_P_IP:
            ihl = (data[0] & 0x0F) * 4
            if data[9] != 6:
                return None
            src, dst, tcp = data[12:16], data[16:20], data[ihl:]
        elif ethertype == ETH_P_IPV6:
            if data[6] != 6:
                return None
            src, dst, tcp = data[8:24], data[24:40], data[40:]
        else:
            return None
        sport, dport = struct.unpack_from("!HH", tcp)
        return (str(ipaddress.ip_address(src)), sport, str(ipaddress.ip_address(dst)), dport,
                tcp[13])
    except (IndexError, struct.error, ValueError):
        return None


class SynLedger:
    """Connection attempts by 4-tuple, and whether this node saw them answered."""

    def __init__(self):
        self._flows: dict[tuple, dict] = {}

    def add(self, segment: tuple[str, int, str, int, int], outgoing: bool, iface: str,
            now: float) -> None:
        src, sport, dst, dport, flags = segment
        if flags & SYN and not flags & ACK:  # an attempt: ours out, a peer's in
            key = (src, sport, dst, dport)
            flow = self._flows.get(key)
            if flow is None:
                flow = self._flows[key] = dict(direction="out" if outgoing else "in", src=src,
                                               sport=sport, dst=dst, dport=dport, iface=iface,
                                               syns=0, first_s=now, answer="")
            if flow["iface"] == iface:  # a bridge and its port both see each SYN
                flow["syns"] += 1
                flow["last_s"] = now
        elif flags & (SYN | RST):  # an answer travels the other way
            flow = self._flows.get((dst, dport, src, sport))
            if flow is not None and (flow["direction"] == "in") == outgoing:
                flow["answer"] = "syn-ack" if flags & SYN else "rst"
                flow["last_s"] = now

    def flows(self, now: float) -> tuple[SynFlow, ...]:
        for key in [k for k, f in self._flows.items() if now - f["last_s"] > KEEP_S]:
            del self._flows[key]
        if len(self._flows) > MAX_FLOWS:  # keep the newest
            newest = sorted(self._flows.items(), key=lambda kv: kv[1]["last_s"])[-MAX_FLOWS:]
            self._flows = dict(newest)
        return tuple(SynFlow(**f) for f in self._flows.values())


# ---------------------------------------------------------------- READ (impure)

class SynCapture:
    """The open packet socket and what it has seen. `open()` raises OSError
    (PermissionError without CAP_NET_RAW); `close()` when done."""

    def __init__(self, sock: socket.socket, clock, net_ns: str):
        self._sock, self._clock, self.net_ns = sock, clock, net_ns
        self.since = clock()
        self.ledger = SynLedger()
        self.lost, self.last_loss_s = 0, -1.0

    @classmethod
    def open(cls, clock, procfs: str = "/proc", pid: int | None = None) -> "SynCapture":
        """`pid`: capture in that process's network namespace (observe/system/netns.py)
        instead of ours."""
        if pid is None:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
        else:
            sock = run_in_net_ns(procfs, pid, lambda: socket.socket(
                socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL)))
        try:
            # Packets queue from the moment the socket exists: let none in until the
            # real filter is attached, then throw away what came before.
            _attach(sock, _REJECT_ALL)
            sock.setblocking(False)
            while True:
                try:
                    sock.recv(1)
                except (BlockingIOError, InterruptedError):
                    break
            _attach(sock, _BPF)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            # a burst of a job's connects (each pair of ranks) must fit between drains
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            return cls(sock, clock, net_ns(procfs, "self" if pid is None else pid))
        except BaseException:
            sock.close()
            raise

    def drain(self) -> None:
        now = self._clock()
        try:  # struct tpacket_stats; reading it resets the kernel's counters
            _, drops = struct.unpack("II", self._sock.getsockopt(
                SOL_PACKET, PACKET_STATISTICS, 8))
        except OSError:
            drops = 0
        if drops:
            self.lost += drops
            self.last_loss_s = now
        wall_to_clock = now - time.time()  # packet stamps are wall-clock time
        for _ in range(100_000):  # bounded: a SYN flood must not hold the tick
            try:
                data, ancillary, _, (iface, ethertype, pkttype, _, _) = self._sock.recvmsg(
                    128, socket.CMSG_SPACE(16))
            except (BlockingIOError, InterruptedError):
                return
            if iface == "lo" or pkttype not in (PACKET_HOST, PACKET_OUTGOING):
                continue  # loopback is seen twice and is never firewalled in our cases
            segment = parse_segment(data, ethertype)
            if segment is not None:
                self.ledger.add(segment, pkttype == PACKET_OUTGOING, iface,
                                _stamp(ancillary, now, wall_to_clock))

    def snapshot(self) -> Traffic:
        self.drain()
        now = self._clock()
        return Traffic(now, self.since, self.net_ns, self.ledger.flows(now), self.lost,
                       self.last_loss_s)

    def close(self) -> None:
        self._sock.close()


def _attach(sock: socket.socket, program) -> None:
    code = b"".join(struct.pack("HBBI", *insn) for insn in program)  # struct sock_filter
    insns = ctypes.create_string_buffer(code)
    fprog = struct.pack("HP", len(program), ctypes.addressof(insns))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


class NoCapture:
    """A capture that could not be opened: the probe then fails, saying why."""

    def __init__(self, why: str):
        self.why = why

    def snapshot(self) -> Traffic:
        raise RuntimeError(self.why)

    def close(self) -> None:
        pass


def open_capture(clock, procfs: str = "/proc", pid: int | None = None) -> SynCapture | NoCapture:
    """`pid`: in that process's network namespace (a rank on a namespace node)."""
    try:
        return SynCapture.open(clock, procfs, pid)
    except OSError as err:
        hint = " (needs CAP_NET_RAW: run as root)" if isinstance(err, PermissionError) else ""
        where = "" if pid is None else f" in pid {pid}'s network namespace"
        return NoCapture(f"cannot open a packet socket{where}: {err.strerror or err}{hint}")


def _stamp(ancillary, default: float, wall_to_clock: float) -> float:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = struct.unpack_from("qq", data)
            return min(sec + nsec / 1e9 + wall_to_clock, default)
    return default


def for_job(traffic: Traffic, job, data: dict) -> Traffic:
    """The node's connection attempts that concern a job: to or from its sockets'
    ports (`data`: its job probes' by Snapshot field)."""
    return for_ports(traffic, local_ports(data.get("sockets")))


# TCP connection attempts (SYN, SYN-ACK, RST) on this node's interfaces: a peer's
# connects this node drops (root)
@register("traffic", scope="node", for_job=for_job)
class TrafficProbe(Probe):
    """Holds the packet capture while on, drained every pass (packets carry
    their own times): it stays open while the probe stays on, so a reload
    (SIGHUP) loses no attempt."""

    def __init__(self):
        self.capture: SynCapture | NoCapture | None = None

    def switch(self, ctx: ProbeContext, on: bool) -> None:
        if on and self.capture is None:
            self.capture = open_capture(ctx.clock, ctx.procfs)
        elif not on:
            self.close()

    def capture_net_of(self, ctx: ProbeContext, pid: int) -> None:
        """Watch the wire of `pid`'s network namespace instead of ours: a rank on a
        namespace node, judged from the host, with the connects that arrive there.
        Nothing changes when the capture is off or already there."""
        if self.capture is None or net_ns(ctx.procfs, pid) in (
                "", getattr(self.capture, "net_ns", "")):
            return
        self.capture.close()
        self.capture = open_capture(ctx.clock, ctx.procfs, pid)

    def run(self, ctx: ProbeContext, seen: Pass, pids: tuple[int, ...]) -> Traffic:
        if self.capture is None:
            raise RuntimeError("no packet capture was opened for this probe")
        return self.capture.snapshot()

    def close(self) -> None:
        if self.capture is not None:
            self.capture.close()
            self.capture = None


def from_json(obj) -> Traffic:
    return codec.from_json(Traffic, obj)
