"""The daemon side of the heartbeat channel: consistent reads, never an exception.

A record file that is truncated, from another layout version, garbage, or owned
by someone other than its process is *skipped with a reason* (the caller shows
or counts it); it never raises out of `read_dir`.

Record files belong to other users: they are read with pread(2) into a buffer
of our own, never mapped. A mapping of a file its owner can truncate is a
SIGBUS waiting to happen (a user shrinking their record after the
size check killed the root daemon with "Fatal Python error: Bus error"); a
pread of a shrunk file just returns fewer bytes, which the layout check refuses.
"""
from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass

from . import layout
from .native import hotpath
from .paths import default_dir

READ_RETRIES = 200  # a writer holds the odd seq for well under a microsecond...
BUSY_PATIENCE_S = 0.02  # ...unless it is switched out mid-write on a busy machine


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


def _read_once_python(mem) -> bytes | None:
    """One seqlock read attempt in Python. seq is read on its own before and after
    the bulk copy: a bulk copy (memcpy, `rep movsb`) may load in any order, so a
    seq value taken from inside the copy would prove nothing. Python cannot fence
    its loads, so this is ordered only on x86 (total store order): the fallback
    where the C module was not built."""
    (before,) = layout.SEQ.unpack_from(mem, layout.SEQ_OFFSET)
    if before and not before & 1:
        data = mem[:layout.RECORD_SIZE]
        (after,) = layout.SEQ.unpack_from(mem, layout.SEQ_OFFSET)
        if after == before:
            return data
    return None


def attempt_reader():
    """One seqlock read attempt: _hotpath.read_once where it was built (its loads
    are ordered on any CPU), else the Python one."""
    in_c = getattr(hotpath(), "read_once", None)
    if in_c is None:
        return _read_once_python
    return lambda mem: in_c(mem, layout.SEQ_OFFSET, layout.RECORD_SIZE)


def read_consistent(mem, read_once=None, patience_s: float = BUSY_PATIENCE_S) -> bytes | None:
    """Seqlock read of a record (a buffer, or a file descriptor with
    `pread_once`): a copy taken while seq stayed even and unchanged, or None if
    the writer kept it busy throughout."""
    read_once = read_once or attempt_reader()
    give_up = None
    attempt = 0
    while True:
        data = read_once(mem)
        if data is not None:
            return data
        attempt += 1
        if attempt > 20:
            os.sched_yield()  # let a writer on this core finish its publish
        if attempt >= READ_RETRIES:
            now = time.monotonic()
            give_up = give_up or now + patience_s
            if now >= give_up:
                return None
            time.sleep(0.001)


def pread_once(fd: int) -> bytes | None:
    """One seqlock read attempt through the file: seq, the whole record, seq
    again, each its own pread. Each pread is a separate kernel copy made in
    program order, so an even seq unchanged around the bulk copy means no
    publish overlapped it (the writer's release stores are ordered by
    _hotpath.c, or by x86's total store order in the Python writer). A file
    shorter than a record gives None via the length check, never a fault."""
    head = os.pread(fd, layout.SEQ.size, layout.SEQ_OFFSET)
    if len(head) != layout.SEQ.size:
        raise layout.LayoutError("truncated while read")
    (before,) = layout.SEQ.unpack(head)
    if not before or before & 1:
        return None
    data = os.pread(fd, layout.RECORD_SIZE, 0)
    if len(data) != layout.RECORD_SIZE:
        raise layout.LayoutError(f"truncated while read: {len(data)} bytes, a record has "
                                 f"{layout.RECORD_SIZE}")
    after = os.pread(fd, layout.SEQ.size, layout.SEQ_OFFSET)
    if len(after) != layout.SEQ.size:
        raise layout.LayoutError("truncated while read")
    return data if after == head else None


def read_file(path: str, read_once=None, patience_s: float = BUSY_PATIENCE_S,
              earlier: layout.Record | None = None) -> layout.Record | Skipped:
    """Read one record file consistently; any problem becomes a Skipped.
    (`read_once` is accepted for old callers and ignored: files are read with
    pread, never mapped.) `patience_s`: how long to wait out a writer that keeps
    the record busy (a caller reading many files gives each a share of a budget:
    a file whose owner flips its seq forever must not hold up the rest).
    `earlier`: what the caller read of this file before (layout.decode keeps
    its ring entries)."""
    try:
        # O_NONBLOCK: a FIFO planted under a record's name must not hang the reader.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        return Skipped(path, f"cannot open: {err.strerror}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return Skipped(path, "not a regular file")
        head = os.pread(fd, 16, 0)
        try:
            layout.check_version(head + b"\0" * (layout.RECORD_SIZE - len(head))
                                 if len(head) == 16 and st.st_size >= layout.RECORD_SIZE
                                 else os.pread(fd, layout.RECORD_SIZE, 0))
        except layout.LayoutError as err:
            return Skipped(path, str(err))
        try:
            data = read_consistent(fd, pread_once, patience_s)
        except layout.LayoutError as err:
            return Skipped(path, str(err))
        if data is None:
            return Skipped(path, "record kept changing while read (writer busy); try again")
        try:
            record = layout.decode(data, earlier)
        except layout.LayoutError as err:
            return Skipped(path, str(err))
        except Exception as err:  # garbage that passed the header check
            return Skipped(path, f"unreadable record: {err}")
        if record.uid != st.st_uid:
            return Skipped(path, f"record claims uid {record.uid} but the file belongs to "
                                 f"uid {st.st_uid}")
        return record
    except OSError as err:
        return Skipped(path, f"cannot read: {err.strerror}")
    finally:
        os.close(fd)


def list_records(directory: str | None = None) -> list[str]:
    directory = directory or default_dir()
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [os.path.join(directory, n) for n in names if n.endswith(layout.FILE_SUFFIX)]


def read_dir(directory: str | None = None) -> tuple[list[layout.Record], list[Skipped]]:
    """All records in the run directory, and the files that were skipped with why."""
    records, skipped = [], []
    read_once = attempt_reader()
    for path in list_records(directory):
        result = read_file(path, read_once)
        (skipped if isinstance(result, Skipped) else records).append(result)
    return records, skipped
