"""Exits probe: how the ranks of watched jobs ended (killed by which signal, or
which exit code), and when, from the kernel's process-events connector.

A SIGKILLed rank of a job without heartbeats takes the job with it within a
second: the peers' collectives fail ("Connection closed by peer") and mp.spawn
or Lightning tear everything down, before the next tick sees anything. Only the
parent learns a child's exit status (wait(2)), and the daemon is nobody's
parent. Ways to learn it anyway, as root:
* the process-events connector (netlink NETLINK_CONNECTOR, group CN_IDX_PROC):
  PROC_EVENT_EXIT carries pid, wait status and the kernel's monotonic stamp of
  every exit on the node, as it happens. Needs CAP_NET_ADMIN, the initial PID
  and user namespace; struct and socket only. Chosen.
* pidfd_open + waitid(P_PIDFD): waitid works for one's own children only.
* /proc polling at tick rate: sees that a pid is gone, never how; a zombie's
  stat has its exit code only until its parent reaps it (torchrun: 0.1 s).
* taskstats (genetlink, per-CPU exit listeners): the same facts at more cost.

The socket is opened once (`ExitWatch`) and kept by its owner (the sampler),
like the traffic capture. A classic BPF filter lets the kernel drop every event
but a process's (thread group leader's) exit before it is queued; a drain keeps
only the pids its caller watches (ranks and launchers of jobs), at most
MAX_KEPT, each for KEEP_S: any local user can fork and exit thousands of times
a second. Datagrams not sent by the kernel (netlink port 0) are dropped: local
users can unicast to our socket. The node's OOM-kill count (/proc/vmstat
oom_kill) is read at each drain, so a SIGKILL can be told apart as the OOM
killer's when the count rose in the same interval.

READ: `ExitWatch`, `open_watch`, `run`. PARSE (pure): `parse_datagram`,
`decode_status`.
"""
from __future__ import annotations

import collections
import ctypes
import errno
import os
import signal as signal_mod
import socket
import struct
import time
from dataclasses import dataclass

from ... import codec
from . import ProbeContext, register

NETLINK_CONNECTOR = 11
CN_IDX_PROC = CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN, PROC_CN_MCAST_IGNORE = 1, 2
PROC_EVENT_EXIT = 0x80000000
NLMSG_DONE = 3
SO_ATTACH_FILTER = 26
NLMSG = struct.Struct("=IHHII")          # struct nlmsghdr
CN_MSG = struct.Struct("=IIIIHH")        # struct cn_msg (data follows)
EVENT = struct.Struct("=IIQ")            # struct proc_event: what, cpu, timestamp_ns
EXIT = struct.Struct("=iiII")            # exit: pid, tgid, exit_code (wait status), exit_signal
EXIT_PARENT = struct.Struct("=ii")       # exit: parent_pid, parent_tgid (Linux >= 4.19)
EVENT_AT = NLMSG.size + CN_MSG.size      # 36: where struct proc_event starts
EXIT_AT = EVENT_AT + EVENT.size          # 52: where its exit data starts

KEEP_S = 300.0     # an exit is kept this long (a held job is judged meanwhile)
MAX_KEPT = 512     # and at most this many (newest kept)
MAX_DRAIN = 50_000  # datagrams per drain: a fork bomb must not hold the tick

# Classic BPF over each datagram (offsets from the nlmsghdr; loads are big-endian,
# the fields host order): pass exits of thread group leaders (pid == tgid), drop
# the rest (forks, execs, threads' exits). Loads past the end drop the datagram.
_EXIT_BE = struct.unpack("!I", struct.pack("=I", PROC_EVENT_EXIT))[0]
_BPF = (
    (0x20, 0, 0, EVENT_AT),      # 0 ld  [36]     what
    (0x15, 0, 5, _EXIT_BE),      # 1 jeq #EXIT ? 2 : 7
    (0x20, 0, 0, EXIT_AT + 4),   # 2 ld  [56]     tgid
    (0x07, 0, 0, 0),             # 3 tax
    (0x20, 0, 0, EXIT_AT),       # 4 ld  [52]     pid
    (0x1D, 0, 1, 0),             # 5 jeq x ? 6 : 7
    (0x06, 0, 0, 0xFFFF),        # 6 ret #65535
    (0x06, 0, 0, 0),             # 7 ret #0
)


@dataclass(frozen=True)
class ProcessExit:
    """One process's end, as the kernel reported it."""
    pid: int
    at: float        # monotonic seconds (the kernel's stamp of the exit)
    status: int      # the wait status, as waitpid(2) would have given its parent
    code: int        # exit code; -1 when a signal ended it
    signal: int      # the signal that ended it; 0 when it exited
    core: bool       # it dumped core
    ppid: int = -1   # its parent at exit (-1: the kernel does not say)
    oom_kills: int = 0  # the node's OOM kills in the drain interval of this exit

    @property
    def abnormal(self) -> bool:
        return bool(self.signal or self.code)

    @property
    def asked_to_stop(self) -> bool:
        """Ended by a signal that asks a program to stop: Ctrl-C (SIGINT to the
        whole foreground group), `kill`, scancel, systemd (SIGTERM), a closed
        terminal (SIGHUP). A person stopping a job is no incident."""
        return self.signal in (signal_mod.SIGINT, signal_mod.SIGTERM, signal_mod.SIGHUP)

    @property
    def how(self) -> str:
        """For people: "was killed by SIGKILL", "exited with code 1"."""
        if self.signal:
            name = signal_name(self.signal)
            oom = " (the kernel's OOM killer)" if self.signal == 9 and self.oom_kills else ""
            return f"was killed by {name}{oom}{' (core dumped)' if self.core else ''}"
        return f"exited with code {self.code}"


