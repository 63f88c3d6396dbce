"""ddpwatch.instrument() inside real 2-rank Gloo jobs (torchrun)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from ddpwatch.heartbeat import read_dir

from conftest import REPO, need_c_core, torchrun

JOB = os.path.join(REPO, "tests", "jobs", "instrumented_ops.py")
# DDP's bucket order is broadcast by its C++ reducer in the second forward, once:
# recorded as its own collective (instrumentation._patch_ddp_setup_collectives)
EXPECTED_OPS = ["all_reduce", "all_reduce", None, "barrier",
                "all_gather", "all_gather", "ddp_bucket_all_reduce", "ddp_rebuild_buckets",
                "ddp_bucket_all_reduce", "ddp_bucket_all_reduce", "barrier"]


@pytest.mark.parametrize("hot_path", ["c", "python"])
def test_every_collective_kind_is_a_heartbeat_and_rings_agree(start_job, hb_dir, hot_path):
    """Once with the C wrappers and core, once with the pure-Python reference."""
    if hot_path == "c":
        need_c_core()
    job = start_job(torchrun(2, JOB), env={"DDPWATCH_PURE_PYTHON": "1" if hot_path == "python" else ""})
    assert job.wait(timeout=300) == 0, job.output()
    # the two ranks share one log, and their lines may interleave
    said = {d["rank"]: d for d in map(json.loads, re.findall(r'\{"rank"[^{}]*\}', job.output()))}
    records, skipped = read_dir(hb_dir)
    assert skipped == []
    by_rank = {r.rank: r for r in records}
    assert sorted(by_rank) == [0, 1]
    for rank, rec in by_rank.items():
        assert rec.pid == said[rank]["pid"]
        assert (said[rank]["wrapper"], said[rank]["core"]) == (
            ("Wrapper", "Core") if hot_path == "c" else ("function", "PyCore"))
        assert (rec.world_size, rec.backend, rec.device_type) == (2, "gloo", "cpu")
        assert rec.compute_dtype == "float32"       # observed at DDP's first forward
        assert rec.step == 3                          # optimizer post-hook counted steps
        assert rec.phase == "exited"
        ops = [e.op for e in rec.ring]
        expected = [op or ("isend" if rank == 0 else "irecv") for op in EXPECTED_OPS]
        assert ops == expected
        # async work without a future (p2p on Gloo) still
        # gets its completion time, recorded when waited on
        assert all(e.end >= e.start > 0 for e in rec.ring)
        buckets = [e for e in rec.ring if e.op == "ddp_bucket_all_reduce"]
        assert sum(e.bytes for e in buckets) == 3 * said[rank]["param_bytes"]
    # the flight-recorder view: both ranks agree on (seq, bytes) and on op up to p2p direction
    ring0 = [(e.seq, e.bytes) for e in by_rank[0].ring]
    ring1 = [(e.seq, e.bytes) for e in by_rank[1].ring]
    assert ring0 == ring1


def run_python(code: str, hb_dir: str, drop=()) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter that imports this checkout, records in `hb_dir`."""
    env = dict(os.environ, DDPWATCH_DIR=hb_dir, PYTHONPATH=REPO)
    for var in drop:
        env.pop(var, None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_instrument_never_raises_when_it_cannot_write(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    code = ("import warnings, ddpwatch, torch, torch.distributed as dist\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    ddpwatch.instrument(); ddpwatch.instrument()\n"
            "print(sum('heartbeats off' in str(x.message) for x in w))\n"
            "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, world_size=1)\n"
            "t = torch.ones(3); dist.all_reduce(t); ddpwatch.step(10)\n"
            "print(t.tolist())\n")
    out = run_python(code, str(blocker / "sub"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["1", "[1.0, 1.0, 1.0]"]


# a static graph's bucket order is learned over two iterations and rebuilt in the
# third forward: the second forward's op is recorded too (nothing told it apart)
@pytest.mark.parametrize("kwargs,rebuilds", [("", 1), ("find_unused_parameters=True", 0),
                                              ("find_unused_parameters=True, static_graph=True", 2)])
def test_ddps_bucket_rebuild_is_one_collective_only_where_ddp_makes_it(tmp_path, kwargs,
                                                                       rebuilds):
    """DDP's reducer broadcasts the rebuilt bucket order once, in the second forward,
    and never with find_unused_parameters on a graph that is not static: a
    recorded op there would be one for every step (instrumentation
    _patch_ddp_setup_collectives). Buffers are broadcast before each forward."""
    code = ("import torch, torch.nn as nn, torch.distributed as dist, ddpwatch\n"
            "from ddpwatch.heartbeat import read_dir\n"
            "ddpwatch.instrument()\n"
            "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, world_size=1)\n"
            "net = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))\n"
            f"ddp = nn.parallel.DistributedDataParallel(net, {kwargs})\n"
            "for _ in range(4):\n"
            "    ddp(torch.randn(4, 8)).sum().backward()\n"
            "import os; ops = [e.op for e in read_dir(os.environ['DDPWATCH_DIR'])[0][0].ring]\n"
            "print(ops.count('ddp_rebuild_buckets'), ops.count('ddp_sync_buffers'))\n")
    out = run_python(code, str(tmp_path), drop=("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    assert out.returncode == 0, out.stderr
    # BatchNorm's running stats are buffers: broadcast before each of the 4 forwards
    assert out.stdout.split() == [str(rebuilds), "4"], out.stdout


def test_single_process_run_without_torchrun_writes_a_record(tmp_path):
    code = ("import ddpwatch, torch\n"
            "ddpwatch.instrument(compute_dtype=torch.bfloat16, data_fingerprint='f00d')\n"
            "ddpwatch.step(tokens=128)\n")
    out = run_python(code, str(tmp_path), drop=("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    assert out.returncode == 0, out.stderr
    (rec,), _ = read_dir(str(tmp_path))
    assert (rec.rank, rec.compute_dtype, rec.data_fingerprint, rec.tokens) == (-1, "bfloat16", "f00d", 128)


def test_a_bad_step_call_warns_and_training_goes_on(tmp_path):
    code = ("import warnings, ddpwatch\n"
            "from ddpwatch.heartbeat import read_dir\n"
            "ddpwatch.instrument(rank=0)\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    ddpwatch.step(tokens=1.5); ddpwatch.step(tokens=4)\n"
            "print([str(x.message) for x in w])\n"
            "(r,), _ = read_dir()\n"
            "print(r.step, r.tokens)\n")
    out = run_python(code, str(tmp_path / "hb"))
    assert out.returncode == 0, out.stderr
    warned, counted = out.stdout.strip().splitlines()[-2:]
    assert "tokens must be an int, not float" in warned
    assert counted == "2 4"


CALLBACK_JOB = os.path.join(REPO, "tests", "jobs", "callback_threads.py")


@pytest.mark.parametrize("mode,hot_path", [("off", "c"), ("ddp", "c"), ("async", "c"),
                                           ("ddp", "python"), ("async", "python")])
def test_callbacks_on_gloo_threads_keep_their_thread_state(start_job, mode, hot_path):
    """Without a kept thread state, every callback torch runs on Gloo's thread
    creates and deletes one (a malloc, an mmap and an munmap: about 2% of the
    bundled trainer's speed). The "off" job, not instrumented, shows the count
    the test would see if ddpwatch stopped keeping them (torch itself keeps
    one now and then, so the control asks only for some fresh ones)."""
    if hot_path == "c":
        need_c_core()
    env = {"DDPWATCH_PURE_PYTHON": "1" if hot_path == "python" else ""}
    job = start_job(torchrun(2, CALLBACK_JOB, mode), env=env)
    assert job.wait(timeout=300) == 0, job.output()
    said = [json.loads(line) for line in re.findall(r'\{"rank"[^{}]*\}', job.output())]
    assert len(said) == 2, job.output()
    for rank in said:
        if mode == "off":
            assert rank["fresh"] > rank["threads"], rank
        else:  # a fresh state only at each thread's first callback of the script's
            assert rank["fresh"] == rank["threads"], rank


EXIT_JOB = os.path.join(REPO, "tests", "jobs", "exit_after_async.py")


@pytest.mark.parametrize("mode", ["async", "sync", "ddp"])
def test_a_script_that_exits_right_after_its_last_collective_exits_cleanly(start_job, mode):
    """Before ddpwatch held async Works and let backend threads finish at exit,
    about half of the async runs aborted at exit, a quarter of the sync ones;
    the same script without ddpwatch aborts in 2-5 runs of 10 (a torch 2.13
    race ddpwatch now also closes). Four runs, each two ranks, catch a return."""
    for attempt in range(2 if mode == "ddp" else 4):
        job = start_job(torchrun(2, EXIT_JOB, mode), name=f"exit-{mode}")
        assert job.wait(timeout=300) == 0, f"attempt {attempt}:\n{job.output()}"
        assert job.output().count('"done": true') == 2, job.output()
