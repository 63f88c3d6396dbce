"""Property-based fuzzing (hypothesis) of the heartbeat record parser, and unit
tests of the bounded directory scan: a record is another user's bytes.

Bounded in time: few enough examples and a deadline per example that the module
runs in seconds in CI; hypothesis's database is off so runs do not depend on
earlier ones."""
from __future__ import annotations

import math
import os
import struct
import tempfile

from hypothesis import HealthCheck, given, settings, strategies as st

from ddpwatch.heartbeat import layout
from ddpwatch.heartbeat.reader import Skipped, read_file
from ddpwatch.heartbeat.scan import ScanState, scan

FUZZ = settings(max_examples=300, deadline=200, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def header(**over) -> bytes:
    fields = dict(pid=os.getpid(), rank=1, local_rank=1, world_size=2, uid=os.getuid(),
                  started_at=5.0, started_wall=1.7e9, run_id="r", hostname="h",
                  torch_version="2", backend="gloo", device_type="cpu",
                  compute_dtype="float32", data_fingerprint="", data_batches=-1,
                  data_shards=-1)
    fields.update(over)
    return layout.pack_header(**fields)


def valid(body: bytes = b"", seq: int = 2) -> bytes:
    """A record with a good header and seq, the rest from `body` (zero-padded)."""
    rest = (body + b"\0" * layout.RECORD_SIZE)[:layout.RECORD_SIZE - layout.PROGRESS_OFFSET]
    return header() + layout.SEQ.pack(seq) + rest


def check_record(record: layout.Record) -> None:
    for name in ("started_at", "started_wall", "entered_at", "updated_at", "step_started_at",
                 "collective_seconds", "step_seconds", "last_step_seconds"):
        assert math.isfinite(getattr(record, name)), name
    assert isinstance(record.run_id, str) and len(record.run_id) <= 64
    assert len(record.ring) <= layout.RING_SLOTS
    assert all(math.isfinite(e.start) and math.isfinite(e.end) for e in record.ring)
    assert record.phase in layout.Phase.NAMES or record.phase.startswith("phase")


@FUZZ
@given(st.binary(max_size=layout.RECORD_SIZE + 64))
def test_any_bytes_decode_or_refuse_with_layout_error(data):
    try:
        record = layout.decode(data)
    except layout.LayoutError as err:
        assert str(err)
    else:
        check_record(record)


@FUZZ
@given(st.binary(min_size=0, max_size=layout.RECORD_SIZE))
def test_good_header_any_body_decodes_or_refuses(body):
    try:
        record = layout.decode(valid(body))
    except layout.LayoutError as err:
        assert "finite" in str(err)  # the only thing a body can get wrong
    else:
        check_record(record)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from([f for f, _ in layout.PROGRESS_FIELDS]),
                          st.one_of(st.integers(-2**63, 2**63 - 1),
                                    st.floats(allow_nan=True, allow_infinity=True))),
                max_size=8),
       st.text(max_size=80), st.integers(-2**31, 2**31 - 1))
def test_hostile_field_values(fields, run_id, phase):
    """Field by field: huge sequence numbers, negative phases, NaN times, long
    run ids: decoded into a sane Record or refused, nothing else."""
    values = {f: (0.0 if code == "d" else 0) for f, code in layout.PROGRESS_FIELDS}
    for name, value in fields:
        code = dict(layout.PROGRESS_FIELDS)[name]
        values[name] = float(value) if code == "d" else (
            int(value) if isinstance(value, int) else 0)
    values["phase"] = phase
    progress = layout.PROGRESS.pack(*(values[f] for f, _ in layout.PROGRESS_FIELDS))
    data = (header(run_id=run_id) + layout.SEQ.pack(2) + progress).ljust(
        layout.RECORD_SIZE, b"\0")
    try:
        record = layout.decode(data)
    except layout.LayoutError as err:
        assert "finite" in str(err)
        assert any(isinstance(v, float) and not math.isfinite(v) for v in values.values())
    else:
        check_record(record)
        assert record.collective_seq == values["collective_seq"]


