"""Who asks, and what they may see, when the daemon has no token.

Without a token (allowed on loopback only: config.py) any local user can reach
`/status`, `/peer` and `/incidents`, which show every job's command lines,
stacks, sockets and evidence bundles: other users' included. The daemon runs
as root beside them, so it answers each user for their own jobs only:

* the asking uid is the owner of the client's end of the loopback TCP
  connection, as the kernel lists it in /proc/net/tcp and tcp6 (what identd
  does; no client can forge it);
* root and the daemon's own user see everything, as does whoever holds the
  token when one is set (a token is the cluster operator's);
* anyone else sees the jobs and incidents whose owner uid
  (discovery.owner_key) is theirs; a uid that cannot be told sees none.

README, "Trust model"; tests/hostile/test_port_squat.py (a real daemon and uid 65534).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
import sys
import threading

from ..observe.jobs.discovery import owner_uid

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
MAX_TABLE_BYTES = 16 << 20  # a node with 100 000 connections lists about 15 MB
ALL = None  # the viewer that sees everything


def _endpoint(text: str) -> tuple[str, int] | None:
    """/proc/net/tcp's "0100007F:1F90" (each 32-bit word in host order) as (ip, port)."""
    hexaddr, _, hexport = text.partition(":")
    try:
        raw = bytes.fromhex(hexaddr)
        port = int(hexport, 16)
    except ValueError:
        return None
    if len(raw) not in (4, 16):
        return None
    words = b"".join(raw[i:i + 4][::-1] if sys.byteorder == "little" else raw[i:i + 4]
                     for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), port


def _normal(address: tuple) -> tuple[str, int]:
    ip = ipaddress.ip_address(address[0].split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(address[1])


def connection_uid(client: tuple, server: tuple, tables=TABLES) -> int | None:
    """The uid that owns the client's end of a TCP connection from `client` to
    `server` in this network namespace; None if it is not listed."""
    want_local, want_remote = _normal(client), _normal(server)
    for path in tables:
        try:
            with open(path, "rb") as f:
                text = f.read(MAX_TABLE_BYTES).decode("ascii", "replace")
        except OSError:
            continue
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 8:
                continue
            if _endpoint(fields[1]) == want_local and _endpoint(fields[2]) == want_remote:
                try:
                    return int(fields[7])
                except ValueError:
                    return None
    return None


def viewer_of(req, token_used: bool) -> int | None:
    """ALL for a request that may see everything, else the uid whose jobs it may
    see (-1: none). `req`: the HTTP handler of the request."""
    if token_used:
        return ALL
    try:
        server = req.connection.getsockname()
    except OSError:
        return -1
    if req.connection.family not in (socket.AF_INET, socket.AF_INET6):
        return -1
    uid = connection_uid(req.client_address, server)
    if uid is None:
        return -1
    return ALL if uid in (0, os.geteuid()) else uid


def visible(view, uid: int | None):
    """The part of a DaemonView that `uid` may see (all of it for ALL)."""
    if uid is ALL or view is None:
        return view
    return dataclasses.replace(
        view, jobs=tuple(j for j in view.jobs if owner_uid(j.owner) == uid >= 0),
        incidents=tuple(i for i in view.incidents if owner_uid(i.owner) == uid >= 0),
        alerting_jobs=())


class StackRequests:
    """People's asks for stacks (GET /status?stacks=1, from the HTTP threads):
    the next tick dumps those of every job the askers may see. A local user
    cannot make the daemon dump other users' ranks."""

    def __init__(self):
        # ALL_JOBS, or a frozenset of owner uids; replaced whole, never mutated.
        # The HTTP threads add to it while a tick takes it: one lock, or a request
        # made between the tick's read and its reset is lost.
        self._wanted: object = frozenset()
        self._lock = threading.Lock()

    def ask(self, uid: int | None = None) -> None:
        """All jobs for uid None (root, a token holder), else `uid`'s own."""
        if uid is not None and uid < 0:
            return  # an asker who could not be told owns no job
        with self._lock:
            if uid is None:
                self._wanted = ALL_JOBS
            elif self._wanted is not ALL_JOBS:
                self._wanted = frozenset(self._wanted) | {uid}

    def take(self) -> object:
        """What was asked since the last take (a tick's `requested`)."""
        with self._lock:
            wanted, self._wanted = self._wanted, frozenset()
            return wanted


ALL_JOBS = "all"  # StackRequests: every job, whoever owns it


def asked_for(requested: object, key: str) -> bool:
    """Whether `requested` (StackRequests.take) covers the job `key`."""
    return requested is ALL_JOBS or owner_uid(key) in requested
