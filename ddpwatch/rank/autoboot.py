"""Start of automatic heartbeats in every Python process: `boot()`.

Called at interpreter start-up, before the script, from one of two places:
* `ddpwatch-auto.pth` (beside this file), copied to site-packages by setup.py: Python's
  `site` runs its one line in every interpreter of that environment; the line
  does nothing unless DDPWATCH_AUTO=1 (and costs a dict lookup then);
* `ddpwatch/rank/boot/sitecustomize.py`, which `ddpwatch exec` puts first on
  PYTHONPATH, so that the processes it starts are watched even where the .pth
  is absent (ddpwatch installed in another environment than the training's);
  it then runs the sitecustomize it hides.

`boot()` only registers post-import hooks (autohook.py): nothing else happens
in a process that never imports torch. When torch.distributed is imported,
auto.arm() wraps init_process_group; a process becomes a watched rank only when
it calls init_process_group (torchrun's agent and DataLoader workers import
torch but never do). Turned off by DDPWATCH_AUTO unset or anything but "1".

A broken ddpwatch never stops the training: every failure here is one line on
stderr, once per process tree (autowarn.warn_once).
Imports no torch.
"""
from __future__ import annotations

import os

from .autowarn import ENV, warn_once

_booted = False


def enabled(env=None) -> bool:
    return (os.environ if env is None else env).get(ENV, "") == "1"


def boot() -> bool:
    """Install the hooks once if DDPWATCH_AUTO=1; True when they are in place."""
    global _booted
    if _booted:
        return True
    if not enabled():
        return False
    try:
        from . import auto, autohook
        autohook.after_import("torch.distributed.distributed_c10d", auto.arm)
        autohook.after_import("torch.multiprocessing.spawn", auto.watch_spawn)
    except Exception as err:
        warn_once(f"automatic instrumentation not installed: {err!r}")
        return False
    _booted = True
    return True
