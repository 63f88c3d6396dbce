"""Whether anybody works for a rank, measured (judge/signals/work.py): on saved
histories of real jobs (tests/fixtures/snapshots/pause_*.json, made by
capture.py from tests/jobs/pausesites.py) and on counters built in code. Pure."""
from __future__ import annotations

import os

from ddpwatch.judge import signals
from ddpwatch.judge.signals import work
from ddpwatch.observe import snapshot
from ddpwatch.observe.probes.process import IoCounters, WorkerObs, parse_io
from replay_expected import SNAPSHOTS


def _ranks(name: str) -> dict[int, dict]:
    history = snapshot.load(os.path.join(SNAPSHOTS, f"{name}.json"))
    return {s["rank"]: s for s in signals.measure(history)}


def test_a_hung_dataloader_worker_is_named_and_nobody_works():
    rank1 = _ranks("pause_data_hung")[1]
    assert rank1["pause_kind"] == "data" and rank1["workers"] == 2
    assert rank1["workers_working"] == 0 and rank1["working"] is False
    assert rank1["io_mb_s"] == 0.0
    assert rank1["idle_worker"].startswith("worker pid ")
    assert "idle at Shards.__getitem__ (pausesites.py:" in rank1["idle_worker"]
    assert rank1["pausing"] is False


def test_a_slow_checkpoint_whose_bytes_move_is_working():
    rank0 = _ranks("pause_ckpt_slow")[0]
    assert rank0["pause_kind"] == "checkpoint"
    assert rank0["cpu_ratio"] < 0.05  # no CPU to speak of: the bytes are the evidence
    assert rank0["io_mb_s"] >= work.WORK_BYTES_S / 1e6
    assert rank0["working"] is True and "reads or writes" in rank0["work_evidence"]
    assert rank0["pausing"] is True


def test_a_checkpoint_to_a_pipe_nobody_reads_is_idle():
    rank0 = _ranks("pause_ckpt_hung")[0]
    assert rank0["pause_kind"] == "checkpoint" and rank0["working"] is False
    assert rank0["work_evidence"] is None and rank0["pausing"] is False


def test_the_worker_shown_is_the_one_stopped_in_user_code():
    """With its batches in order, a DataLoader's other workers wait for indices
    while one is blocked in __getitem__: the blocked one is the evidence."""
    from ddpwatch.observe.probes.stacks import Frame, PidStacks, Stacks, ThreadStack

    def dump(pid, *frames):
        thread = ThreadStack(1, pid, "MainThread", False, False, tuple(
            Frame(name, path, "", path.rpartition("/")[2], 10) for name, path in frames))
        return PidStacks(pid, "ok", "S", threads=(thread,), worker_of=1)
    # forked workers: below multiprocessing's _bootstrap, the frames inherited
    # from the rank (its loop's <module>), which are user code but not the worker's
    forked = (("BaseProcess._bootstrap", "/usr/lib/python3.11/multiprocessing/process.py"),
              ("Popen._launch", "/usr/lib/python3.11/multiprocessing/popen_fork.py"),
              ("<module>", "/home/u/train.py"))
    waiting = dump(11, ("select", "/usr/lib/python3.11/selectors.py"),
                   ("_worker_loop", "/v/site-packages/torch/utils/data/_utils/worker.py"),
                   *forked)
    blocked = dump(12, ("__getitem__", "/home/u/data.py"),
                   ("fetch", "/v/site-packages/torch/utils/data/_utils/fetch.py"), *forked)
    snap = snapshot.load(os.path.join(SNAPSHOTS, "pause_data_hung.json"))[-1]
    import dataclasses
    snap = dataclasses.replace(snap, stacks=Stacks(snap.taken_at, "py-spy", (waiting, blocked)),
                               window_stacks=())
    shown = work._idle_worker((snap,), (_worker(11), _worker(12)))
    assert shown == "worker pid 12 idle at __getitem__ (data.py:10) <- fetch (fetch.py:10)"
    assert work._idle_worker((snap,), (_worker(11),)).startswith("worker pid 11 idle at select")
    assert work._idle_worker((snap,), (_worker(13),)) == "worker pid 13 idle"


def test_parse_io_reads_proc_pid_io_and_refuses_a_short_file():
    text = ("rchar: 4096\nwchar: 512\nsyscr: 3\nsyscw: 2\nread_bytes: 8192\n"
            "write_bytes: 0\ncancelled_write_bytes: 0\n")
    assert parse_io(text) == IoCounters(4096, 512, 8192, 0)
    try:
        parse_io("rchar: 1\n")
    except ValueError as err:
        assert "write" in str(err) or "wchar" in str(err)
    else:
        raise AssertionError("a file without wchar was taken")


IO0, IO1 = IoCounters(0, 0, 0, 0), IoCounters(200_000, 0, 0, 0)


def _worker(pid=10, start=5.0, cpu=1.0, wait=0.0, io=IO0, state="S"):
    return WorkerObs(pid, state, start, cpu, wait, io)


def test_a_worker_works_by_cpu_disk_or_bytes_and_not_by_being_there():
    assert work._worker_work(_worker(), _worker(cpu=1.5), 2.0) == "CPU 25%"
    assert work._worker_work(_worker(), _worker(), 2.0) == ""
    assert work._worker_work(_worker(), _worker(state="D"), 2.0) == "disk I/O"
    assert work._worker_work(_worker(), _worker(io=IO1), 2.0).startswith("reads or writes")
    # run-queue wait is CPU wanted: a worker starved on a busy node still works
    assert work._worker_work(_worker(), _worker(wait=0.5), 2.0) == "CPU 25%"


def test_a_worker_forked_inside_the_window_counts_its_cpu_since_birth():
    """Workers that are not persistent are forked at each epoch's start."""
    assert work._worker_work(None, _worker(cpu=0.4), 2.0).startswith("started")
    assert work._worker_work(None, _worker(cpu=0.0), 2.0) == ""


def test_a_reused_pid_is_a_new_worker():
    class Proc:
        def __init__(self, workers):
            self.workers = workers
    before = Proc((_worker(cpu=9.0, start=1.0),))
    now = Proc((_worker(cpu=0.3, start=7.0),))  # another process under the same pid
    assert work._busy_workers(before, now, 2.0) == [(10, "started, CPU 0.3s")]
