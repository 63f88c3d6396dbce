"""Hangs where pauses usually are, on real jobs watched by one real `ddpwatch run`
with a webhook receiver, and judged by `ddpwatch diagnose` at the stall: a
DataLoader whose workers block on a read that never returns, a rank blocked in
its evaluation (a hand-written estimate_loss and Lightning's evaluation loop), in
a checkpoint save, in a logging call. Each pages once, naming the right rank;
the same jobs with their pauses working send no page at all.

Faults come from outside the jobs (tests/jobs/pausesites.py and
tests/jobs/thirdparty/pausesites_lightning.py): a FIFO put where a file was
(an open() that waits forever: a mount that stalled, a pipe whose other end died),
or a metrics server that accepts and never answers. How fast each pages is
measured by benchmarks/soak.py --pauses, not asserted here
(docs/judgement-over-time.md "Is anybody working?")."""
from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time

import pytest

from conftest import REPO, Receiver, torchrun, wait_until
from daemons import DaemonRun, ours
from diag import diagnose

PLAIN = os.path.join(REPO, "tests", "jobs", "pausesites.py")
LIGHTNING = os.path.join(REPO, "tests", "jobs", "thirdparty", "pausesites_lightning.py")
HUNG = "hung_outside_collective"
STEP = re.compile(r"rank (\d+) step (\d+)")
READY = re.compile(r"rank (\d+) pid (\d+) ready")


@pytest.fixture(autouse=True)
def _py_spy(need_py_spy):
    """The stacks say where each rank stopped (and where its idle worker waits)."""


@pytest.fixture(scope="module")
def watch(start_module_job, tmp_path_factory):
    """One daemon for the module's jobs, its webhooks to one receiver."""
    hook = Receiver()
    daemon = DaemonRun(start_module_job, tmp_path_factory.mktemp("daemon"), "",
                       {"webhooks": [{"type": "generic", "url": hook.url}]})
    daemon.hook = hook
    yield daemon
    hook.stop()


def _start(start, tmp_path_factory, script_argv, name, env=None):
    data = str(tmp_path_factory.mktemp(name))
    job = start([*script_argv, "--dir", data], env=env, name=name)
    def past_step_3():
        out = job.output()
        if job.proc.poll() is not None:
            pytest.fail(f"{name}: the job ended ({job.proc.returncode}) before step 3:\n{out[-3000:]}")
        # the ranks share one stdout and print() writes a line and its newline apart:
        # "rank 0 step 3rank 1 step 3\n\n" happens, so no line ending is looked for
        steps = {}
        for rank, step in STEP.findall(out):
            steps[rank] = max(steps.get(rank, 0), int(step))
        return steps.get("0", 0) >= 3 and steps.get("1", 0) >= 3
    wait_until(past_step_3, 180,
               what=lambda: f"{name}: both ranks past step 3; its output:\n{job.output()[-3000:]}")
    pids = {int(r): int(p) for r, p in READY.findall(job.output())}
    return job, pids, data


def block(path: str) -> None:
    """A FIFO where the file was: the next open() waits for the other end forever."""
    os.mkfifo(path + ".fifo")
    os.replace(path + ".fifo", path)


