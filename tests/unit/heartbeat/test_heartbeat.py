"""The heartbeat channel on its own: layout, seqlock, bad files, writer off."""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import stat
import struct
import subprocess
import sys
import time
import types

import pytest
from conftest import REPO, need_c_core

from ddpwatch.heartbeat import LAYOUT_VERSION, OP_CODE, Skipped, layout, open_writer, read_dir, read_file
from ddpwatch.heartbeat.liveness import wrote
from ddpwatch.heartbeat.writer import NullWriter

CORES = ("c", "python")


@pytest.fixture(params=CORES, autouse=True)
def core(request, monkeypatch):
    """Every test here runs against both writer cores (children inherit the choice)."""
    if request.param == "c":
        need_c_core()
        monkeypatch.delenv("DDPWATCH_PURE_PYTHON", raising=False)
    else:
        monkeypatch.setenv("DDPWATCH_PURE_PYTHON", "1")
    return request.param


def test_round_trip_identity_progress_and_ring(tmp_path):
    w = open_writer(str(tmp_path), rank=3, local_rank=1, world_size=4, run_id="r1",
                    backend="gloo", compute_dtype="float32", data_fingerprint="abc")
    for i in range(70):
        token = w.enter(OP_CODE["all_reduce"], 100 + i)
        w.exit(token)
    w.step(tokens=512)
    (rec,), skipped = read_dir(str(tmp_path))
    assert skipped == []
    assert (rec.pid, rec.rank, rec.local_rank, rec.world_size) == (os.getpid(), 3, 1, 4)
    assert (rec.run_id, rec.backend, rec.compute_dtype, rec.data_fingerprint) == ("r1", "gloo", "float32", "abc")
    assert rec.collective_seq == 70 and rec.collectives_completed == 70
    assert rec.phase == "outside" and rec.step == 1 and rec.tokens == 512
    assert len(rec.ring) == layout.RING_SLOTS
    assert [e.seq for e in rec.ring] == list(range(7, 71))
    assert rec.ring[-1].bytes == 169 and rec.ring[-1].op == "all_reduce"
    assert all(e.end >= e.start > 0 for e in rec.ring)
    w.close()


