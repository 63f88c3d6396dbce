"""Work family: whether anybody works for a rank over the window, measured
(docs/judgement-over-time.md "Is anybody working?"). A rank waiting outside the
collectives is paused only while it, or a process working for it, shows work:
a stack at a pause site (an evaluation, a checkpoint, a DataLoader) says what
the pause is, never that the rank is fine. The hangs people hit most sit exactly
there: a DataLoader's worker blocked on a read that never returns, a checkpoint
written to a mount that stalled, a metrics server that stopped answering. Pure.

What counts as work, each over the window (first to last snapshot):
* CPU wanted (used plus run-queue wait) of at least IDLE_CPU, as for any rank;
* a thread in disk I/O (state D);
* its I/O counters moving (/proc/PID/io: reads and writes of files and pipes,
  bytes to and from storage) at WORK_BYTES_S or more;
* bytes on its sockets that are not the job's collective links nor its store
  (a checkpoint streamed to object storage, a logger's upload), at WORK_BYTES_S;
* a worker of its (a DataLoader's, a compiler's: probes/process.py WorkerObs)
  doing any of these.
"""
from __future__ import annotations

from ...observe.snapshot import Snapshot
from ..stackmatch import is_library, main_thread
from .lookup import Window, proc_of, sockets_of, stacks_of
from .process import IDLE_CPU
from .sockets import _far_end_rank
from .spec import NUMBER, declare
from .window import cpu_wanted

SIGNALS = declare(
    ("io_mb_s", NUMBER, "what the rank read or wrote (files, pipes, storage: /proc/PID/io) "
                        "over the window; None unreadable", "MB/s"),
    ("other_socket_mb_s", NUMBER, "what it sent or received on sockets that are neither "
                                  "links to the job's ranks nor its store (an upload, a "
                                  "logger's server); None unmeasured", "MB/s"),
    ("workers", int, "its child processes read (DataLoader or compile workers, "
                     "subprocesses)", "count"),
    ("workers_working", int, "of its workers, those that worked over the window (CPU "
                             "wanted, disk I/O, I/O counters moving)", "count"),
    ("idle_worker", str, "its first idle worker and where it waits, when it has any and "
                         "none works (\"worker pid 4242 idle at __getitem__ (data.py:41) <- "
                         "fetch (fetch.py:52)\")"),
    ("working", bool, "the window shows it, or a worker of its, working: CPU wanted >= 5%, "
                      "disk I/O (state D), I/O counters or non-collective socket bytes "
                      "moving at 8 KiB/s or more. False when nothing shows work, or "
                      "nothing could be measured: calm needs evidence"),
    ("work_evidence", str, "what shows it working (\"CPU 85%\", \"writes 3.2 MB/s\", "
                           "\"2 DataLoader workers work (pid 4242: CPU 90%)\"); "
                           "None when it is idle"),
)

# Bytes a second that count as work. A logger's line a second (~100 B/s) from a
# thread beside an idle main thread is no work to wait for; a checkpoint written
# to a slow disk or socket at tens of KB/s is (tests/daemon/test_pause_hangs.py
# measures both sides: docs/judgement-over-time.md "Between working and idle").
WORK_BYTES_S = 8192.0


def measure(history: tuple[Snapshot, ...], pid: int, known: dict) -> dict:
    """`known`: the rank's signals of the families measured before (its CPU)."""
    w = Window(history[0], history[-1])
    now, before = proc_of(w.last, pid), proc_of(w.first, pid)
    if now is None:
        return {}
    seconds = w.seconds
    io, sock = _io_rate(before, now, seconds), _socket_rate(w, pid, now, seconds)
    s: dict = {"io_mb_s": _mb(io), "other_socket_mb_s": _mb(sock)}
    busy = _busy_workers(before, now, seconds)
    s["workers"] = len(now.workers)
    s["workers_working"] = len(busy)
    evidence = _rank_work(io, sock, now)
    wanted = cpu_wanted(known)
    if wanted is not None and wanted >= IDLE_CPU:
        evidence.insert(0, f"CPU {wanted:.0%}")
    if busy:
        pid_, how = busy[0]
        evidence.append(f"{len(busy)} of its {len(now.workers)} worker(s) work (pid {pid_}: "
                        f"{how})")
    s["work_evidence"] = "; ".join(evidence) or None
    s["working"] = bool(evidence)
    if not busy and now.workers:
        s["idle_worker"] = _idle_worker(history, now.workers)
    return s


def _idle_worker(history: tuple[Snapshot, ...], workers) -> str:
    """The idle worker that says most: one stopped in the user's code (a
    Dataset's __getitem__ blocked on a read), before one that only waits for
    its next indices (a DataLoader's other workers, once the blocked one holds
    up the batches in order); without dumps, the first."""
    found = [(w, _main_frames(stacks_of(history, w.pid))) for w in workers]
    dumped = [(w, frames) for w, frames in found if frames]
    if not dumped:
        return f"worker pid {workers[0].pid} idle"
    w, frames = next(((w, f) for w, f in dumped if any(not is_library(x) for x in f)),
                     dumped[0])
    user = next((i for i, x in enumerate(frames) if not is_library(x)), 0)
    shown = frames[user:user + WORKER_FRAMES]
    return f"worker pid {w.pid} idle at " + " <- ".join(
        f"{x.name} ({x.short_filename}:{x.line})" for x in shown)


