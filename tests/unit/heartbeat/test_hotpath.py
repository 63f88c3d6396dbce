"""The C hot path (ddpwatch/heartbeat/_hotpath.c) against its pure-Python reference."""
from __future__ import annotations

import pytest
from conftest import need_c_core

from ddpwatch.heartbeat import OP_CODE, layout, open_writer, read_dir
from ddpwatch.heartbeat.writer import PyCore, core_class

CORES = ("c", "python")


def test_the_c_core_is_used_when_built_and_pure_python_on_request(monkeypatch):
    need_c_core()
    from ddpwatch.heartbeat import _hotpath
    monkeypatch.delenv("DDPWATCH_PURE_PYTHON", raising=False)
    assert core_class() is _hotpath.Core
    monkeypatch.setenv("DDPWATCH_PURE_PYTHON", "1")
    assert core_class() is PyCore


_TIMES = {"started_at", "started_wall", "entered_at", "updated_at", "step_started_at",
          "collective_seconds", "step_seconds", "last_step_seconds", "ring", "seq", "pid"}


def _script(w):
    """The same calls for both cores: sync ops, overlapping async ops, steps, phases."""
    w.set_phase(layout.Phase.RENDEZVOUS)
    w.set_identity(rank=1, world_size=2, backend="gloo")
    w.set_phase(layout.Phase.OUTSIDE)
    for i in range(100):
        w.exit(w.enter(OP_CODE["all_reduce"], 4 * i))
        if i % 10 == 9:
            a, b = w.enter(OP_CODE["ddp_bucket_all_reduce"], 1000), w.enter(OP_CODE["broadcast"], 8)
            w.exit(b)
            w.exit(a)
            w.step(tokens=256)
    w.enter(OP_CODE["barrier"], 0)  # left inside, as a hung rank is


def test_both_cores_write_the_same_record(tmp_path, monkeypatch):
    need_c_core()
    monkeypatch.delenv("DDPWATCH_PURE_PYTHON", raising=False)
    records = {}
    for name in CORES:
        if name == "python":
            monkeypatch.setenv("DDPWATCH_PURE_PYTHON", "1")
        w = open_writer(str(tmp_path / name), rank=0)
        assert (type(w.core) is PyCore) == (name == "python")
        _script(w)
        (records[name],), _ = read_dir(str(tmp_path / name))
        busy, completed = w.counters()
        assert completed == records[name].collectives_completed == 120
        assert busy >= records[name].collective_seconds > 0
        w.close()
    c, py = ({k: v for k, v in vars(r).items() if k not in _TIMES} for r in records.values())
    assert c == py
    ring_c, ring_py = ([(e.seq, e.op, e.bytes) for e in r.ring] for r in records.values())
    assert ring_c == ring_py and len(ring_c) == layout.RING_SLOTS - 1  # the barrier is open
    assert records["c"].phase == "inside" and records["c"].outstanding == 1
    assert records["c"].step == 10 and records["c"].tokens == 2560 and records["c"].rank == 1




def test_the_c_reader_is_used_when_built_and_python_on_request(monkeypatch):
    need_c_core()
    from ddpwatch.heartbeat.reader import _read_once_python, attempt_reader
    monkeypatch.delenv("DDPWATCH_PURE_PYTHON", raising=False)
    assert attempt_reader() is not _read_once_python
    monkeypatch.setenv("DDPWATCH_PURE_PYTHON", "1")
    assert attempt_reader() is _read_once_python


def test_c_read_once_matches_python_and_refuses_unpublished_or_mid_write(tmp_path):
    need_c_core()
    import mmap

    from ddpwatch.heartbeat import _hotpath
    from ddpwatch.heartbeat.reader import _read_once_python
    w = open_writer(str(tmp_path), rank=0)
    _script(w)
    seq_at, size = layout.SEQ_OFFSET, layout.RECORD_SIZE
    with open(w.path, "r+b") as f, mmap.mmap(f.fileno(), size) as mem:
        readonly = mmap.mmap(f.fileno(), size, mmap.MAP_SHARED, mmap.PROT_READ)
        data = _hotpath.read_once(readonly, seq_at, size)
        assert data == _read_once_python(readonly) == mem[:size]
        (seq,) = layout.SEQ.unpack_from(mem, seq_at)
        layout.SEQ.pack_into(mem, seq_at, seq + 1)  # as the writer leaves it mid-publish
        assert _hotpath.read_once(readonly, seq_at, size) is None
        layout.SEQ.pack_into(mem, seq_at, 0)  # never published
        assert _hotpath.read_once(readonly, seq_at, size) is None
        for bad in ((seq_at + 4, size), (size, size), (-8, size), (seq_at, size + 1)):
            with pytest.raises(ValueError, match="outside the buffer"):
                _hotpath.read_once(readonly, *bad)
        readonly.close()
    w.close()
