"""The rank side of the heartbeat channel: one mmap'd record, written in place.

A rank must never be slowed, blocked or crashed by being watched. So the hot
path (`enter`, `exit`, `step`) only stores a few fields into a shared-memory
mapping: no syscall, no allocation beyond the values, and no exception can
escape (set-up problems turn the writer off with one warning).

Two implementations of the record's state machine, one behaviour:
`ddpwatch._hotpath.Core` (C, used when it was built: about a tenth of the CPU
per collective) and `PyCore` below (the reference, and the fallback where no
compiler was found or DDPWATCH_PURE_PYTHON=1). The tests run against both.

The seqlock: every publish stores `seq` odd (one aligned 8-byte store through
ctypes), packs the new values, then stores `seq` even. x86 keeps stores in
program order (TSO), so a reader that sees the same even seq before and after
its copy has a consistent record. (The torn-read test caught the first version,
which packed seq with struct.pack_into: that zero-fills before it writes.) Several threads of
one rank may publish (async-op completion callbacks run on backend threads),
so PyCore's publishes take an uncontended lock; it is never held across
anything slow. (The C Core needs none: it never releases the GIL mid-write.)
"""
from __future__ import annotations

import ctypes
import mmap
import os
import socket
import struct
import threading
import time
import warnings

from . import layout, retention
from .paths import record_path, prepare_dir

_monotonic = time.monotonic
_pack_progress = layout.PROGRESS.pack_into
_pack_entry = layout.ENTRY.pack_into
_pack_exit = layout.EXIT.pack_into
_pack_ring = layout.RING_SLOT.pack_into
_PROGRESS_OFFSET = layout.PROGRESS_OFFSET
_EXIT_OFFSET = layout.EXIT_OFFSET
_RING_OFFSET = layout.RING_OFFSET
_RING_SLOT_SIZE = layout.RING_SLOT.size
_RING_SLOTS = layout.RING_SLOTS
P = layout.P
INSIDE = layout.Phase.INSIDE
OUTSIDE = layout.Phase.OUTSIDE
# State list indices the hot path uses, as constants (P.X is an attribute lookup).
_SEQ, _OUTSTANDING, _COMPLETED, _COLL_S, _BYTES_TOTAL = (
    P.COLLECTIVE_SEQ, P.OUTSTANDING, P.COLLECTIVES_COMPLETED, P.COLLECTIVE_SECONDS,
    P.BYTES_TOTAL)
_ENTRY_END, _EXIT_START, _EXIT_END = layout.ENTRY_END, layout.EXIT_START, layout.EXIT_END
assert (P.PHASE, P.UPDATED_AT) == (_EXIT_START, _EXIT_START + 2)


