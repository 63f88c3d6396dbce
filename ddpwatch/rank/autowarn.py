"""The one line automatic heartbeats may print: `warn_once`.

A leaf of the automatic-heartbeat modules, imported by each of them and
importing none: autoboot.py (start-up) imports auto.py (what is done to torch)
and autohook.py (the post-import hook), and all three report here, so imports
among them go one way (tests/unit/project/test_import_graph_unit.py).

A broken ddpwatch never stops the training: a failure is one line on stderr,
once per process tree (DDPWATCH_AUTO_WARNED, inherited by children, keeps the
ranks of a job from repeating what their launcher said). Imports no torch.
"""
from __future__ import annotations

import os
import sys

ENV = "DDPWATCH_AUTO"
WARNED_ENV = "DDPWATCH_AUTO_WARNED"
_warned = False


def warn_once(message: str) -> None:
    """One line on stderr, once per process tree; never raises."""
    global _warned
    if _warned or os.environ.get(WARNED_ENV):
        return
    _warned = True
    try:
        os.environ[WARNED_ENV] = "1"
        sys.stderr.write(f"ddpwatch: {message}; training goes on without heartbeats "
                         f"(unset {ENV} to silence)\n")
        sys.stderr.flush()
    except Exception:  # a closed stderr: nothing more to do
        pass