def _main_frames(dumps) -> tuple:
    """The newest dump's main-thread frames the worker runs itself, innermost
    first; () without one. A forked worker's stack goes on past multiprocessing's
    _bootstrap into the frames it inherited from its rank (the training loop's
    `for x in loader` at <module>): those say where the rank was at the fork, not
    where the worker waits, and would make every worker look stopped in user code."""
    for dump in reversed(dumps):
        if dump.status == "ok" and dump.threads:
            thread = main_thread(dump)  # a DataLoader worker runs its loop there
            if thread is not None and thread.frames:
                return _own_frames(thread.frames)
    return ()


def _own_frames(frames: tuple) -> tuple:
    cut = next((i for i, x in enumerate(frames) if x.name.split(".")[-1] == "_bootstrap"
                and "multiprocessing" in x.filename), len(frames))
    return frames[:cut] or frames


WORKER_FRAMES = 2


def _mb(rate: float | None) -> float | None:
    return None if rate is None else round(rate / 1e6, 4)


def _rank_work(io: float | None, sock: float | None, now) -> list[str]:
    parts = []
    if now.state == "D" or any(t.state == "D" for t in now.threads):
        parts.append("in disk I/O (state D)")
    if (io or 0) >= WORK_BYTES_S:
        parts.append(f"reads or writes {_rate(io)}")
    if (sock or 0) >= WORK_BYTES_S:
        parts.append(f"moves {_rate(sock)} on sockets outside the job")
    return parts


def _rate(b: float) -> str:
    return f"{b / 1e6:.1f} MB/s" if b >= 1e5 else f"{b / 1e3:.0f} KB/s"


def _io_total(io) -> int:
    return max(io.rchar + io.wchar, io.read_bytes + io.write_bytes)


def _io_rate(before, now, seconds: float) -> float | None:
    if (before is None or before.io is None or now.io is None or seconds <= 0
            or before.start_time_s != now.start_time_s):
        return None
    moved = _io_total(now.io) - _io_total(before.io)
    return round(max(moved, 0) / seconds, 1)


def _socket_rate(w: Window, pid: int, now, seconds: float) -> float | None:
    """Bytes a second on the rank's sockets but its links to the job's ranks and
    its store (MASTER_PORT): those move only inside collectives, which a rank
    outside them does not run. Sockets present at both ends, matched by inode;
    None when the byte counts were not read (a look without `ss -ti`)."""
    if seconds <= 0:
        return None
    port = now.env.get("MASTER_PORT", "")
    master = int(port) if port.isdigit() else -1
    then = {k.inode: k for k in sockets_of(w.first, pid) if k.bytes_sent >= 0}
    moved, measured = 0, False
    for k in sockets_of(w.last, pid):
        old = then.get(k.inode)
        if old is None or k.bytes_sent < 0 or master in (k.local_port, k.peer_port):
            continue
        if _far_end_rank(w.last, k) is not None:
            continue
        measured = True
        moved += max(k.bytes_sent - old.bytes_sent, 0) + max(
            k.bytes_received - old.bytes_received, 0)
    return round(moved / seconds, 1) if measured else None


def _busy_workers(before, now, seconds: float) -> list[tuple[int, str]]:
    """(pid, how it works) of the workers that worked over the window; a worker
    new since the window's start (forked at an epoch's start) counts from zero."""
    if seconds <= 0:
        return []
    old = {w.pid: w for w in before.workers} if before is not None else {}
    busy = []
    for w in now.workers:
        o = old.get(w.pid)
        if o is not None and o.start_time_s != w.start_time_s:
            o = None  # pid reused
        how = _worker_work(o, w, seconds)
        if how:
            busy.append((w.pid, how))
    return busy


def _worker_work(o, w, seconds: float) -> str:
    if w.state == "D":
        return "disk I/O"
    if w.cpu_seconds < 0:
        return ""
    cpu = w.cpu_seconds - (o.cpu_seconds if o is not None else 0.0)
    if o is not None and o.runqueue_wait_s >= 0 and w.runqueue_wait_s >= 0:
        cpu += w.runqueue_wait_s - o.runqueue_wait_s
    if o is None:
        # born inside the window: all its CPU is this window's (a fork at an
        # epoch's start imports and opens shards)
        return f"started, CPU {cpu:.1f}s" if cpu >= IDLE_CPU * seconds else ""
    if cpu / seconds >= IDLE_CPU:
        return f"CPU {cpu / seconds:.0%}"
    rate = _io_rate(o, w, seconds)  # a worker's counters read as a rank's
    if (rate or 0) >= WORK_BYTES_S:
        return f"reads or writes {_rate(rate)}"
    return ""