@dataclass(frozen=True)
class Exits:
    taken_at: float
    since: float                      # watched since: exits before it are unknown
    exits: tuple[ProcessExit, ...]    # of watched pids only, oldest first
    lost: int = 0                     # events the kernel dropped (full buffer) since open
    last_loss_s: float = -1.0         # when a drain last found some lost


def for_pids(exits: Exits | None, pids) -> Exits | None:
    """Only these pids' exits (a job's ranks and launcher): what a snapshot keeps."""
    if exits is None:
        return None
    wanted = set(pids)
    return Exits(exits.taken_at, exits.since, tuple(e for e in exits.exits if e.pid in wanted),
                 exits.lost, exits.last_loss_s)


# ---------------------------------------------------------------- PARSE (pure)

def signal_name(number: int) -> str:
    try:
        return signal_mod.Signals(number).name
    except ValueError:
        return f"signal {number}"


def decode_status(status: int) -> tuple[int, int, bool]:
    """(exit code or -1, signal or 0, core dumped) of a wait status."""
    status &= 0xFFFF
    sig = status & 0x7F
    if sig == 0:
        return (status >> 8) & 0xFF, 0, False
    if sig == 0x7F:  # stopped, not ended: never an exit's status
        return -1, 0, False
    return -1, sig, bool(status & 0x80)


def parse_datagram(data: bytes) -> list[tuple[int, int, int, int, int]]:
    """(pid, tgid, wait status, ppid or -1, timestamp ns) of every process exit in
    one netlink datagram from the connector; anything else, or malformed, is
    skipped (never raises)."""
    out, offset = [], 0
    while offset + NLMSG.size <= len(data):
        length, _type, _flags, _seq, _port = NLMSG.unpack_from(data, offset)
        if length < NLMSG.size or offset + length > len(data):
            break
        body = data[offset + NLMSG.size: offset + length]
        offset += (length + 3) & ~3  # NLMSG_ALIGN
        if len(body) < CN_MSG.size:
            continue
        idx, val, _seq, _ack, size, _flags = CN_MSG.unpack_from(body)
        payload = body[CN_MSG.size: CN_MSG.size + size]
        if (idx, val) != (CN_IDX_PROC, CN_VAL_PROC) or len(payload) < size or \
                size < EVENT.size + EXIT.size:
            continue
        what, _cpu, stamp = EVENT.unpack_from(payload)
        if what != PROC_EVENT_EXIT:
            continue
        pid, tgid, status, _exit_signal = EXIT.unpack_from(payload, EVENT.size)
        ppid = -1
        if size >= EVENT.size + EXIT.size + EXIT_PARENT.size:
            ppid = EXIT_PARENT.unpack_from(payload, EVENT.size + EXIT.size)[1]
        out.append((pid, tgid, status, ppid, stamp))
    return out


def to_exit(pid: int, status: int, ppid: int, at: float, oom_kills: int = 0) -> ProcessExit:
    code, sig, core = decode_status(status)
    return ProcessExit(pid, at, status, code, sig, core, ppid, oom_kills)


def oom_kill_count(vmstat: str) -> int | None:
    """The node's `oom_kill` counter from /proc/vmstat text (Linux >= 4.13)."""
    for line in vmstat.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill":
            try:
                return int(value)
            except ValueError:
                return None
    return None


# ---------------------------------------------------------------- READ (impure)

