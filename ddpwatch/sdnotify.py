"""systemd's notify protocol (Type=notify): one datagram to $NOTIFY_SOCKET
(sd_notify(3)), written here rather than pulled in as a dependency.

The watchdog (WatchdogSec= in systemd/ddpwatch.service): systemd passes
WATCHDOG_USEC (and WATCHDOG_PID, the process meant) and expects "WATCHDOG=1"
more often than that; a service silent for longer is killed (SIGABRT) and, with
Restart=on-failure, started again. `Watchdog.ping` is called from the tick loop
only (commands/run.py), never from a thread of its own: a tick that hangs stops
the pings, which is the point (tests/deploy/test_watchdog.py)."""
from __future__ import annotations

import os
import socket
import time


def notify(message: str, environ=None) -> bool:
    address = (os.environ if environ is None else environ).get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(message.encode(), address)
        return True
    except OSError:
        return False


def watchdog_interval_s(environ=None, pid: int | None = None) -> float | None:
    """Seconds systemd waits for a ping, or None when there is no watchdog (no
    WATCHDOG_USEC, a bad value, or a WATCHDOG_PID that is another process's:
    the variables were inherited, as sd_watchdog_enabled(3) checks)."""
    env = os.environ if environ is None else environ
    usec, meant = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    try:
        if meant and int(meant) != (os.getpid() if pid is None else pid):
            return None
        value = int(usec)
    except ValueError:
        return None
    return value / 1e6 if value > 0 else None


class Watchdog:
    """Pings whenever the loop calls `ping`, at most every quarter interval
    (sd_watchdog_enabled(3) advises pinging within half of it: a quarter leaves
    a slow tick room); does nothing without a watchdog."""

    def __init__(self, interval_s: float | None, send=notify, clock=time.monotonic):
        self.interval_s = interval_s
        self._send, self._clock = send, clock
        self._last = -1e18
        self.pings = 0

    @property
    def every_s(self) -> float | None:
        """How often the loop must call `ping` while it waits for its next tick."""
        return self.interval_s / 4 if self.interval_s else None

    def ping(self) -> bool:
        if not self.interval_s:
            return False
        now = self._clock()
        if now - self._last < self.interval_s / 4:
            return False
        self._last = now
        self.pings += 1
        return self._send("WATCHDOG=1")


LISTEN_FDS_START = 3  # SD_LISTEN_FDS_START


def listen_socket(environ=None, pid: int | None = None) -> socket.socket | None:
    """The listening socket systemd passed (socket activation, sd_listen_fds(3):
    LISTEN_FDS=1 and LISTEN_PID this process), or None. systemd/ddpwatch.socket
    holds the daemon's port from boot on, across every restart, so no local user
    can bind it while the daemon is down and play daemon to its clients
    (tests/hostile/test_port_squat.py). The variables are removed so that no child
    (py-spy, nsenter) takes them for its own."""
    env = os.environ if environ is None else environ
    count, meant = env.get("LISTEN_FDS", ""), env.get("LISTEN_PID", "")
    for name in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
        env.pop(name, None)
    try:
        if not count or int(meant) != (os.getpid() if pid is None else pid):
            return None
        count = int(count)
    except ValueError:
        return None
    if count != 1:
        raise ValueError(f"systemd passed {count} sockets (LISTEN_FDS); ddpwatch.socket "
                         f"must have exactly one ListenStream=")
    sock = socket.socket(fileno=LISTEN_FDS_START)
    os.set_inheritable(sock.fileno(), False)
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET,
                                                              socket.AF_INET6):
        sock.detach()
        raise ValueError("the socket systemd passed is not a TCP socket (ListenStream= "
                         "takes an address and port)")
    return sock
