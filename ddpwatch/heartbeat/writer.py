"""The rank side of the heartbeat channel: one mmap'd record, written in place.

A rank must never be slowed, blocked or crashed by being watched. So the hot
path (`enter`, `exit`, `step`) only stores a few fields into a shared-memory
mapping: no syscall, no allocation beyond the values, and no exception can
escape (set-up problems turn the writer off with one warning).

Two implementations of the record's state machine, one behaviour:
`ddpwatch.heartbeat._hotpath.Core` (C, used when it was built: about a tenth of the CPU
per collective) and `pycore.PyCore` (the reference, and the fallback where no
compiler was found or DDPWATCH_PURE_PYTHON=1). The tests run against both.

The seqlock and the record's state machine are in pycore.py.
"""
from __future__ import annotations

import mmap
import os
import socket
import struct
import threading
import time
import warnings

from . import layout, retention
from .native import hotpath
from .pycore import PyCore
from .paths import record_path, prepare_dir

_monotonic = time.monotonic


def core_class():
    """The C Core when it was built for this layout, else PyCore."""
    native = hotpath()
    return PyCore if native is None else native.Core


class HeartbeatWriter:
    """Owns this process's heartbeat record. Create it with `open_writer()`."""

    def __init__(self, path: str, fd: int, mem: mmap.mmap, identity: dict):
        self.path = path
        self._fd = fd
        self._mem = mem
        self._lock = threading.Lock()  # identity changes only; the core guards its state
        self._identity = identity
        self.core = core_class()(
            mem, layout.SEQ_OFFSET, layout.PROGRESS_OFFSET, layout.RING_OFFSET,
            layout.RING_SLOTS, layout.pack_header(**identity))
        # The hot path goes straight to the core: no Python frame of ours between.
        self.enter = self.core.enter
        self.exit = self.core.exit
        self.set_phase = self.core.set_phase
        self.counters = self.core.counters

    @property
    def closed(self) -> bool:
        return self.core.closed

    # --- identity ------------------------------------------------------------
    def set_identity(self, **fields) -> None:
        """Update identity fields (rank after init_process_group, dtype, data...)."""
        unknown = set(fields) - set(self._identity)
        if unknown:
            raise TypeError(f"unknown heartbeat identity field(s): {', '.join(sorted(unknown))}")
        with self._lock:
            old_rank = self._identity["rank"]
            self._identity.update({k: v for k, v in fields.items() if v is not None})
            self.core.write_header(layout.pack_header(**self._identity))
            if self._identity["rank"] != old_rank and not self.closed:
                # Keep the file name telling: ranks are often known only after
                # init_process_group. The mapping survives a rename.
                new_path = record_path(os.path.dirname(self.path), self._identity["rank"],
                                       self._identity["pid"])
                try:
                    os.rename(self.path, new_path)
                    self.path = new_path
                except OSError:
                    pass

    def identity(self) -> dict:
        return dict(self._identity)

    def step(self, tokens: int = 0) -> None:
        """A training step ended (optimizer stepped); `tokens` it processed."""
        self.core.step(tokens)

    def close(self, *, exited: bool = True) -> None:
        """Mark the record EXITED and unmap it. The file stays as evidence."""
        with self._lock:
            if self.closed:
                return
            self.core.close(exited=exited)
            try:
                self._mem.close()
                os.close(self._fd)
            except (OSError, ValueError, BufferError):
                pass


class NullWriter:
    """Stands in when the record cannot be written: every call does nothing."""
    path = None
    closed = True

    def set_identity(self, **fields) -> None:
        pass

    def identity(self) -> dict:
        return {}

    def counters(self) -> tuple[float, int]:
        return 0.0, 0

    def enter(self, op_code: int, nbytes: int):
        return None

    def exit(self, token) -> None:
        pass

    def step(self, tokens: int = 0) -> None:
        pass

    def set_phase(self, phase: int) -> None:
        pass

    def close(self, *, exited: bool = True) -> None:
        pass


def default_identity() -> dict:
    """Identity from what torchrun (or the user) put in the environment."""
    env = os.environ
    return dict(
        pid=os.getpid(),
        rank=_int(env.get("RANK"), -1),
        local_rank=_int(env.get("LOCAL_RANK"), -1),
        world_size=_int(env.get("WORLD_SIZE"), -1),
        uid=os.getuid(),
        started_at=_monotonic(),
        started_wall=time.time(),
        run_id=env.get("TORCHELASTIC_RUN_ID", ""),
        hostname=socket.gethostname(),
        torch_version="",
        backend="",
        device_type="",
        compute_dtype="",
        data_fingerprint="",
        data_batches=-1,
        data_shards=-1,
    )


def open_writer(directory: str | None = None, **identity) -> HeartbeatWriter | NullWriter:
    """Create this process's record; on any failure warn once and return a NullWriter."""
    ident = default_identity()
    ident.update({k: v for k, v in identity.items() if v is not None})
    try:
        directory = prepare_dir(directory)
        path = record_path(directory, ident["rank"], ident["pid"])
        # O_NOFOLLOW: a symlink planted in the run directory must not redirect us.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        mem = None
        try:
            os.ftruncate(fd, layout.RECORD_SIZE)
            mem = mmap.mmap(fd, layout.RECORD_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            writer = HeartbeatWriter(path, fd, mem, ident)
        except BaseException:
            if mem is not None:
                try:
                    mem.close()
                except BufferError:  # a half-made core still holds it; the GC frees both
                    pass
            os.close(fd)
            raise
        try:
            retention.prune(directory, retention.ttl_from_env(), keep=path)
        except Exception:  # best effort, and never a reason to stop heartbeats
            pass
        return writer
    except (OSError, struct.error, TypeError, ValueError) as err:
        warnings.warn(f"ddpwatch: heartbeats off, cannot write a record in "
                      f"{directory!r}: {err}", RuntimeWarning, stacklevel=2)
        return NullWriter()


def _int(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