class ExitWatch:
    """The open connector socket and the watched pids' exits it has seen.
    `open()` raises OSError (PermissionError without CAP_NET_ADMIN)."""

    def __init__(self, sock: socket.socket, clock, procfs: str):
        self._sock, self._clock, self._procfs = sock, clock, procfs
        self.since = clock()
        self._kept: collections.OrderedDict[int, ProcessExit] = collections.OrderedDict()
        self.lost, self.last_loss_s = 0, -1.0
        self._oom = self._oom_count()

    @classmethod
    def open(cls, clock, procfs: str = "/proc") -> "ExitWatch":
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        try:
            sock.bind((0, CN_IDX_PROC))  # port chosen by the kernel; the proc group
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            sock.send(_control(PROC_CN_MCAST_LISTEN))
            _await_ack(sock)
            _attach(sock, _BPF)  # after the ack, which the filter would drop
            sock.setblocking(False)
            return cls(sock, clock, procfs)
        except BaseException:
            sock.close()
            raise

    def _oom_count(self) -> int | None:
        try:
            with open(f"{self._procfs}/vmstat") as f:
                return oom_kill_count(f.read())
        except OSError:
            return None

    def drain(self, watched) -> None:
        """Read what queued since the last drain; keep the exits of `watched` pids."""
        now = self._clock()
        to_clock = now - time.monotonic()  # the kernel stamps with CLOCK_MONOTONIC
        oom = self._oom_count()
        oom_kills = oom - self._oom if oom is not None and self._oom is not None else 0
        self._oom = oom
        for _ in range(MAX_DRAIN):
            try:
                data, (port, _groups) = self._sock.recvfrom(4096)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as err:
                if err.errno != errno.ENOBUFS:
                    raise
                self.lost += 1  # the kernel says events were dropped; how many, not
                self.last_loss_s = now
                continue
            if port != 0:
                continue  # not from the kernel: another local process's message
            for pid, _tgid, status, ppid, stamp in parse_datagram(data):
                if pid in watched:
                    self._kept.pop(pid, None)
                    self._kept[pid] = to_exit(pid, status, ppid, stamp / 1e9 + to_clock,
                                              max(0, oom_kills))
        while len(self._kept) > MAX_KEPT:
            self._kept.popitem(last=False)
        for pid in [p for p, e in self._kept.items() if now - e.at > KEEP_S]:
            del self._kept[pid]

    def snapshot(self, watched) -> Exits:
        self.drain(watched)
        return Exits(self._clock(), self.since,
                     tuple(sorted(self._kept.values(), key=lambda e: e.at)),
                     self.lost, self.last_loss_s)

    def close(self) -> None:
        try:
            self._sock.send(_control(PROC_CN_MCAST_IGNORE))
        except OSError:
            pass
        self._sock.close()


def parse_ack(data: bytes) -> int | None:
    """The error number of the connector's answer to LISTEN (0: listening), or
    None when `data` is something else."""
    if len(data) < EXIT_AT + 4:
        return None
    idx, val = CN_MSG.unpack_from(data, NLMSG.size)[:2]
    what = EVENT.unpack_from(data, EVENT_AT)[0]
    if (idx, val) != (CN_IDX_PROC, CN_VAL_PROC) or what != 0:  # PROC_EVENT_NONE
        return None
    return struct.unpack_from("=I", data, EXIT_AT)[0]


def _await_ack(sock: socket.socket, timeout_s: float = 0.5) -> None:
    """The kernel answers LISTEN with an ack, except where it ignores it without a
    word: from a PID or user namespace other than the initial ones (a container).
    No ack, no events: say so rather than watch nothing. Where it answers it
    does at once (under 1 ms here); the wait is paid in containers only."""
    sock.settimeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            data, (port, _groups) = sock.recvfrom(4096)
        except socket.timeout:
            break
        err = parse_ack(data) if port == 0 else None
        if err == 0:
            return
        if err is not None:
            raise OSError(err, os.strerror(err))
    raise OSError(errno.ENOTSUP, "the kernel did not acknowledge (not in the initial PID "
                                 "and user namespaces?)")


def _control(op: int) -> bytes:
    payload = struct.pack("=I", op)
    cn = CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(payload), 0) + payload
    return NLMSG.pack(NLMSG.size + len(cn), NLMSG_DONE, 0, 0, 0) + cn


def _attach(sock: socket.socket, program) -> None:
    code = b"".join(struct.pack("HBBI", *insn) for insn in program)  # struct sock_filter
    insns = ctypes.create_string_buffer(code)
    fprog = struct.pack("HP", len(program), ctypes.addressof(insns))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


class NoWatch:
    """A watch that could not be opened: the probe then fails, saying why (and
    what cannot be seen without it)."""

    def __init__(self, why: str):
        self.why = why

    def snapshot(self, watched) -> Exits:
        raise RuntimeError(self.why)

    def close(self) -> None:
        pass


def open_watch(clock, procfs: str = "/proc") -> ExitWatch | NoWatch:
    try:
        return ExitWatch.open(clock, procfs)
    except OSError as err:
        if err.errno == errno.ECONNREFUSED:  # no connector in this network namespace
            hint = " (the kernel offers it in the host's network namespace only)"
        elif isinstance(err, PermissionError) or err.errno in (
                errno.EPERM, errno.EPROTONOSUPPORT, errno.ENOTSUP):
            hint = " (needs CAP_NET_ADMIN in the initial namespaces: run as root on the host)"
        else:
            hint = ""
        return NoWatch(f"cannot listen to the kernel's process events: "
                       f"{err.strerror or err}{hint}; how a rank ended (signal, exit code) "
                       f"cannot be seen, only that it is gone")


@register("exits", scope="node", privileged=True,
          help="how the ranks of watched jobs ended (signal, exit code, OOM kill) and when, "
               "from the kernel's process events (root: CAP_NET_ADMIN)")
def run(ctx: ProbeContext, pids: tuple[int, ...]) -> Exits:
    if ctx.exit_watch is None:
        raise RuntimeError("no process-events watch was opened for this probe")
    return ctx.exit_watch.snapshot(frozenset(pids))


def from_json(obj) -> Exits:
    return codec.from_json(Exits, obj)
