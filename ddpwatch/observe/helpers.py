"""The helper programs probes run (ss, ip, nsenter, py-spy), found once.

The daemon runs as root beside other users: a program looked up through PATH
at every call is whatever the PATH of the moment names (issue 14: `ss`, `ip`
and `nsenter` were found through PATH each time). Each is resolved once, to an
absolute path, on first use; the daemon resolves them all at start
(`resolve_all`) and says which are missing. The probes then exec that path.
"""
from __future__ import annotations

import os
import shutil
import sys

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