def test_a_decoded_record_is_the_one_its_dataclass_makes(tmp_path):
    """layout.decode builds a Record without its __init__ (layout._record): it
    must hold every field, no other, and equal, hash and print as Record(**its
    fields) does; a field added to Record and not decoded fails here."""
    w = open_writer(str(tmp_path), rank=2, world_size=4, run_id="r")
    w.exit(w.enter(OP_CODE["all_reduce"], 8))
    w.step(tokens=3)
    rec = read_file(w.path)
    names = [f.name for f in dataclasses.fields(layout.Record)]
    assert sorted(vars(rec)) == sorted(names)
    # decode adds the header's fields to the progress fields' dict: a name in
    # both would be overwritten silently, where Record(**...) refused it
    header = {"pid", "rank", "local_rank", "world_size", "uid", "started_at", "started_wall",
              "run_id", "hostname", "torch_version", "backend", "device_type",
              "compute_dtype", "data_fingerprint", "data_batches", "data_shards", "seq"}
    assert header.isdisjoint(layout._PROGRESS_NAMES)
    made = layout.Record(**{n: getattr(rec, n) for n in names})
    assert rec == made and hash(rec) == hash(made) and repr(rec) == repr(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.step = 9
    w.close()


def test_a_reread_keeps_the_ring_entries_it_decoded_and_only_of_the_same_writer(tmp_path):
    """layout.decode(buf, earlier): the daemon reads every record each second and
    a collective changes one slot; what is kept must equal a decode from scratch."""
    w = open_writer(str(tmp_path), rank=0)
    for i in range(70):
        w.exit(w.enter(OP_CODE["all_reduce"], i))
    first = read_file(w.path)
    w.exit(w.enter(OP_CODE["broadcast"], 7))
    w.exit(w.enter(OP_CODE["barrier"], 0))
    again = read_file(w.path, earlier=first)
    fresh = read_file(w.path)
    assert again == fresh and [e.seq for e in again.ring] == list(range(9, 73))
    assert again.ring[0] is first.ring[2]  # kept, not made again
    assert again.ring[-1].op == "barrier" and again.ring[-2].op == "broadcast"
    # another writer's record (a new process under the name) keeps nothing of it
    other = dataclasses.replace(first, started_at=first.started_at - 1,
                                ring=tuple(dataclasses.replace(e, bytes=-1) for e in first.ring))
    assert read_file(w.path, earlier=other) == fresh
    w.close()


def test_a_reread_equals_a_fresh_read_whatever_the_writer_did():
    """layout.decode(buf, earlier) against decode(buf), reads taken at random
    between random collectives, sync and async (each async one completes
    within RING_SLOTS of its start, as DDP's buckets do within their step)."""
    import random
    import tempfile
    rng = random.Random(3)
    for _ in range(40):
        w = open_writer(tempfile.mkdtemp(), rank=0)
        earlier, outstanding, reads, entered = None, [], 0, 0
        for _ in range(rng.randint(1, 300)):
            r = rng.random()
            entered += r < 0.7
            if r < 0.5:
                w.exit(w.enter(OP_CODE["all_reduce"], 4))
            elif r < 0.7:
                outstanding.append((entered, w.enter(OP_CODE["ddp_bucket_all_reduce"], 8)))
            elif outstanding and r < 0.9:
                w.exit(outstanding.pop(rng.randrange(len(outstanding)))[1])
            while outstanding and entered - outstanding[0][0] >= 60:  # before 64 pass
                w.exit(outstanding.pop(0)[1])
            if rng.random() < 0.2:
                buf = open(w.path, "rb").read()[:layout.RECORD_SIZE]
                got = layout.decode(buf, earlier)
                assert got == layout.decode(buf)
                earlier, reads = got, reads + 1
        w.close()


def test_a_record_is_alive_by_the_process_table_when_it_has_the_writer():
    """liveness.record_alive(known=...): the daemon's table read the writer this
    pass; the owner and start time decide as a /proc read would."""
    from ddpwatch.heartbeat.liveness import record_alive
    from ddpwatch.observe.jobs.proctable import ProcInfo
    from ddpwatch.observe.probes.heartbeats import _known
    from ddpwatch.observe.probes.process import CLK_TCK
    rec = types.SimpleNamespace(pid=999_999_999, uid=1000, started_at=time.monotonic(),
                                started_wall=time.time())
    assert not record_alive(rec)  # no such process: /proc says so
    python = ProcInfo(rec.pid, 1, ("python3", "train.py"), {}, start=CLK_TCK, uid=1000)
    assert record_alive(rec, known=_known({rec.pid: python}, rec.pid))
    assert not record_alive(rec, known=_known(
        {rec.pid: dataclasses.replace(python, uid=1001)}, rec.pid))  # another user's process
    later = dataclasses.replace(python, start=round((time.clock_gettime(time.CLOCK_BOOTTIME)
                                                     + 60) * CLK_TCK))
    assert not record_alive(rec, known=_known({rec.pid: later}, rec.pid))  # a reused pid
    # not a Python process: the table may have read it long ago, so /proc is asked
    shell = ProcInfo(rec.pid, 1, ("sleep", "9"), {}, start=CLK_TCK, uid=1000)
    assert _known({rec.pid: shell}, rec.pid) is None and _known(None, rec.pid) is None


def test_inside_phase_and_overlapping_async_ops_count_wall_time_once(tmp_path):
    w = open_writer(str(tmp_path), rank=0)
    a = w.enter(OP_CODE["ddp_bucket_all_reduce"], 10)
    b = w.enter(OP_CODE["ddp_bucket_all_reduce"], 20)
    rec = read_file(w.path)
    assert rec.phase == "inside" and rec.outstanding == 2 and rec.collective_seq == 2
    time.sleep(0.05)
    w.exit(a)
    assert read_file(w.path).phase == "inside"
    w.exit(b)
    rec = read_file(w.path)
    busy, done = w.counters()
    assert rec.phase == "outside" and done == 2
    # two overlapping ops of ~50 ms count ~50 ms, not ~100 ms
    assert 0.04 < rec.collective_seconds < 0.09
    w.close()
    assert read_file(w.path).phase == "exited"


def test_files_are_private(tmp_path):
    d = tmp_path / "run"
    w = open_writer(str(d), rank=0)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(w.path).st_mode) == 0o600
    w.close()


def test_rank_learned_later_renames_the_record(tmp_path):
    w = open_writer(str(tmp_path), rank=-1)
    w.set_identity(rank=5, world_size=8)
    assert os.path.basename(w.path) == f"rank5-pid{os.getpid()}.hb"
    assert read_file(w.path).rank == 5
    with pytest.raises(TypeError, match="bogus"):
        w.set_identity(bogus=1)
    w.close()


def test_unwritable_directory_turns_writer_off_with_one_warning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.warns(RuntimeWarning, match="heartbeats off"):
        w = open_writer(str(blocker / "sub"), rank=0)
    assert isinstance(w, NullWriter)
    w.exit(w.enter(1, 1))  # every call still works, and does nothing
    w.step(10)


