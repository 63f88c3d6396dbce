"""Automatic heartbeats: what the import hooks of autoboot.py do to torch.

* `arm(c10d)`, right after torch.distributed.distributed_c10d is imported (by
  `import torch` itself, before anything can bind its names): wraps
  init_process_group. The first call opens the record and installs everything
  `ddpwatch.instrument()` installs, with the identity the launcher knows
  (identity.py), then lets the rendezvous run with the record saying so. Until
  then nothing is written: a process that never calls init_process_group (the
  torchrun agent, DataLoader workers, compile workers) has no record.
* `watch_spawn(module)`: torch.multiprocessing.spawn runs `_wrap(fn, i, ...)` in
  each child; the wrapper notes `i`, the spawn index (the parent pickles `_wrap`
  by name, so the child's own hooked module supplies ours).
* From outside the script: the DDP module's dtype (instrumentation, at each
  forward), a DistributedSampler's dataset length, replicas, seed, shuffle and
  drop_last as the data fingerprint (a rank given other data differs).

A script that calls `ddpwatch.instrument()` itself keeps what it says: the
automatic identity only fills fields still unknown, and a fingerprint it gave
is never replaced. Collectives a module bound by name (`from torch.distributed
import all_reduce`) before init_process_group keep torch's function: the same
limit as calling instrument() late.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import os
import sys

from .autowarn import warn_once
from .identity import UNKNOWN, launcher_identity

_spawn_index: int | None = None
_samplers: list[str] = []
_auto_fingerprint = ""


def watch_spawn(spawn_module) -> None:
    original = spawn_module._wrap
    if hasattr(original, "__ddpwatch_original__"):
        return

    @functools.wraps(original)
    def _wrap(fn, i, *args, **kwargs):
        global _spawn_index
        _spawn_index = i
        return original(fn, i, *args, **kwargs)
    _wrap.__ddpwatch_original__ = original
    spawn_module._wrap = _wrap


def arm(c10d) -> None:
    original = c10d.init_process_group
    if hasattr(original, "__ddpwatch_armed__"):
        return
    dist = sys.modules.get("torch.distributed")

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        current = c10d.init_process_group
        if current is init_process_group:
            # First call, nothing installed yet: put torch's function back, so
            # instrument() wraps it as it always does (rendezvous phase, rank
            # learnt after), then call that.
            c10d.init_process_group = original
            if dist is not None and getattr(dist, "init_process_group", None) is init_process_group:
                dist.init_process_group = original
            _quietly(lambda: _instrument(original, args, kwargs))
            return c10d.init_process_group(*args, **kwargs)
        if getattr(current, "__ddpwatch_original__", None) is init_process_group:
            # instrument() called by the script wrapped us: we run inside its wrapper.
            _quietly(lambda: _instrument(original, args, kwargs))
            return original(*args, **kwargs)
        # A name bound before we were replaced (torch.distributed.device_mesh): the current one.
        return current(*args, **kwargs)
    init_process_group.__ddpwatch_armed__ = True
    c10d.init_process_group = init_process_group
    if dist is not None and getattr(dist, "init_process_group", None) is original:
        dist.init_process_group = init_process_group


def _quietly(fn) -> None:
    try:
        fn()
    except Exception as err:
        warn_once(f"automatic instrumentation failed: {err!r}")


def _instrument(original, args, kwargs) -> None:
    from . import instrumentation
    who = launcher_identity(os.environ, _spawn_index, *_init_args(original, args, kwargs),
                            lightning=_lightning_loaded())
    if not instrumentation.installed():
        instrumentation.instrument(**{k: v for k, v in who.items() if v != UNKNOWN})
    else:  # the script's own instrument(): fill only what it left unknown
        known = instrumentation.writer().identity()
        missing = {k: v for k, v in who.items() if v != UNKNOWN and known.get(k, 0) == UNKNOWN}
        if missing:
            instrumentation.set_identity(**missing)
    _watch_samplers()


def _init_args(original, args, kwargs) -> tuple[int, int]:
    try:
        bound = inspect.signature(original).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return UNKNOWN, UNKNOWN
    return bound.get("rank", UNKNOWN), bound.get("world_size", UNKNOWN)


def _lightning_loaded() -> bool:
    return any(name in sys.modules for name in ("lightning", "pytorch_lightning",
                                                "lightning_fabric"))


# --- data fingerprint -------------------------------------------------------------
def _watch_samplers() -> None:
    from torch.utils.data.distributed import DistributedSampler
    original = DistributedSampler.__init__
    if hasattr(original, "__ddpwatch_original__"):
        return

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _quietly(lambda: note_sampler(self))
    __init__.__ddpwatch_original__ = original
    DistributedSampler.__init__ = __init__


def sampler_key(sampler) -> str:
    """What must agree across ranks: same dataset length, same split, same seed."""
    return (f"len={len(sampler.dataset)} replicas={sampler.num_replicas} "
            f"samples={sampler.num_samples} seed={sampler.seed} "
            f"shuffle={int(bool(sampler.shuffle))} drop_last={int(bool(sampler.drop_last))}")


def fingerprint(keys: list[str]) -> str:
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


def note_sampler(sampler) -> None:
    """Every DistributedSampler this rank made, in order, is its data fingerprint."""
    global _auto_fingerprint
    from . import instrumentation
    _samplers.append(sampler_key(sampler))
    current = instrumentation.writer().identity().get("data_fingerprint", "")
    if current not in ("", _auto_fingerprint):
        return  # the script said it itself
    _auto_fingerprint = fingerprint(_samplers)
    instrumentation.set_identity(data_fingerprint=_auto_fingerprint)
