"""systemd's watchdog (WatchdogSec= in systemd/ddpwatch.service): the daemon pings
WATCHDOG=1 from its tick loop, and a tick stuck for longer than the watchdog gets
it restarted.

systemd does not run in the test container (PID 1 is not systemd), so the test
plays systemd's part with the same protocol (sd_notify(3), systemd.service(5)):
it binds the AF_UNIX datagram socket named by NOTIFY_SOCKET, passes
WATCHDOG_USEC, and, as systemd does, kills a daemon silent for longer than that
with SIGABRT and starts it again (Restart=on-failure). The stuck tick is made by
the run loop's test hook (commands/run.py HOLD_TICK_ENV): the loop waits where a
tick would run, the HTTP threads stay up."""
from __future__ import annotations

import os
import signal
import socket
import time

from conftest import wait_until
from daemons import DaemonRun, get

from ddpwatch import sdnotify
from ddpwatch.commands.run import HOLD_TICK_ENV

WATCHDOG_S = 2.0


# --- pure parts ---------------------------------------------------------------------

def test_watchdog_interval_from_the_environment():
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "5000000", "WATCHDOG_PID": "42"},
                                        pid=42) == 5.0
    # meant for another process (inherited), unset, zero or garbage: no watchdog
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "5000000", "WATCHDOG_PID": "41"},
                                        pid=42) is None
    for env in ({}, {"WATCHDOG_USEC": "0"}, {"WATCHDOG_USEC": "x"},
                {"WATCHDOG_USEC": "-5"}, {"WATCHDOG_USEC": "1", "WATCHDOG_PID": "y"}):
        assert sdnotify.watchdog_interval_s(env, pid=42) is None, env


def test_pings_at_most_every_quarter_interval_and_none_without_watchdog():
    now, sent = [0.0], []
    dog = sdnotify.Watchdog(8.0, send=lambda m: sent.append(m) or True, clock=lambda: now[0])
    assert dog.every_s == 2.0
    for t in (0.0, 1.0, 1.9, 2.0, 3.0, 4.5):
        now[0] = t
        dog.ping()
    assert sent == ["WATCHDOG=1"] * 3 and dog.pings == 3  # at 0, 2.0 and 4.5
    off = sdnotify.Watchdog(None, send=lambda m: sent.append(m) or True)
    assert not off.ping() and off.every_s is None and len(sent) == 3


def test_notify_reaches_a_bound_datagram_socket_by_path_and_abstract_name(tmp_path):
    path = str(tmp_path / "notify.sock")
    abstract = f"ddpwatch-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as by_path, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as by_name:
        by_path.bind(path)
        by_name.bind("\0" + abstract)
        by_path.settimeout(5)
        by_name.settimeout(5)
        assert sdnotify.notify("WATCHDOG=1", {"NOTIFY_SOCKET": path})
        assert by_path.recv(64) == b"WATCHDOG=1"
        assert sdnotify.notify("READY=1", {"NOTIFY_SOCKET": "@" + abstract})
        assert by_name.recv(64) == b"READY=1"
    assert not sdnotify.notify("READY=1", {})
    assert not sdnotify.notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "nobody")})


# --- a real daemon ------------------------------------------------------------------

class Supervisor:
    """systemd's side of Type=notify with WatchdogSec: the datagrams received."""

    def __init__(self, tmp_path):
        self.path = str(tmp_path / "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)

    def next(self, timeout: float) -> bytes | None:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(256)
        except socket.timeout:
            return None

    def watch(self, seconds: float) -> list[float]:
        """The times of the WATCHDOG=1 pings over `seconds`."""
        end, pings = time.monotonic() + seconds, []
        while (left := end - time.monotonic()) > 0:
            if self.next(left) == b"WATCHDOG=1":
                pings.append(time.monotonic())
        return pings

    def silent_for(self, seconds: float) -> bool:
        """What systemd checks: no WATCHDOG=1 within `seconds`."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self.next(left) == b"WATCHDOG=1":
                return False
        return True


def test_a_tick_stuck_past_the_watchdog_gets_the_daemon_killed_and_restarted(
        start_job, tmp_path, hb_dir):
    supervisor = Supervisor(tmp_path)
    hold = tmp_path / "hold-tick"
    env = {"NOTIFY_SOCKET": supervisor.path, "WATCHDOG_USEC": str(int(WATCHDOG_S * 1e6)),
           HOLD_TICK_ENV: str(hold)}
    try:
        daemon = DaemonRun(start_job, tmp_path, hb_dir, {"tick_s": 0.5}, env=env)
        assert supervisor.next(30) == b"READY=1"
        pings = supervisor.watch(3 * WATCHDOG_S)
        gaps = [b - a for a, b in zip(pings, pings[1:])]
        assert len(pings) >= 4 and max(gaps) < WATCHDOG_S, gaps  # within the interval
        first_pid = daemon.job.proc.pid

        hold.touch()  # the next tick hangs
        assert supervisor.silent_for(2 * WATCHDOG_S), "pings went on while the tick hung"
        # only the tick loop is stuck: the HTTP threads answer, ticks do not advance
        tick = daemon.status()["tick"]
        assert get(daemon.url + "/metrics")[0] == 200
        time.sleep(1.0)
        assert daemon.status()["tick"] == tick
        # and the liveness a kubelet probes says so, past the watchdog's interval
        # (publish/endpoints.py Server: the view seen first more than that ago)
        code, body = wait_until(lambda: (lambda r: r if r[0] == 503 else None)(
            get(daemon.url + "/healthz")), 3 * WATCHDOG_S + 5, interval=0.2,
            what="/healthz 503 while the tick hangs")
        assert b"no tick completed for" in body, body
        # systemd's WatchdogSec: SIGABRT, then Restart=on-failure starts it anew
        os.kill(first_pid, signal.SIGABRT)
        assert daemon.job.proc.wait(10) == -signal.SIGABRT
        hold.unlink()
        daemon.start(env=env)
        assert daemon.job.proc.pid != first_pid
        assert supervisor.next(30) == b"READY=1"
        assert len(supervisor.watch(2 * WATCHDOG_S)) >= 2
        ticks = daemon.status()["tick"]
        wait_until(lambda: daemon.status()["tick"] >= ticks + 2, 30, what="ticks after restart")
        assert get(daemon.url + "/healthz")[0] == 200
    finally:
        supervisor.sock.close()
