"""Who sent a stop signal: the kernel's `signal:signal_generate` tracepoint, read
through a tracefs instance of the daemon's own, as the exits probe uses it.

A rank ended by SIGTERM is either its job being stopped (scancel, a pod
deleted, `kill` of the launcher, Ctrl-C: the request reaches the launcher or
every rank) or one rank killed alone (earlyoom and systemd-oomd SIGTERM the
biggest process; a person's `kill` of a pid). The exit status is the same; the
launcher ends every rank by SIGTERM either way (torchrun, within 0.1 s of a
worker's end). Only who sent the first signal, and to whom, tells them apart
(observe/jobs/departures.py). The process-events connector does not carry
signals; `signal_generate` does: sender (the task that called kill), target
pid, signal number, whether the whole thread group was the target.

`SignalTrace.open` makes an instance `instances/ddpwatch-<pid>-<random>` under the
tracefs mount (an instance is a ring buffer and event switches of its own:
other tracing on the node is untouched), removes the instances of daemons that
are gone, sets a small buffer, the monotonic clock (the exits' clock) and a
filter keeping SIGHUP, SIGINT and SIGTERM only, and opens `trace_pipe`
non-blocking. `drain` reads what queued (bounded); `close` switches the event
off and removes the instance. It needs root and a mounted tracefs (systemd
mounts it at /sys/kernel/tracing; the unit's ReadWritePaths lets the daemon
write there); without them the exits probe works as before and says that who
sent a signal is unknown.

A sender's name (comm) is whatever that process called itself: kept to
printable characters, never trusted to name anything. PARSE (pure): `parse_line`.
"""
from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

ROOTS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
PREFIX = "ddpwatch-"
STOP_SIGNALS = (1, 2, 15)  # SIGHUP, SIGINT, SIGTERM: the signals that ask to stop
BUFFER_KB = 64             # per CPU; a drain a tick empties it
MAX_LINES = 4096           # per drain: a signal storm must not hold the tick
RESULT_IGNORED = 1         # TRACE_SIGNAL_IGNORED: the target ignores it

# "<comm>-<tid> [cpu] <flags> <secs>: signal_generate: sig=15 errno=0 code=0
#  comm=<target comm> pid=<target> grp=1 res=0". A comm is up to 15 bytes and may
# hold spaces and dashes: the sender's is everything before the last "-<digits>"
# ahead of the CPU, the target's everything between "comm=" and the last " pid=".
_LINE = re.compile(r"^\s*(?P<comm>.{0,16}?)-(?P<tid>\d+)\s+(?:\(\s*[-\d]+\)\s+)?"
                   r"\[\d+\]\s+\S+\s+(?P<at>\d+\.\d+): signal_generate: "
                   r"sig=(?P<sig>\d+) errno=-?\d+ code=-?\d+ comm=.{0,16} "
                   r"pid=(?P<pid>\d+) grp=(?P<grp>\d) res=(?P<res>\d)\s*$")


@dataclass(frozen=True)
class SignalSent:
    """One stop signal the kernel generated."""
    at: float          # monotonic seconds
    signal: int
    target: int        # the pid it was sent to
    sender: int        # the sending process (thread group), or its thread when gone
    sender_comm: str   # printable, at most 16 characters

    @property
    def by(self) -> str:
        """For people: "pid 4242 (earlyoom)"."""
        return f"pid {self.sender} ({self.sender_comm})" if self.sender_comm else \
            f"pid {self.sender}"


def _printable(text: str) -> str:
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:16].strip()


def parse_line(line: str) -> tuple[float, int, int, int, str] | None:
    """(at, signal, target pid, sender thread id, sender comm) of one trace line
    of a delivered signal_generate event, or None (another line, an ignored
    signal)."""
    m = _LINE.match(line)
    if m is None or int(m["res"]) == RESULT_IGNORED:
        return None
    return (float(m["at"]), int(m["sig"]), int(m["pid"]), int(m["tid"]),
            _printable(m["comm"]))


def _tgid(procfs: str, tid: int) -> int:
    """The process of thread `tid` (kill(2) is called by a thread), or `tid` when
    it is gone or unreadable."""
    try:
        with open(f"{procfs}/{tid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return tid


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def tracefs_root() -> str | None:
    for root in ROOTS:
        if os.path.isdir(os.path.join(root, "instances")):
            return root
    return None


class SignalTrace:
    """The open instance. `open()` raises OSError saying what is missing."""

    def __init__(self, path: str, fd: int, procfs: str):
        self.path, self._fd, self._procfs = path, fd, procfs
        self._rest = b""

    @classmethod
    def open(cls, procfs: str = "/proc") -> "SignalTrace":
        root = tracefs_root()
        if root is None:
            raise OSError(errno.ENOENT, "no tracefs mounted at /sys/kernel/tracing "
                          "(mount -t tracefs nodev /sys/kernel/tracing)")
        instances = os.path.join(root, "instances")
        for name in os.listdir(instances):  # daemons gone without closing theirs
            owner = name[len(PREFIX):].partition("-")[0]
            if name.startswith(PREFIX) and owner.isdigit() and \
                    not os.path.exists(f"{procfs}/{owner}"):
                cls._remove(os.path.join(instances, name))
        # one a watch: a process may hold more than one (tests, a reload's overlap)
        path = os.path.join(instances, f"{PREFIX}{os.getpid()}-{os.urandom(3).hex()}")
        os.mkdir(path)
        try:
            _write(os.path.join(path, "buffer_size_kb"), str(BUFFER_KB))
            _write(os.path.join(path, "trace_clock"), "mono")
            event = os.path.join(path, "events", "signal", "signal_generate")
            _write(os.path.join(event, "filter"),
                   " || ".join(f"sig == {s}" for s in STOP_SIGNALS))
            _write(os.path.join(event, "enable"), "1")
            fd = os.open(os.path.join(path, "trace_pipe"), os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            cls._remove(path)
            raise
        return cls(path, fd, procfs)

    @staticmethod
    def _remove(path: str) -> None:
        try:
            _write(os.path.join(path, "events", "signal", "signal_generate", "enable"), "0")
        except OSError:
            pass
        try:
            os.rmdir(path)
        except OSError:
            pass

    def drain(self, watched) -> list[SignalSent]:
        """The stop signals generated since the last drain to `watched` pids,
        oldest first (others' are dropped before their sender is looked up: any
        user can kill(2) its own processes in a loop)."""
        out, lines = [], 0
        while lines < MAX_LINES:
            try:
                chunk = os.read(self._fd, 65536)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:
                break
            data = self._rest + chunk
            *whole, self._rest = data.split(b"\n")
            self._rest = self._rest[-512:]  # a line is far shorter: never grows
            for raw in whole:
                lines += 1
                got = parse_line(raw.decode("utf-8", "replace"))
                if got is not None and got[2] in watched:
                    at, sig, target, tid, comm = got
                    out.append(SignalSent(at, sig, target, _tgid(self._procfs, tid), comm))
        return out

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._remove(self.path)