def _metrics_server(answering: threading.Event) -> socket.socket:
    """A line server on loopback for the job's --log-to: answers each line while
    `answering` is set; cleared, it reads the next line and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve():
        conn, _ = server.accept()
        with conn:
            f = conn.makefile("rb")
            while f.readline():
                if not answering.is_set():
                    threading.Event().wait(3600)  # accepted, read, never answered
                conn.sendall(b"ok\n")
    threading.Thread(target=serve, daemon=True).start()
    return server


def _firing(daemon, key):
    return [b for b in daemon.hook.bodies() if b["status"] == "firing" and b["job"] == key]


def _pages_once_naming(daemon, job, pids, culprit: int, rule: str, injected: float):
    key = wait_until(lambda: ours(daemon.status(), job).get("key"), 60, what="the job watched")
    first = wait_until(lambda: _firing(daemon, key), 90, what=f"a page naming rank {culprit}")
    print(f"{rule}: paged {daemon.hook.requests[-1].at - injected:.1f}s after the fault")
    assert first[0]["culprits"] == [culprit] and first[0]["verdict"] == HUNG, first[0]
    status = ours(daemon.status(), job)
    by_rank = {r["rank"]: r for r in status["ranks"]}
    assert by_rank[culprit]["rule"] == rule, by_rank[culprit]
    # the victims wait for it in a collective, waited for: a full suite's run
    # (2026-11-29) read rank 0 of the Lightning loader job otherwise at the tick
    # of the page, which named rank 1 right
    seen = {}

    def victims_blocked():
        seen.update({r["rank"]: (r["verdict"], r.get("rule")) for r in
                     ours(daemon.status(), job)["ranks"]})
        return all(v == "blocked_in_collective" for n, (v, _) in seen.items() if n != culprit)
    wait_until(victims_blocked, 30, what=lambda: f"the victims blocked in a collective: {seen}")
    # diagnose at the stall, one window, the same judgement
    _, report = diagnose(pids[0])
    assert report["job"]["culprits"] == [culprit], report["job"]
    assert next(r for r in report["ranks"] if r["rank"] == culprit)["rule"] == rule
    # one incident, one page: later ticks update it and send nothing new
    ticks = _ticks(daemon)
    wait_until(lambda: _ticks(daemon) >= ticks + 4, 60, what="four more ticks")
    assert len(_firing(daemon, key)) == 1, _firing(daemon, key)
    return by_rank[culprit]


def _ticks(daemon) -> float:
    line = next(x for x in daemon.metrics().splitlines() if x.startswith("ddpwatch_ticks_total"))
    return float(line.split()[-1])


@pytest.mark.parametrize("persistent", [True, False],
                         ids=["persistent-heartbeats", "forked-each-epoch"])
def test_dataloader_workers_blocked_on_a_read_page_their_rank(
        watch, start_module_job, tmp_path_factory, persistent):
    """Persistent workers in a job with heartbeats (what `ddpwatch exec` sets), workers
    forked at each epoch's start in one without."""
    flags = ["--workers", "2"] + (["--persistent"] if persistent else [])
    job, pids, data = _start(start_module_job, tmp_path_factory, torchrun(2, PLAIN, *flags),
                             "loader", {"DDPWATCH_AUTO": "1"} if persistent else None)
    if persistent:
        wait_until(lambda: (lambda ranks: len(ranks) == 2 and all(
            r["signals"].get("hb_step") is not None for r in ranks))(
                ours(watch.status(), job)["ranks"]), 60, what="heartbeats read")
    try:
        block(os.path.join(data, "data-rank1.bin"))
        culprit = _pages_once_naming(watch, job, pids, 1, "hung-waiting-for-data", time.monotonic())
        # the evidence shows where the worker waits (its dump, read on suspicion)
        assert "idle at Shards.__getitem__" in culprit["evidence"], culprit["evidence"]
    finally:
        job.kill()


def test_lightning_dataloader_workers_blocked_page_their_rank(
        watch, start_module_job, tmp_path_factory):
    job, pids, data = _start(start_module_job, tmp_path_factory,
                             [sys.executable, LIGHTNING, "--val-every", "1000"], "pl-loader")
    try:
        block(os.path.join(data, "data-rank1.bin"))
        _pages_once_naming(watch, job, pids, 1, "hung-waiting-for-data", time.monotonic())
    finally:
        job.kill()


@pytest.mark.parametrize("framework", ["estimate_loss", "lightning"])
def test_a_rank_blocked_in_its_evaluation_is_the_culprit(
        watch, start_module_job, tmp_path_factory, framework):
    if framework == "lightning":
        argv, blocked = [sys.executable, LIGHTNING, "--val-every", "6"], "val-rank0.bin"
    else:
        argv, blocked = torchrun(2, PLAIN, "--workers", "0", "--eval-every", "6"), "val.bin"
    job, pids, data = _start(start_module_job, tmp_path_factory, argv, "eval")
    try:
        block(os.path.join(data, blocked))
        # estimate_loss computes a second, then blocks: a pause that stopped working
        culprit = _pages_once_naming(watch, job, pids, 0, "hung-in-pause", time.monotonic())
        assert culprit["signals"]["pause_kind"] == "evaluation"
    finally:
        job.kill()