@FUZZ
@given(st.binary(max_size=layout.RECORD_SIZE + 64), st.booleans())
def test_read_file_never_raises(data, prefix_valid):
    """Whatever a file holds (a valid header then garbage, or garbage), the
    reader gives a Record or a Skipped with a reason."""
    content = valid(data) if prefix_valid else data
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rank0-pid1.hb")
        with open(path, "wb") as f:
            f.write(content)
        result = read_file(path)
    if isinstance(result, Skipped):
        assert result.reason
    else:
        check_record(result)


def test_truncated_under_the_reader_is_skipped_not_a_crash(tmp_path):
    """What killed the daemon with SIGBUS when records were mapped: the file
    shrinks between the size check and the read."""
    path = tmp_path / "rank0-pid1.hb"
    path.write_bytes(valid())
    assert not isinstance(read_file(str(path)), Skipped)
    for size in (layout.RECORD_SIZE - 1, layout.SEQ_OFFSET + 4, 16, 0):
        os.truncate(path, size)
        result = read_file(str(path))
        assert isinstance(result, Skipped) and result.reason


# ----------------------------------------------------------------- the bounded scan

def _fill(directory, n: int, name="junk{}.hb", content=b"x"):
    for i in range(n):
        with open(os.path.join(directory, name.format(i)), "wb") as f:
            f.write(content)


def test_scan_caps_files_per_directory_and_says_what_it_left_out(tmp_path):
    _fill(tmp_path, 50)
    out = list(scan([str(tmp_path)], per_dir=10))
    assert len(out) == 11
    summary = out[-1][1]
    assert isinstance(summary, Skipped) and "40 of 50" in summary.reason


def test_scan_looks_at_running_pids_first(tmp_path):
    _fill(tmp_path, 30, name="rank0-pid{}.hb")
    mine = tmp_path / f"rank0-pid{os.getpid()}.hb"
    mine.write_bytes(valid())
    paths = [p for p, _ in scan([str(tmp_path)], live=frozenset({os.getpid()}), per_dir=5)]
    assert str(mine) in paths


def test_scan_caps_reads_per_tick_over_all_directories(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    _fill(a, 20), _fill(b, 20)
    reads = []
    list(scan([str(a), str(b)], reader=lambda p: reads.append(p) or Skipped(p, "x"),
              reads=25))
    assert len(reads) == 25


def test_refused_files_are_not_read_again_while_unchanged(tmp_path):
    _fill(tmp_path, 5, content=b"garbage" * 100)
    (tmp_path / "rank0-pid1.hb").write_bytes(b"\0" * layout.RECORD_SIZE)  # being created
    state, reads = ScanState(), []

    def reader(p):
        reads.append(p)
        return read_file(p)

    list(scan([str(tmp_path)], state, reader=reader))
    assert len(reads) == 6
    reads.clear()
    list(scan([str(tmp_path)], state, reader=reader))
    # the garbage stays refused; a record still all zeros is read again
    assert reads == [str(tmp_path / "rank0-pid1.hb")]
    (tmp_path / "junk0.hb").write_bytes(valid())  # rewritten: read again
    reads.clear()
    results = dict(scan([str(tmp_path)], state, reader=reader))
    assert str(tmp_path / "junk0.hb") in reads
    assert not isinstance(results[str(tmp_path / "junk0.hb")], Skipped)


def test_a_reader_that_raises_is_one_skipped_file(tmp_path):
    _fill(tmp_path, 3)

    def boom(p):
        if p.endswith("junk1.hb"):
            raise struct.error("bad")
        return Skipped(p, "fine")

    out = dict(scan([str(tmp_path)], reader=boom))
    assert "unreadable" in out[str(tmp_path / "junk1.hb")].reason and len(out) == 3