@pytest.mark.parametrize("content, reason", [
    (b"", "truncated"),
    (b"DDPWHB01" + struct.pack("<II", LAYOUT_VERSION, 10), "truncated"),
    (b"garbage!" * 500, "not a ddpwatch heartbeat record"),
    (b"DDPWHB01" + struct.pack("<II", LAYOUT_VERSION + 1, 9999) + b"\0" * 4000, f"layout version {LAYOUT_VERSION + 1}"),
], ids=["empty", "short", "garbage", "future-version"])
def test_bad_record_files_are_skipped_with_a_reason(tmp_path, content, reason):
    path = tmp_path / "rank0-pid1.hb"
    path.write_bytes(content)
    records, skipped = read_dir(str(tmp_path))
    assert records == []
    assert len(skipped) == 1 and isinstance(skipped[0], Skipped)
    assert reason in skipped[0].reason


def test_a_fifo_under_a_record_name_is_skipped_not_waited_on(tmp_path):
    """Opening a FIFO for reading blocks until a writer comes: the daemon's tick would hang."""
    os.mkfifo(tmp_path / "rank0-pid1.hb")
    records, skipped = read_dir(str(tmp_path))
    assert records == [] and [s.reason for s in skipped] == ["not a regular file"]


def test_a_writer_is_a_process_that_started_before_its_record():
    record = types.SimpleNamespace(started_at=1000.0, started_wall=0.0)
    assert wrote(record, 999.0) and wrote(record, 1000.9)  # /proc start: 10 ms ticks
    assert not wrote(record, 1002.0)                       # a later process, same pid
    # /proc start times count suspended time, records' monotonic times do not
    assert wrote(record, 999.0 + 3600, suspended=3600)
    assert not wrote(record, 1002.0 + 3600, suspended=3600)
    assert wrote(record, -1.0)                             # start unknown: no evidence


def test_a_record_of_an_earlier_boot_is_no_running_process():
    """A DDPWATCH_DIR on disk outlives a reboot; its records' monotonic times mean
    nothing after one, and would let any process with the pid pass for the writer."""
    before = types.SimpleNamespace(started_at=50_000.0, started_wall=1_000_000.0)
    assert wrote(before, 30.0)                                     # times alone: passes
    assert not wrote(before, 30.0, boot_wall=1_000_000.0 + 3600)   # booted an hour later
    assert wrote(before, 30.0, boot_wall=1_000_000.0 - 60)         # made in this boot


