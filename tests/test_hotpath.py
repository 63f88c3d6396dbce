"""The C hot path (ddpwatch/_hotpath.c) against its pure-Python reference."""
from __future__ import annotations

from conftest import need_c_core

from ddpwatch.heartbeat import OP_CODE, layout, open_writer, read_dir
from ddpwatch.heartbeat.writer import PyCore, core_class

CORES = ("c", "python")


def test_the_c_core_is_used_when_built_and_pure_python_on_request(monkeypatch):
    need_c_core()
    from ddpwatch import _hotpath
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