def test_a_rank_blocked_writing_its_checkpoint_is_the_culprit(
        watch, start_module_job, tmp_path_factory):
    job, pids, data = _start(start_module_job, tmp_path_factory,
                             torchrun(2, PLAIN, "--workers", "0", "--ckpt-every", "6"), "ckpt")
    try:
        block(os.path.join(data, "ckpt-rank0.pt"))  # a pipe nobody reads
        culprit = _pages_once_naming(watch, job, pids, 0, "hung-in-pause", time.monotonic())
        assert culprit["signals"]["pause_kind"] == "checkpoint"
    finally:
        job.kill()


def test_a_rank_blocked_in_a_logging_call_is_the_culprit(
        watch, start_module_job, tmp_path_factory):
    answering = threading.Event()
    answering.set()
    server = _metrics_server(answering)
    port = server.getsockname()[1]
    try:
        job, pids, _ = _start(start_module_job, tmp_path_factory, torchrun(
            2, PLAIN, "--workers", "0", "--log-to", f"127.0.0.1:{port}", "--log-every", "4"),
            "log")
        try:
            answering.clear()
            culprit = _pages_once_naming(watch, job, pids, 0, "hung-in-pause", time.monotonic())
            assert culprit["signals"]["pause_kind"] == "logging"
        finally:
            job.kill()
    finally:
        server.close()


def test_the_same_pauses_working_send_no_page(watch, start_module_job, tmp_path_factory):
    """Workers forked at each epoch's start, an evaluation that computes, a metrics
    server that answers, and checkpoints drained slowly (8 KB every 20 ms: bytes moving
    with no CPU: docs/judgement-over-time.md "Between working and idle"): pauses,
    never a page."""
    answering = threading.Event()
    answering.set()
    server = _metrics_server(answering)
    data = str(tmp_path_factory.mktemp("working"))
    ckpt = os.path.join(data, "ckpt-rank0.pt")
    os.makedirs(data, exist_ok=True)
    block(ckpt)
    stop = threading.Event()

    def drain():  # one checkpoint after another, 8 KB every 20 ms
        while not stop.is_set():
            with open(ckpt, "rb") as f:
                while not stop.is_set() and f.read(8192):
                    stop.wait(0.02)
    threading.Thread(target=drain, daemon=True).start()
    job = start_module_job(torchrun(
        2, PLAIN, "--dir", data, "--workers", "2", "--items", "48", "--eval-every", "10",
        "--eval-work", "3", "--ckpt-every", "15", "--ckpt-mb", "2",
        "--log-to", f"127.0.0.1:{server.getsockname()[1]}", "--log-every", "3"), name="working")
    try:
        key = wait_until(lambda: ours(watch.status(), job).get("key"), 120, what="job watched")
        seen: dict[str, set] = {}

        def pauses_seen():
            for r in ours(watch.status(), job)["ranks"]:
                if r["verdict"] == "paused" and r["signals"].get("pausing"):
                    seen.setdefault(r["signals"].get("pause_kind"), set()).add(r["rule"])
            assert not _firing(watch, key), _firing(watch, key)
            return {"evaluation", "checkpoint"} <= set(seen)
        wait_until(pauses_seen, 240, interval=0.5, what="an evaluation and a checkpoint paused")
        ticks, steps = _ticks(watch), job.output().count("rank 0 step")
        wait_until(lambda: _ticks(watch) >= ticks + 30, 120, what="thirty more ticks")
        assert not _firing(watch, key), _firing(watch, key)
        assert job.output().count("rank 0 step") > steps  # it still trains
    finally:
        stop.set()
        job.kill()
        server.close()
