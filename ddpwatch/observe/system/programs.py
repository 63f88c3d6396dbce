"""The helper programs probes run (ss, ip, nsenter, py-spy), found once.

The daemon runs as root beside other users: a program looked up through PATH
at every call is whatever the PATH of the moment names (`ss`, `ip`
and `nsenter` were found through PATH each time). Each is resolved once, to an
absolute path, on first use; the daemon resolves them all at start
(`resolve_all`) and says which are missing. The probes then exec that path.
"""
from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import sys
import time

TOOLS = ("ss", "ip", "nsenter", "py-spy")
# Where the system's own tools live, searched before PATH
SYSTEM_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin")

_resolved: dict[str, str | None] = {}


def _find(name: str) -> str | None:
    if name == "py-spy":
        # the one installed next to our interpreter first (a pyenv shim on PATH
        # costs a bash + pyenv exec per dump; a venv's is ours)
        here = os.path.join(os.path.dirname(sys.executable), "py-spy")
        if os.access(here, os.X_OK):
            return os.path.abspath(here)
    found = shutil.which(name, path=os.pathsep.join(SYSTEM_DIRS)) or shutil.which(name)
    return os.path.abspath(found) if found else None


def path(name: str) -> str | None:
    """The absolute path of helper `name`, or None when it is not installed."""
    if name not in _resolved:
        _resolved[name] = _find(name)
    return _resolved[name]


def resolve_all() -> dict[str, str | None]:
    """Resolve every helper now (daemon start): name -> absolute path or None."""
    return {name: path(name) for name in TOOLS}


def run_bounded(cmd: list[str], timeout_s: float, limit: int) -> str:
    """A helper's standard output, at most `limit` bytes of it (the rest is
    drained and dropped, so a namespace with 20 000 addresses costs the daemon
    no more memory than any other), under `timeout_s` (then killed:
    subprocess.TimeoutExpired). RuntimeError on a non-zero exit."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL) as proc:
        deadline = time.monotonic() + timeout_s
        out, err = bytearray(), bytearray()
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    proc.kill()
                    raise subprocess.TimeoutExpired(cmd, timeout_s)
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                    elif len(key.data) < limit:
                        key.data.extend(chunk[:limit - len(key.data)])
        try:
            code = proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {code}: "
                           f"{err.decode('utf-8', 'replace').strip()[:300]}")
    return out.decode("utf-8", "replace")