class PyCore:
    """One record's progress state and its publishing, in Python. The C
    `_hotpath.Core` mirrors this class method for method."""

    def __init__(self, mem: mmap.mmap, seq_offset: int, progress_offset: int,
                 ring_offset: int, ring_slots: int, header: bytes):
        self._mem = mem
        # One aligned 8-byte store per seq update (see layout: never pack_into).
        self._seq_cell = ctypes.c_uint64.from_buffer(mem, seq_offset)
        self._lock = threading.Lock()
        # Progress state, in layout.PROGRESS_FIELDS order, packed at each publish
        # (a list indexed by layout.P: fewer attribute look-ups on the hot path
        # than one attribute per field).
        self._state = [0] * len(layout.PROGRESS_FIELDS)
        self._state[P.PHASE] = layout.Phase.INIT
        self._seq = self._seq_cell.value & ~1
        self._busy_since = 0.0
        self.closed = False
        self.write_header(header)
        # The first step is timed from here (or from the end of rendezvous).
        now = _monotonic()
        self._state[P.STEP_STARTED_AT] = now
        self._state[P.UPDATED_AT] = now
        with self._lock:
            self._publish_state()

    def write_header(self, header: bytes) -> None:
        with self._lock:
            if self.closed:
                return
            self._seq += 1
            self._seq_cell.value = self._seq
            self._mem[0:len(header)] = header
            self._seq += 1
            self._seq_cell.value = self._seq

    def state(self) -> tuple:
        return tuple(self._state)

    def counters(self) -> tuple[float, int]:
        with self._lock:
            st = self._state
            busy = st[P.COLLECTIVE_SECONDS]
            if st[P.OUTSTANDING]:
                busy += _monotonic() - self._busy_since
            return busy, st[P.COLLECTIVES_COMPLETED]

    # --- the hot path ----------------------------------------------------------
    def enter(self, op_code: int, nbytes: int) -> tuple[int, float, int, int]:
        """A collective begins. Returns the token to hand to `exit`."""
        self._lock.acquire()
        try:
            now = _monotonic()
            st = self._state
            seq = st[_SEQ] + 1
            outstanding = st[_OUTSTANDING] + 1
            if outstanding == 1:
                self._busy_since = now
            # All an entry changes, in layout order: collective_seq, op, bytes,
            # entered_at, phase, outstanding, updated_at (layout.ENTRY).
            st[:_ENTRY_END] = entry = (seq, op_code, nbytes, now, INSIDE, outstanding, now)
            if not self.closed:
                cell = self._seq_cell
                odd = self._seq + 1
                cell.value = odd
                _pack_entry(self._mem, _PROGRESS_OFFSET, *entry)
                self._seq = cell.value = odd + 1
            return (seq, now, op_code, nbytes)
        finally:
            self._lock.release()

    def exit(self, token: tuple[int, float, int, int] | None) -> None:
        """The collective of `token` completed (or failed)."""
        if token is None:
            return
        seq, start, op_code, nbytes = token
        self._lock.acquire()
        try:
            now = _monotonic()
            st = self._state
            outstanding = st[_OUTSTANDING] - 1
            if outstanding <= 0:
                outstanding = 0
                st[_COLL_S] += now - self._busy_since
            # phase, outstanding, updated_at, collectives_completed,
            # collective_seconds, bytes_total (layout.EXIT)
            st[_EXIT_START:_EXIT_END] = exit_ = (
                OUTSIDE if outstanding == 0 else INSIDE, outstanding, now,
                st[_COMPLETED] + 1, st[_COLL_S], st[_BYTES_TOTAL] + nbytes)
            if not self.closed:
                mem = self._mem
                cell = self._seq_cell
                odd = self._seq + 1
                cell.value = odd
                # layout.ring_offset(seq), inlined: this is the hot path
                _pack_ring(mem, _RING_OFFSET + ((seq - 1) % _RING_SLOTS) * _RING_SLOT_SIZE,
                           seq, op_code, nbytes, start, now)
                _pack_exit(mem, _EXIT_OFFSET, *exit_)
                self._seq = cell.value = odd + 1
        finally:
            self._lock.release()

    def step(self, tokens: int) -> None:
        """A training step ended (optimizer stepped); `tokens` it processed."""
        with self._lock:
            now = _monotonic()
            st = self._state
            st[P.LAST_STEP_SECONDS] = now - st[P.STEP_STARTED_AT]
            st[P.STEP_SECONDS] += st[P.LAST_STEP_SECONDS]
            st[P.STEPS_COMPLETED] += 1
            st[P.STEP] += 1
            st[P.TOKENS] += tokens
            st[P.LAST_STEP_TOKENS] = tokens
            st[P.STEP_STARTED_AT] = st[P.UPDATED_AT] = now
            self._publish_state()

    def set_phase(self, phase: int) -> None:
        with self._lock:
            now = _monotonic()
            st = self._state
            if not st[P.OUTSTANDING]:
                st[P.PHASE] = phase
            if phase == layout.Phase.OUTSIDE and not st[P.STEPS_COMPLETED]:
                st[P.STEP_STARTED_AT] = now  # training starts after rendezvous
            st[P.UPDATED_AT] = now
            self._publish_state()

    def _publish_state(self) -> None:
        """Write the whole state under the seqlock. Caller holds the lock."""
        if self.closed:
            return
        cell = self._seq_cell
        seq = self._seq + 1
        cell.value = seq
        _pack_progress(self._mem, _PROGRESS_OFFSET, *self._state)
        self._seq = seq + 1
        cell.value = seq + 1

    def close(self, *, exited: bool = True) -> None:
        """Publish EXITED (if asked) and let go of the mapping."""
        with self._lock:
            if self.closed:
                return
            if exited:
                self._state[P.PHASE] = layout.Phase.EXITED
                self._state[P.UPDATED_AT] = _monotonic()
                self._publish_state()
            self.closed = True
            del self._seq_cell  # releases its export of the mapping


def core_class():
    """The C Core when it was built for this layout, else PyCore."""
    if os.environ.get("DDPWATCH_PURE_PYTHON", "") not in ("", "0"):
        return PyCore
    try:
        from .. import _hotpath
    except ImportError:
        return PyCore
    fields = tuple((name, code) for name, code in layout.PROGRESS_FIELDS)
    if (_hotpath.LAYOUT_VERSION, _hotpath.FIELDS, _hotpath.RING_SLOT_SIZE) != (
            layout.LAYOUT_VERSION, fields, layout.RING_SLOT.size):
        return PyCore  # a stale build of an older layout: never write a wrong record
    return _hotpath.Core


class HeartbeatWriter:
    """Owns this process's heartbeat record. Create it with `open_writer()`."""

    def __init__(self, path: str, fd: int, mem: mmap.mmap, identity: dict, core_cls=None):
        self.path = path
        self._fd = fd
        self._mem = mem
        self._lock = threading.Lock()  # identity changes only; the core guards its state
        self._identity = identity
        self.core = (core_cls or core_class())(
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
