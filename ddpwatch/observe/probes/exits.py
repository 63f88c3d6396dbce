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

Beside each end, who sent the stop signals (SIGHUP, SIGINT, SIGTERM) to the
watched pids (observe/system/tracefs.py): one rank SIGTERMed alone is a death,
the same signal to the launcher or every rank the job stopped
(observe/jobs/departures.py). Without tracefs only that is unknown.

The socket is opened once (`ExitWatch`) and kept by the probe's object
(`ExitsProbe`) while the probe is on, like the traffic capture. A classic BPF
filter lets the kernel drop every event but a process's (thread group
leader's) exit before it is queued; a drain keeps only the pids its caller
watches (ranks and launchers of jobs), at most MAX_KEPT, each for KEEP_S: any
local user can fork and exit thousands of times a second. Datagrams not sent
by the kernel (netlink port 0) are dropped: local users can unicast to our
socket. The node's OOM-kill count (/proc/vmstat oom_kill) is read at each
drain, so a SIGKILL can be told apart as the OOM killer's when the count rose
in the same interval.

READ: `ExitWatch`, `open_watch`, `ExitsProbe` (the socket: observe/system/proc_events.py).
PARSE (pure): `decode_status`, `oom_kill_count`.
"""
from __future__ import annotations

import collections
import dataclasses
import errno
import logging
import signal as signal_mod
import socket
import time
from dataclasses import dataclass

from ... import codec
from ..system.proc_events import close_socket, open_socket, parse_datagram
from ..system.tracefs import SignalSent, SignalTrace
from . import Pass, Probe, ProbeContext, register

log = logging.getLogger("ddpwatch.exits")

KEEP_S = 300.0     # an exit is kept this long (a held job is judged meanwhile)
MAX_KEPT = 512     # and at most this many (newest kept)
STOP_GRACE_S = 30.0  # a stop signal this long before an end asked for it (a
                     # graceful shutdown: Lightning's checkpoint on SIGTERM)
MAX_DRAIN = 50_000  # datagrams per drain: a fork bomb must not hold the tick

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
    # stop signals (SIGHUP, SIGINT, SIGTERM) sent to watched pids, oldest first,
    # with their senders (observe/system/tracefs.py); meaningful only when traced
    sent: tuple[SignalSent, ...] = ()
    traced: bool = False              # who sends stop signals is watched

    def parents(self, pids) -> set[int]:
        """The parents, at their ends, of those of `pids` that ended: a job's
        first process (Lightning's rank 0 starts its other ranks) is one."""
        wanted = set(pids)
        return {e.ppid for e in self.exits if e.pid in wanted and e.ppid > 0}

    def stop_sent_to(self, e: ProcessExit) -> SignalSent | None:
        """The last stop signal sent to `e`'s process in the STOP_GRACE_S before
        it ended, with its sender: one from another process first (Python
        re-raises a SIGINT it turned into KeyboardInterrupt on itself)."""
        mine = [s for s in self.sent
                if s.target == e.pid and e.at - STOP_GRACE_S <= s.at <= e.at + 0.5]
        outside = [s for s in mine if s.sender != e.pid]
        return (outside or mine or [None])[-1]


def for_pids(exits: Exits | None, pids) -> Exits | None:
    """Only these pids' exits and signals (a job's ranks and launcher): what a
    snapshot keeps."""
    if exits is None:
        return None
    wanted = set(pids)
    return dataclasses.replace(exits, exits=tuple(e for e in exits.exits if e.pid in wanted),
                               sent=tuple(s for s in exits.sent if s.target in wanted))


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

    def __init__(self, sock: socket.socket, clock, procfs: str,
                 trace: SignalTrace | None = None):
        self._sock, self._clock, self._procfs = sock, clock, procfs
        self.since = clock()
        self._kept: collections.OrderedDict[int, ProcessExit] = collections.OrderedDict()
        self.lost, self.last_loss_s = 0, -1.0
        self._oom = self._oom_count()
        self._trace = trace
        self._sent: collections.deque[SignalSent] = collections.deque(maxlen=MAX_KEPT)

    @classmethod
    def open(cls, clock, procfs: str = "/proc") -> "ExitWatch":
        sock = open_socket()
        try:
            trace = SignalTrace.open(procfs)
        except OSError as err:
            # the exits still say how each rank ended; only a lone rank's SIGTERM
            # then reads as its job stopped (observe/jobs/departures.py)
            log.warning("who sends stop signals is not watched: %s; a rank sent SIGTERM "
                        "alone is taken for its job stopped", err.strerror or err)
            trace = None
        return cls(sock, clock, procfs, trace)

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
        if self._trace is not None:
            self._sent.extend(self._trace.drain(watched))
            while self._sent and now - self._sent[0].at > KEEP_S:
                self._sent.popleft()

    def snapshot(self, watched) -> Exits:
        self.drain(watched)
        return Exits(self._clock(), self.since,
                     tuple(sorted(self._kept.values(), key=lambda e: e.at)),
                     self.lost, self.last_loss_s, tuple(self._sent),
                     self._trace is not None)

    def close(self) -> None:
        close_socket(self._sock)
        if self._trace is not None:
            self._trace.close()


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


def for_job(exits: Exits, job, data: dict) -> Exits:
    """How a job's ranks (those gone included) and launcher ended."""
    launcher = (job.launcher_pid,) if job.launcher_pid > 0 else ()
    return for_pids(exits, job.rank_pids + launcher + job.departed_pids)


# how the ranks of watched jobs ended (signal, exit code, OOM kill) and when, from
# the kernel's process events (root: CAP_NET_ADMIN)
@register("exits", scope="node", sampled_pids=True, for_job=for_job)
class ExitsProbe(Probe):
    """Holds the process-events watch while on, drained every pass (exits carry
    their own times), and the pids its last run was given: exits are kept of
    the ranks and launchers sampled in this pass and the last (others' are
    dropped: any user can fork)."""

    def __init__(self):
        self.watch: ExitWatch | NoWatch | None = None
        self._before: frozenset[int] = frozenset()

    def switch(self, ctx: ProbeContext, on: bool) -> None:
        if on and self.watch is None:
            self.watch = open_watch(ctx.clock, ctx.procfs)
        elif not on:
            self.close()

    def run(self, ctx: ProbeContext, seen: Pass, pids: tuple[int, ...]) -> Exits:
        """`pids`: those sampled since the last pass."""
        watched, self._before = self._before | frozenset(pids), frozenset(pids)
        if self.watch is None:
            raise RuntimeError("no process-events watch was opened for this probe")
        return self.watch.snapshot(watched)

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None


def from_json(obj) -> Exits:
    return codec.from_json(Exits, obj)
