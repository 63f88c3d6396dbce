"""`PyCore`: one record's progress state and its seqlock publishing, in Python.

The reference implementation of the record's state machine, and the fallback
where the C one (ddpwatch/heartbeat/_hotpath.c, which mirrors this method for method) was
not built. writer.py picks one.

The seqlock: every publish stores `seq` odd (one aligned 8-byte store through
ctypes), packs the new values, then stores `seq` even. x86 keeps stores in
program order (TSO), so a reader that sees the same even seq before and after
its copy has a consistent record. (The torn-read test caught the first version,
which packed seq with struct.pack_into: that zero-fills before it writes.)
Several threads of one rank may publish (async-op completion callbacks run on
backend threads), so publishes take an uncontended lock; it is never held
across anything slow. (The C Core needs none: it never releases the GIL
mid-write.)
"""
from __future__ import annotations

import ctypes
import mmap
import operator
import threading
import time

from . import layout

_monotonic = time.monotonic
_PROGRESS = layout.PROGRESS
_pack_entry = layout.ENTRY.pack_into
_pack_exit = layout.EXIT.pack_into
_pack_ring = layout.RING_SLOT.pack_into
_RING_SLOT_SIZE = layout.RING_SLOT.size
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
        if progress_offset != seq_offset + 8 or len(header) > seq_offset:
            raise ValueError("seq must follow the header, and progress follow seq")
        self._mem = mem
        self._progress_offset = progress_offset
        self._exit_offset = progress_offset + 8 * _EXIT_START
        self._ring_offset, self._ring_slots = ring_offset, ring_slots
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
                _pack_entry(self._mem, self._progress_offset, *entry)
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
                slot = (seq - 1) % self._ring_slots
                _pack_ring(mem, self._ring_offset + slot * _RING_SLOT_SIZE,
                           seq, op_code, nbytes, start, now)
                _pack_exit(mem, self._exit_offset, *exit_)
                self._seq = cell.value = odd + 1
        finally:
            self._lock.release()

    def step(self, tokens: int) -> None:
        """A training step ended (optimizer stepped); `tokens` it processed."""
        tokens = operator.index(tokens)  # TypeError before anything changes, as in C
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
        data = _PROGRESS.pack(*self._state)  # a bad value raises here, before seq goes odd
        cell = self._seq_cell
        seq = self._seq + 1
        cell.value = seq
        self._mem[self._progress_offset:self._progress_offset + len(data)] = data
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
