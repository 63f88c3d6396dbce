"""The fixed binary layout of one rank's heartbeat record, and pure codecs for it.

One record per rank, one writer (the rank), any number of readers (the daemon,
`ddpwatch ranks`). Readers never lock: the writer bumps `seq` to an odd value
before it changes anything and to the next even value after (a seqlock), and a
reader retries while it sees an odd `seq` or a `seq` that changed under it.

Everything here is pure: bytes in, values out. The writer and reader modules do
the mmap and file handling. Times are CLOCK_MONOTONIC seconds (`time.monotonic()`),
which is one clock for every process on a host, so the daemon can age a record
without trusting wall clocks.

Layout version history:
  1 - first layout.
  2 - progress fields all 8 bytes and reordered, so that a collective's entry
      and its exit each rewrite one contiguous run of fields (the hot path
      packs 7 and 6 fields instead of all 17).
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

MAGIC = b"DDPWHB01"
LAYOUT_VERSION = 2
RING_SLOTS = 64
FILE_SUFFIX = ".hb"

# Operation codes stored in `op`. Order is part of the layout: append only.
OPS = (
    "none", "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
    "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv",
    "batch_isend_irecv", "ddp_bucket_all_reduce", "all_reduce_coalesced",
    "all_gather_coalesced", "other", "ddp_rebuild_buckets", "ddp_sync_buffers",
)
OP_CODE = {name: code for code, name in enumerate(OPS)}
# The torch.distributed functions whose calls are collectives of the record (the
# instrumentation wraps them; stack matching knows them): every op but our own.
TORCH_COLLECTIVES = tuple(op for op in OPS if op not in (
    "none", "other", "ddp_bucket_all_reduce", "ddp_rebuild_buckets", "ddp_sync_buffers"))


class Phase:
    """Where the rank is, as the writer last said.

    Transitions: INIT -> RENDEZVOUS -> (OUTSIDE <-> INSIDE)* -> EXITED.
    INIT until the process group is being set up; RENDEZVOUS while
    init_process_group waits for peers; INSIDE from a collective's entry until its
    completion (for async ops: until the work is seen complete; while several are
    outstanding, until the last completes); EXITED is written at interpreter exit.
    """
    INIT = 0
    OUTSIDE = 1
    INSIDE = 2
    EXITED = 3
    RENDEZVOUS = 4
    NAMES = ("init", "outside", "inside", "exited", "rendezvous")


# --- the record -----------------------------------------------------------------
# Header: identity, written once at start (and when identity changes, under the lock).
HEADER = struct.Struct(
    "<8s"   # magic
    "I"     # layout version
    "I"     # record size in bytes (whole file), a second check on layout
    "q"     # pid
    "i"     # rank
    "i"     # local rank
    "i"     # world size
    "i"     # uid of the writer (checked against the owning process)
    "d"     # started_at (monotonic)
    "d"     # started_wall (unix time, for humans only)
    "64s"   # run id
    "64s"   # hostname
    "32s"   # torch version
    "16s"   # backend
    "16s"   # device type
    "16s"   # compute dtype the rank actually computes in
    "64s"   # data fingerprint (hex digest of shard list + batch count)
    "q"     # data batches per epoch on this rank (-1 unknown)
    "q"     # data shards on this rank (-1 unknown)
)
SEQ = struct.Struct("<Q")
SEQ_OFFSET = HEADER.size  # seq lives right after the identity, 8-aligned
assert SEQ_OFFSET % 8 == 0

# Progress + counters, every field 8 bytes. seq itself is never written with
# struct.pack_into: CPython zero-fills the target before packing, which would show
# readers a transient even seq 0. The order is the hot path's: a collective's
# entry rewrites fields [0, ENTRY_END), its exit [EXIT_START, EXIT_END), a step
# or a phase change all of them.
PROGRESS_FIELDS = (
    ("collective_seq", "q"),         # collectives entered so far; the current one's number
    ("op", "q"),                     # current / last op code
    ("bytes", "q"),                  # bytes of the current / last collective
    ("entered_at", "d"),             # when the current / last collective began
    ("phase", "q"),                  # Phase
    ("outstanding", "q"),            # collectives entered and not complete (async ops)
    ("updated_at", "d"),             # last heartbeat
    ("collectives_completed", "q"),
    ("collective_seconds", "d"),     # wall time with a collective outstanding (overlapping
                                     # async bucket all-reduces are not counted twice)
    ("bytes_total", "q"),            # bytes moved by completed collectives
    ("step", "q"),                   # current step (= steps completed)
    ("step_started_at", "d"),
    ("steps_completed", "q"),
    ("step_seconds", "d"),           # seconds in completed steps
    ("last_step_seconds", "d"),
    ("tokens", "q"),                 # tokens processed
    ("last_step_tokens", "q"),
)
ENTRY_END = 7      # collective_seq .. updated_at
EXIT_START = 4     # phase ..
EXIT_END = 10      # .. bytes_total
PROGRESS = struct.Struct("<" + "".join(code for _, code in PROGRESS_FIELDS))
ENTRY = struct.Struct("<" + "".join(code for _, code in PROGRESS_FIELDS[:ENTRY_END]))
EXIT = struct.Struct("<" + "".join(code for _, code in PROGRESS_FIELDS[EXIT_START:EXIT_END]))
# Index of each field in a progress tuple (the writer keeps its state as a list).
P = type("P", (), {name.upper(): i for i, (name, _) in enumerate(PROGRESS_FIELDS)})
PROGRESS_OFFSET = SEQ_OFFSET + SEQ.size
EXIT_OFFSET = PROGRESS_OFFSET + 8 * EXIT_START
# The ring of recent collectives: collective number n lives in slot (n - 1) % 64,
# written when it completes, so peers' rings can be lined up by seq.
RING_SLOT = struct.Struct("<qqqdd")  # seq, op, bytes, start, end
RING_OFFSET = PROGRESS_OFFSET + PROGRESS.size
RECORD_SIZE = RING_OFFSET + RING_SLOT.size * RING_SLOTS


@dataclass(frozen=True)
class RingEntry:
    seq: int
    op: str
    bytes: int
    start: float
    end: float


@dataclass(frozen=True)
class Record:
    """One consistent read of a heartbeat record."""
    pid: int
    rank: int
    local_rank: int
    world_size: int
    uid: int
    started_at: float
    started_wall: float
    run_id: str
    hostname: str
    torch_version: str
    backend: str
    device_type: str
    compute_dtype: str
    data_fingerprint: str
    data_batches: int
    data_shards: int
    seq: int
    step: int
    collective_seq: int
    op: str
    phase: str
    outstanding: int
    bytes: int
    entered_at: float
    updated_at: float
    step_started_at: float
    collectives_completed: int
    collective_seconds: float
    steps_completed: int
    step_seconds: float
    last_step_seconds: float
    tokens: int
    last_step_tokens: int
    bytes_total: int
    ring: tuple[RingEntry, ...]

    @property
    def in_collective(self) -> bool:
        return self.phase == "inside"

    def inside_s(self, now: float, alive: bool) -> float:
        """Seconds inside the current collective at `now` (the record's clock): 0
        outside one, and 0 for a writer that is gone (a dead rank waits in nothing;
        its record keeps the phase it died in)."""
        return max(now - self.entered_at, 0.0) if alive and self.in_collective else 0.0


class LayoutError(ValueError):
    """The bytes are not a record this reader understands; the message says why."""


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _field(value: str, size: int) -> bytes:
    data = value.encode("utf-8")[:size]
    return data


def pack_header(*, pid: int, rank: int, local_rank: int, world_size: int, uid: int,
                started_at: float, started_wall: float, run_id: str, hostname: str,
                torch_version: str, backend: str, device_type: str, compute_dtype: str,
                data_fingerprint: str, data_batches: int, data_shards: int) -> bytes:
    return HEADER.pack(
        MAGIC, LAYOUT_VERSION, RECORD_SIZE, pid, rank, local_rank, world_size, uid,
        started_at, started_wall, _field(run_id, 64), _field(hostname, 64),
        _field(torch_version, 32), _field(backend, 16), _field(device_type, 16),
        _field(compute_dtype, 16), _field(data_fingerprint, 64), data_batches, data_shards)


def check_version(buf: bytes) -> None:
    """Raise LayoutError naming what is wrong if `buf` is not a v1 record."""
    if len(buf) < 16:
        raise LayoutError(f"truncated: {len(buf)} bytes, a record has {RECORD_SIZE}")
    magic, version, size = struct.unpack_from("<8sII", buf, 0)
    if magic != MAGIC:
        raise LayoutError(f"not a ddpwatch heartbeat record (magic {magic!r})")
    if version != LAYOUT_VERSION:
        raise LayoutError(f"layout version {version}, this ddpwatch reads version "
                          f"{LAYOUT_VERSION}: upgrade ddpwatch to match the ranks")
    if size != RECORD_SIZE or len(buf) < RECORD_SIZE:
        raise LayoutError(f"truncated or resized: {len(buf)} bytes (header says {size}), "
                          f"a version {LAYOUT_VERSION} record has {RECORD_SIZE}")


def decode(buf: bytes, earlier: Record | None = None) -> Record:
    """Decode a consistent copy of a record's bytes (the reader did the seqlock).
    `earlier`: this file's record as last read: returned as it is when its
    writer published nothing since, else its ring entries that the bytes still
    hold are kept rather than made again (the daemon reads 256 records a
    second, and a collective changes one slot of 64: heartbeats probe)."""
    check_version(buf)
    h = HEADER.unpack_from(buf, 0)
    (seq,) = SEQ.unpack_from(buf, SEQ_OFFSET)
    writer = earlier is not None and earlier.pid == h[3] and earlier.started_at == h[8]
    if writer and earlier.seq == seq:
        # Nothing published since: every write moves seq (the seqlock, pycore.py
        # and _hotpath.c). A record that does not change (a hung rank's, a rank
        # computing between collectives) is not decoded again each tick.
        return earlier
    progress = dict(zip(_PROGRESS_NAMES, PROGRESS.unpack_from(buf, PROGRESS_OFFSET)))
    same = writer and earlier.collective_seq <= progress["collective_seq"]
    progress["ring"] = _ring(buf, progress["collective_seq"], earlier if same else None)
    phase = progress.pop("phase")
    progress["op"] = _op_name(progress["op"])
    # The bytes are another user's: a time that is no number would reach every
    # subtraction, metric and JSON document downstream. A writer never makes one.
    for name in ("started_at", "started_wall"):
        _finite(name, h[8 if name == "started_at" else 9])
    for name, value in progress.items():
        if isinstance(value, float):
            _finite(name, value)
    progress.update(
        pid=h[3], rank=h[4], local_rank=h[5], world_size=h[6], uid=h[7], started_at=h[8],
        started_wall=h[9], run_id=_text(h[10]), hostname=_text(h[11]),
        torch_version=_text(h[12]), backend=_text(h[13]), device_type=_text(h[14]),
        compute_dtype=_text(h[15]), data_fingerprint=_text(h[16]), data_batches=h[17],
        data_shards=h[18], seq=seq,
        phase=Phase.NAMES[phase] if 0 <= phase < len(Phase.NAMES) else f"phase{phase}")
    return _record(progress)


def _record(fields: dict) -> Record:
    """A Record of exactly its fields (`fields` names each once, as decode
    makes it), without the frozen dataclass's __init__: that sets 35 fields one
    object.__setattr__ at a time, 6 us of a read's 18 (the daemon reads 256
    records a tick). The object is the same as Record(**fields) gives:
    tests/unit/heartbeat/test_heartbeat.py checks both ways."""
    record = object.__new__(Record)
    record.__dict__.update(fields)
    return record


_PROGRESS_NAMES = tuple(name for name, _ in PROGRESS_FIELDS)


def _ring(buf: bytes, cseq: int, earlier: Record | None) -> tuple[RingEntry, ...]:
    """The completed collectives of the last RING_SLOTS, oldest first: collective
    n is in its slot when the slot says n (slots of collectives still
    outstanding hold older entries) and its times are numbers.

    A slot is written when its collective completes (pycore.py, _hotpath.c):
    collective n's, then n + RING_SLOTS's. The entries `earlier` (the same
    writer's record, read before) holds are kept as they are, and only the
    slots completed since are decoded. One difference from a read afresh: an
    async collective outstanding for RING_SLOTS collectives that completes late
    writes over the slot of one 64 later, which a fresh read then leaves out
    and this keeps (it did complete; tests/unit/heartbeat/test_heartbeat.py)."""
    first = max(1, cseq - RING_SLOTS + 1)
    if cseq < first:
        return ()
    old = earlier.ring if earlier is not None else ()
    if (old and old[0].seq == max(1, earlier.collective_seq - RING_SLOTS + 1)
            and old[-1].seq - old[0].seq + 1 == len(old) and old[-1].seq <= cseq):
        # no gap then (none outstanding before its last): what is still in range, then the rest
        kept = old[max(0, first - old[0].seq):]
        return kept + _ring_from(buf, max(first, old[-1].seq + 1), cseq, {})
    return _ring_from(buf, first, cseq, {e.seq: e for e in old})


def _ring_from(buf: bytes, first: int, cseq: int, known: dict) -> tuple[RingEntry, ...]:
    """Collectives first..cseq, from `known` (seq -> entry) or their slots. Each
    slot is unpacked where it lies, only when needed: a read finds ~20 of the
    64 new (a fast job's tick, benchmarks/README.md "The 8-rank tick's own
    profile")."""
    ring = []
    for n in range(first, cseq + 1):
        old = known.get(n)
        if old is not None:
            ring.append(old)
            continue
        rseq, rop, rbytes, rstart, rend = RING_SLOT.unpack_from(buf, ring_offset(n))
        if rseq == n and math.isfinite(rstart) and math.isfinite(rend):
            ring.append(RingEntry(rseq, _op_name(rop), rbytes, rstart, rend))
    return tuple(ring)


def _finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise LayoutError(f"field {name} is {value!r}, not a finite number")


def ring_offset(collective_seq: int) -> int:
    return RING_OFFSET + ((collective_seq - 1) % RING_SLOTS) * RING_SLOT.size


def _op_name(code: int) -> str:
    return OPS[code] if 0 <= code < len(OPS) else f"op{code}"