def test_truncated_copy_of_a_real_record(tmp_path):
    w = open_writer(str(tmp_path / "a"), rank=0)
    data = open(w.path, "rb").read()
    w.close()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "rank0-pid1.hb").write_bytes(data[: len(data) // 2])
    records, (skipped,) = read_dir(str(tmp_path / "b"))
    assert "truncated" in skipped.reason


def _hammer(directory, ready, stop):
    w = open_writer(directory, rank=0)
    ready.set()
    n = 0
    while not stop.is_set():
        for _ in range(1000):
            n += 1
            # Every field the reader checks follows from n, so a torn read shows
            # up as fields that disagree with each other.
            w.exit(w.enter(OP_CODE["all_reduce"], n))
            w.step(tokens=n)
            # A rank publishes at most every few microseconds (a collective takes
            # longer): without a pause the C core would keep every read busy.
            until = time.perf_counter_ns() + 2000
            while time.perf_counter_ns() < until:
                pass


@pytest.mark.parametrize("reader", ["c", "python"])
def test_torn_reads_never_happen(tmp_path, monkeypatch, reader):
    if reader == "c":
        need_c_core()
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hammer, args=(str(tmp_path), ready, stop), daemon=True)
    proc.start()  # the writer keeps whatever core this session's environment gives it
    monkeypatch.setenv("DDPWATCH_PURE_PYTHON", "1" if reader == "python" else "")
    try:
        assert ready.wait(60)
        # At least 3 s of reads and at least 101 whole ones: on a loaded 2-core
        # machine the writer and the rest of the suite can take most of 3 s, so the
        # count, not the clock, ends the loop (the 60 s deadline only bounds it).
        start = time.monotonic()
        deadline = start + 60.0
        reads = 0
        while time.monotonic() < deadline and (reads <= 100 or time.monotonic() < start + 3.0):
            records, skipped = read_dir(str(tmp_path))
            if not records:  # the writer outran every retry: said so, never torn
                assert "writer busy" in skipped[0].reason
                continue
            (rec,) = records
            if rec.collective_seq == 0:
                continue
            reads += 1
            n = rec.collective_seq
            assert rec.bytes == n, rec
            assert rec.step in (n, n - 1), rec
            assert rec.tokens == rec.step * (rec.step + 1) // 2, rec
            assert rec.collectives_completed in (n, n - 1), rec
            assert rec.bytes_total == rec.collectives_completed * (rec.collectives_completed + 1) // 2
            assert all(e.bytes == e.seq for e in rec.ring), rec
        assert reads > 100
    finally:
        stop.set()
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def test_gone_writers_records_are_read_once_final(tmp_path, monkeypatch):
    """The daemon's probe keeps records of exited writers (real processes): read
    again while their writer might still have published its last word, then
    reused until the file changes or goes away."""
    from ddpwatch.observe.probes import Pass, ProbeContext
    from ddpwatch.observe.probes import heartbeats as probe
    script = ("import sys; sys.path.insert(0, %r); from ddpwatch.heartbeat import open_writer; "
              "w = open_writer(%r, rank=0); w.step(5); w.close()" % (REPO, str(tmp_path)))
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    (path,) = [str(p) for p in tmp_path.iterdir()]
    reads = []
    real_read = probe.read_file
    monkeypatch.setattr(probe, "read_file", lambda p, *rest: reads.append(p) or real_read(p, *rest))
    # the file's identity is the scan's stat of it (scan.py `identities`), not a second one
    stats = []
    monkeypatch.setattr(probe, "_file_identity", lambda p: stats.append(p))
    ctx = ProbeContext(heartbeat_dir=str(tmp_path))
    hb = probe.HeartbeatsProbe()
    for _ in range(4):
        obs = hb.run(ctx, Pass(), ())
        assert obs.alive == (False,) and obs.records[0].phase == "exited"
        assert obs.records[0].tokens == 5
    assert reads == [path, path]  # dead twice in a row: final, then reused
    os.utime(path, ns=(1, 1))  # rewritten (a new writer truncates it): read again
    hb.run(ctx, Pass(), ())
    assert len(reads) == 3
    os.unlink(path)
    assert hb.run(ctx, Pass(), ()).records == () and hb.dead == {}
    assert stats == []


def _age_record(path: str, seconds: float) -> None:
    """Make a record look last written `seconds` ago (its writer is not publishing)."""
    with open(path, "r+b") as f:
        f.seek(layout.PROGRESS_OFFSET + 8 * layout.P.UPDATED_AT)
        f.write(struct.pack("<d", time.monotonic() - seconds))


def test_a_new_writer_removes_old_records_of_gone_writers_only(tmp_path, monkeypatch):
    d = str(tmp_path)
    script = ("import sys; sys.path.insert(0, %r); from ddpwatch.heartbeat import open_writer; "
              "w = open_writer(%r, rank=int(sys.argv[1])); print(w.path); w.close()")
    gone = {rank: subprocess.run([sys.executable, "-c", script % (REPO, d), str(rank)],
                                 capture_output=True, text=True, check=True).stdout.strip()
            for rank in (1, 2)}
    monkeypatch.setenv("DDPWATCH_RECORD_TTL_S", "0")  # 0: keep everything
    quiet = open_writer(d, rank=3)             # alive, silent for two days: kept
    _age_record(quiet.path, 2 * 86400)
    _age_record(gone[1], 2 * 86400)            # gone two days: removed
    _age_record(gone[2], 3600)                 # gone an hour: kept (recent evidence)
    open_writer(d, rank=4).close()
    assert os.path.exists(gone[1])
    monkeypatch.delenv("DDPWATCH_RECORD_TTL_S")
    fresh = open_writer(d, rank=0)
    assert not os.path.exists(gone[1])
    assert all(os.path.exists(p) for p in (gone[2], quiet.path, fresh.path))
    quiet.close()
    fresh.close()


def test_step_with_a_bad_token_count_changes_nothing(tmp_path):
    """Both cores refuse before changing anything (ddpwatch.step turns it into a
    warning), so the record is never left torn or its counters poisoned."""
    w = open_writer(str(tmp_path), rank=0)
    w.step(tokens=8)
    with pytest.raises(TypeError):
        w.step(tokens=1.5)
    w.step(tokens=2)
    (rec,), _ = read_dir(str(tmp_path))
    assert (rec.step, rec.tokens, rec.seq % 2) == (2, 10, 0)
    w.close()


def test_a_record_nothing_was_published_to_since_is_the_record_read_before(tmp_path):
    """layout.decode(buf, earlier) returns `earlier` itself while the seqlock's
    seq has not moved and the writer is the same (a hung rank's record is not
    decoded again every tick); a publish, or another writer under the name with
    the same seq, is decoded."""
    w = open_writer(str(tmp_path), rank=0)
    w.exit(w.enter(OP_CODE["all_reduce"], 4))
    first = read_file(w.path)
    assert read_file(w.path, earlier=first) is first
    w.step(tokens=8)
    moved = read_file(w.path, earlier=first)
    assert moved is not first and moved.step == 1 and moved == read_file(w.path)
    other = dataclasses.replace(moved, pid=moved.pid + 1, step=99)
    again = read_file(w.path, earlier=other)
    assert again is not other and again == moved
    w.close()
