"""Stacks probe: `py-spy dump --json` parsing on dumps of real hung DDP ranks, the
never-dump-a-stopped-process rule, and live dumps (nonblocking and native)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import REPO, TESTS, need, wait_until
from ddpwatch import codec
from ddpwatch.observe.probes import Look, Pass, ProbeContext, load_all
from ddpwatch.observe.probes import process
from ddpwatch.observe.probes import stacks as K

FIX = os.path.join(TESTS, "fixtures")
PYSPY = os.path.join(FIX, "pyspy")
PROC = os.path.join(FIX, "proc")


def dump(name):
    with open(os.path.join(PYSPY, name)) as f:
        return K.parse_dump(f.read())


def names(thread):
    return [f.name for f in thread.frames]


def main_thread(threads):
    return next(t for t in threads if t.name == "MainThread")


# ------------------------------------------------------------------ parser + signatures

def test_parse_dump_fields():
    (t,) = dump("allreduce_rank0_blocked.json")
    assert (t.os_thread_id, t.name, t.active, t.owns_gil) == (5072, "MainThread", False, False)
    assert t.thread_id > 0  # a pthread_t, not the TID
    inner = t.frames[0]  # innermost first
    assert inner == K.Frame("all_reduce", inner.filename, "",
                            "torch/distributed/distributed_c10d.py", 3252)
    assert inner.filename.endswith("site-packages/torch/distributed/distributed_c10d.py")
    assert t.frames[-1].name == "<module>" and t.frames[-1].short_filename == "hang_collective.py"


def test_parse_dump_nulls_and_empty():
    raw = [{"thread_id": 1, "os_thread_id": None, "thread_name": None, "active": True,
            "owns_gil": True, "frames": [{"name": "f", "filename": "x.py", "module": None,
                                          "short_filename": None, "line": None}]}]
    (t,) = K.parse_dump(json.dumps(raw))
    assert (t.os_thread_id, t.name) == (-1, "")
    assert t.frames == (K.Frame("f", "x.py", "", "", 0),)
    assert K.parse_dump("[]") == ()
    with pytest.raises(ValueError):
        K.parse_dump("not json")


def test_signature_blocked_in_collective():
    t = main_thread(dump("allreduce_rank0_blocked_native.json"))
    assert not t.active
    assert "c10d::Work::wait" in names(t) and "pthread_cond_wait" in names(t)
    native = next(f for f in t.frames if f.name == "c10d::Work::wait")
    assert native.short_filename == "libtorch_cpu.so" and native.line == 0 and native.module


def test_signature_sleeping_culprit_has_no_sleep_frame():
    (t,) = dump("allreduce_rank1_sleeping.json")
    assert names(t) == ["<module>"]  # time.sleep is C: only the calling line shows
    assert names(main_thread(dump("allreduce_rank1_sleeping_native.json")))[:2] == [
        "clock_nanosleep", "time_sleep"]


def test_signature_ddp_backward_reducer():
    (t,) = dump("ddp_backward_rank0_reducer_wait.json")
    assert [(f.name, f.short_filename) for f in t.frames[:3]] == [
        ("_engine_run_backward", "torch/autograd/graph.py"),
        ("backward", "torch/autograd/__init__.py"),
        ("Tensor.backward", "torch/_tensor.py")]
    assert "c10d::Reducer::finalize_backward" in names(
        main_thread(dump("ddp_backward_rank0_reducer_wait_native.json")))


def test_signature_rendezvous():
    for name in ("init_store_master_waiting.json", "init_store_client_refused.json",
                 "init_store_client_synsent.json"):
        (t,) = dump(name)
        assert names(t)[:3] == ["_create_c10d_store", "_env_rendezvous_handler",
                                "init_process_group"]
    assert "c10d::TCPStore::waitForWorkers" in names(
        main_thread(dump("init_store_master_waiting_native.json")))
    for name in ("init_store_client_refused_native.json", "init_store_client_synsent_native.json"):
        assert "c10d::detail::TCPClient::connect" in names(main_thread(dump(name)))
    agent = main_thread(dump("torchrun_agent_rendezvous.json"))
    assert "DynamicRendezvousHandler.next_rendezvous" in names(agent)


def test_error_summary_drops_backtrace():
    with open(os.path.join(PYSPY, "stopped_blocking_fails.stderr.txt")) as f:
        summary = K.error_summary(f.read())
    assert "Failed to suspend process" in summary and "backtrace" not in summary.lower()


# ------------------------------------------------------------------ skip rules

def test_stopped_zombie_and_gone_are_never_dumped(monkeypatch):
    def no_popen(*a, **k):
        raise AssertionError("py-spy must not run for these pids")
    monkeypatch.setattr(subprocess, "Popen", no_popen)
    ctx = ProbeContext(procfs=PROC)
    stopped, zombie, gone = K.run_dumps(ctx, "/nonexistent/py-spy", (8465, 8506, 424242),
                                        native=True)
    assert stopped == K.PidStacks(8465, "stopped: not dumped", "T")
    assert zombie.status == "zombie: not dumped" and gone.status == "gone"


def test_no_py_spy_fails_the_probe(monkeypatch):
    monkeypatch.setattr(K, "find_py_spy", lambda: None)
    with pytest.raises(FileNotFoundError):
        K.run(ProbeContext(), Pass(), (os.getpid(),))
    spec = load_all()["stacks"]
    assert spec.look == Look.STACKS and spec.budgeted  # costly to the ranks: on suspicion, budgeted


def test_json_round_trip():
    threads = dump("torchrun_agent_monitoring.json")
    data = K.Stacks(1.5, "/usr/bin/py-spy", (K.PidStacks(4987, "ok", "S", False, threads,
                                                         main_run_s=2.25),
                                             K.PidStacks(8465, "stopped: not dumped", "T")))
    assert K.from_json(json.loads(json.dumps(codec.to_json(data)))) == data


# ------------------------------------------------------------------ live

SLEEPER = "import time\ndef napping():\n    time.sleep(300)\nnapping()\n"


def _live_python(start_job):
    need(K.find_py_spy() is not None, "py-spy not installed")
    job = start_job([sys.executable, "-c", SLEEPER], name="sleeper")
    pid = job.proc.pid
    wait_until(lambda: process.read_process("/proc", pid).threads[0].wchan == "hrtimer_nanosleep",
               60, what="sleeper in time.sleep")
    return pid


def _frames(result):
    # by tid == pid: py-spy leaves the thread's Python name empty for some interpreters
    from ddpwatch.judge.stackmatch import main_thread as main_of
    return [f.name for f in main_of(result).frames]


def test_live_nonblocking_dump(start_job):
    pid = _live_python(start_job)
    (res,) = K.run(ProbeContext(timeout_s=20), Pass(), (pid,)).pids
    assert res.status == "ok" and not res.native and res.state == "S", res.error
    assert _frames(res) == ["napping", "<module>"]
    # its main thread's run time then, read before the dump: asleep since, it
    # has run no more (judge/signals/stack.py compares it with a later look's)
    now = next(t.sched.run_s for t in process.read_process("/proc", pid).threads if t.tid == pid)
    assert 0 < res.main_run_s <= now and now - res.main_run_s < 0.002, (res.main_run_s, now)


def test_live_stopped_process_is_not_dumped_and_stays_stopped(start_job):
    pid = _live_python(start_job)
    os.kill(pid, signal.SIGSTOP)  # start_job's finalizer sends SIGCONT, then SIGKILL
    wait_until(lambda: process.read_state("/proc", pid) == "T", 30, what="state T")
    (res,) = K.run(ProbeContext(timeout_s=20), Pass(), (pid,), native=True).pids
    assert res.status == "stopped: not dumped" and res.threads == ()
    assert process.read_state("/proc", pid) == "T"  # untouched: still the user's stop
    os.kill(pid, signal.SIGCONT)


def test_live_native_dump_leaves_process_running(start_job):
    pid = _live_python(start_job)
    need(os.geteuid() == 0 or not os.path.exists("/proc/sys/kernel/yama/ptrace_scope"),
         "native dumps need ptrace rights")
    (res,) = K.run(ProbeContext(timeout_s=20), Pass(), (pid,), native=True).pids
    assert res.status == "ok" and res.native, res.error
    frames = _frames(res)
    assert "time_sleep" in frames and "napping" in frames
    assert process.read_state("/proc", pid) in ("S", "R")
    assert process.read_process("/proc", pid).tracer_pid == 0  # py-spy detached


def test_live_dead_pid_is_gone(start_job):
    need(K.find_py_spy() is not None, "py-spy not installed")
    job = start_job([sys.executable, "-c", "pass"], name="short")
    job.wait(60)
    (res,) = K.run(ProbeContext(timeout_s=20), Pass(), (job.proc.pid,)).pids
    assert res.status == "gone"


def test_earlier_stacks_are_kept_only_for_ranks_that_have_not_moved():
    """py-spy is rate-limited, so the daemon reuses a job's last dumps; a rank whose
    heartbeat advanced since is elsewhere, and its old dump must not judge it."""
    import dataclasses

    from ddpwatch.observe.snapshot import load
    from ddpwatch.observe.sampler import progress_of, still_current
    snap = load(os.path.join(REPO, "tests", "fixtures", "snapshots", "trainer_hang.json"))[-1]
    then = progress_of(snap.heartbeats)
    assert len(then) == 2 and len(snap.stacks.pids) >= 2
    assert still_current(snap.stacks, then, dict(then)) is snap.stacks
    moved = min(then)
    now = {pid: ((seq + 1, step) if pid == moved else (seq, step))
           for pid, (seq, step) in then.items()}
    kept = still_current(snap.stacks, then, now)
    assert moved not in {d.pid for d in kept.pids}
    assert {d.pid for d in kept.pids} == {d.pid for d in snap.stacks.pids} - {moved}
    # a process without a record (a launcher, a plain script) keeps its dump
    plain = dataclasses.replace(snap.stacks.pids[0], pid=999999)
    with_plain = dataclasses.replace(snap.stacks, pids=snap.stacks.pids + (plain,))
    assert 999999 in {d.pid for d in still_current(with_plain, then, now).pids}
    assert progress_of(None) == {}
