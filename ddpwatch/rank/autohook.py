"""Run a function right after a named module has been imported by someone else.

Automatic heartbeats must act when torch.distributed is imported and never
import torch themselves (a process that does not use torch must not pay for
it). `after_import(name, fn)` puts a finder first on `sys.meta_path`: for the
watched names only, it asks the finders behind it for the module's spec and
wraps the spec's loader, so that `fn(module)` runs once the module's code has
run. Every other import is one dict lookup. The wrapper hands the module back
its real loader before executing it, so the module looks as if it had been
imported plainly (inspect, linecache and importlib.resources see the real one).

A callback that raises is reported once (autowarn.warn_once) and never breaks
the import. Imports no torch.
"""
from __future__ import annotations

import sys
import threading

from .autowarn import warn_once

_hooks: dict[str, list] = {}
_lock = threading.RLock()


def after_import(name: str, fn) -> None:
    """Call fn(module) after `name` is imported; now, if it already was."""
    module = sys.modules.get(name)
    if module is not None:  # booted late (autoboot.boot() called by hand)
        _run(fn, module)
        return
    with _lock:
        _hooks.setdefault(name, []).append(fn)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)


def _run(fn, module) -> None:
    try:
        fn(module)
    except Exception as err:  # never into the importing code
        warn_once(f"automatic instrumentation failed after importing {module.__name__}: "
                  f"{err!r}")


class _Loader:
    """The real loader, plus the callbacks once the module has executed."""

    def __init__(self, loader, name: str):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        spec = module.__spec__
        spec.loader = self._loader
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        with _lock:
            callbacks = _hooks.pop(self._name, [])
            if not _hooks and _FINDER in sys.meta_path:
                sys.meta_path.remove(_FINDER)
        for fn in callbacks:
            _run(fn, module)

    def __getattr__(self, attr):
        return getattr(self._loader, attr)


class _Finder:
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _hooks:
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, fullname)
        return spec

    def invalidate_caches(self):
        pass


_FINDER = _Finder()
