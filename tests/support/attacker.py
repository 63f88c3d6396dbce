"""The attacker's side of the hostile tests (tests/hostile): commands run as uid
65534 (a local user, via setpriv), from a python that user can run
(otheruser.py), and what every attack test asserts of the daemon under attack:
it keeps ticking and prints no traceback."""
from __future__ import annotations

import json
import os
import re
import shutil

import otheruser
from conftest import need, wait_until
from daemons import get

NOBODY = 65534


def need_root():
    need(os.geteuid() == 0 and shutil.which("setpriv") is not None,
         "needs root and setpriv (util-linux) to attack as uid 65534")


def as_nobody(*argv: str, nofile: int | None = None) -> list[str]:
    """argv run as uid/gid 65534 with no supplementary groups (a local user)."""
    cmd = otheruser.as_user(NOBODY, *argv)
    return ["prlimit", f"--nofile={nofile}:{nofile}", *cmd] if nofile else cmd


def python_as_nobody(*args: str, nofile: int | None = None) -> list[str]:
    """`python *args` as uid 65534, from a copy that user can read: the checkout and
    its interpreter may sit where only root can enter (tests/support/otheruser.py)."""
    return as_nobody(*otheruser.runtime().argv(*args), nofile=nofile)


def ticks(daemon, token=None) -> int:
    """The daemon's tick count from /status. Right after an attack every worker
    may still be busy with its last connections: a 503 "busy" (Retry-After: 1,
    publish/bounded_server.py) is asked again, as a client would, for up to
    BUSY_PATIENCE_S; by then /status must answer."""
    def answered():
        code, body = get(daemon.url + "/status", token)
        if code == 503:
            return None
        assert code == 200, (code, body)
        return (json.loads(body)["tick"],)
    return wait_until(answered, BUSY_PATIENCE_S, interval=1.0,
                      what="/status answered, not busy")[0]


BUSY_PATIENCE_S = 15.0


def keeps_ticking(daemon, token=None) -> None:
    before = ticks(daemon, token)
    wait_until(lambda: ticks(daemon, token) >= before + 2, 30, what="two more ticks")


def no_traceback(daemon) -> None:
    out = daemon.job.output()
    assert "Traceback" not in out, out[-3000:]


def refused_counts(metrics: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^ddpwatch_http_refused_total\{reason="(\w+)"\} (\S+)$', metrics, re.M)}


def job_with(doc: dict, pid: int):
    return next((j for j in doc["jobs"] if any(r["pid"] == pid for r in j["ranks"])), None)
