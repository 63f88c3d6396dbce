"""A real Ray Train job (tests/jobs/thirdparty/ray_ddp.py: TorchTrainer, 2 CPU
workers, Gloo), watched by `ddpwatch run` and diagnosed by `ddpwatch diagnose`.
What makes it hard (see the script's doc): the ranks' process title is
"ray::RayTrainWorker", nothing of the job is in their exec-time environment,
they train in a thread of their own while the main thread idles in Ray's event
loop, and a dozen Ray processes (the driver and Ray's controller among them,
both torch processes connected to the ranks) stand beside them.

What finds them: their executable is Python (discovery.ProcInfo.python), and on
the wire they have the shape of one DDP job, a TCPStore rank 0 hosts and every
rank dialled (observe/jobs/tcp_discovery.py ddp_groups, store_complete: the world is the two);
with DDPWATCH_AUTO=1 their heartbeat records too. Their stacks are read from the
thread that trains (judge/stackmatch.training_thread).

One Ray job and one daemon per module parameter (Ray's start takes 15-60 s on 2
cores): healthy for a watch with no page, then a stopped worker (resumed), a
starved one, and last a killed one. `DDPWATCH_SAVE_FIXTURES=1` copies the
judged snapshots into tests/fixtures/snapshots (thirdparty_ray_<state>.json).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import Receiver, _job_starter, free_port, need, wait_until
from contention import BUSY, MINE, _busy, _pin, _stop, _wait_share
from daemons import get
from diag import by_rank, until_verdict
from thirdparty_jobs import ANNOUNCE, SNAPSHOTS, THIRDPARTY

# healthy training watched for pages: a minute once (the records change what is
# read, not what judges a healthy job over time), the diagnoses included
WATCH_S = {"plain": 30.0, "auto": 0.0}  # benchmarks/soak.py watches long


def need_ray() -> None:
    need(importlib.util.find_spec("ray") is not None
         and importlib.util.find_spec("pandas") is not None,
         "ray[train] is not installed (setup.cfg extra 'test')")


@pytest.fixture(scope="module", params=["plain", "auto"])
def ray(request):
    need_ray()
    need(len(MINE) >= 2, "needs 2 CPUs")
    auto = request.param == "auto"
    # Ray's socket paths are bounded (108 bytes): a short directory of its own,
    # its HOME too (Ray writes an auth token there)
    tmp = tempfile.mkdtemp(prefix="ddpw-ray-", dir="/tmp")
    hook = Receiver()
    start, jobs = _job_starter(Path(tmp), os.path.join(tmp, "hb"))
    port = free_port()
    config = os.path.join(tmp, "daemon.yaml")
    with open(config, "w") as f:
        json.dump({"listen": f"127.0.0.1:{port}", "state_dir": os.path.join(tmp, "state"),
                   "heartbeat_dir": "", "resolve_after_s": 10,
                   "webhooks": [{"type": "generic", "url": hook.url}]}, f)
    try:
        daemon = start([sys.executable, "-m", "ddpwatch", "run", "--config", config],
                       name=f"daemon-{request.param}")
        env = {"HOME": tmp, "RAY_USAGE_STATS_ENABLED": "0",
               "DDPWATCH_AUTO": "1" if auto else "0"}
        job = start([sys.executable, os.path.join(THIRDPARTY, "ray_ddp.py"), tmp],
                    env=env, name=f"ray-{request.param}")
        try:
            pids = wait_until(lambda: (lambda f: f if len(f) == 2 else None)(
                {int(r): int(p) for r, _, p in ANNOUNCE.findall(job.output())}),
                300, interval=1, what="Ray Train's 2 workers training")
        except BaseException:
            print(job.output()[-4000:])
            raise
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: get(url + "/readyz")[0] == 200, 60, what="daemon ready")
        yield {"mode": request.param, "pids": pids, "url": url, "hook": hook, "job": job,
               "daemon": daemon, "tmp": tmp}
    finally:
        for started in jobs:  # Ray's processes first: they write under tmp
            started.kill()
        hook.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _status(ray) -> dict:
    code, body = get(ray["url"] + "/status")
    assert code == 200, (code, body)
    return json.loads(body)


def _ours(ray) -> dict | None:
    pids = set(ray["pids"].values())
    return next((j for j in _status(ray)["jobs"]
                 if {r["pid"] for r in j["ranks"]} & pids), None)


def until_daemon(ray, expected: dict, culprits: list, timeout: float = 120) -> dict:
    """The daemon's view of the job once every rank has its expected (verdict,
    role) and its rank number is the one the worker announced."""
    seen = []

    def check():
        job = _ours(ray)
        seen[:] = [job]
        if job is None or job["job"]["culprits"] != culprits:
            return None
        got = {r["rank"]: (r["verdict"], r["role"], r["pid"]) for r in job["ranks"]}
        want = {rank: (*v, ray["pids"][rank]) for rank, v in expected.items()}
        return job if got == want else None
    try:
        return wait_until(check, timeout, interval=0.5, what=f"the daemon's {expected}")
    except BaseException:
        print(json.dumps(seen, indent=1)[:6000])
        print(ray["daemon"].output()[-3000:])
        raise


def _until_diagnosed(ray, state: str, expected: dict) -> dict:
    path = os.path.join(ray["tmp"], f"thirdparty_ray_{state}.json")
    report = until_verdict(ray["pids"][0], expected, timeout=120,
                           extra=("--save-snapshot", path))
    if os.environ.get("DDPWATCH_SAVE_FIXTURES") == "1" and ray["mode"] == "plain":
        shutil.copy(path, SNAPSHOTS)
    return report


HEALTHY = {0: ("healthy", "none"), 1: ("healthy", "none")}


def test_a_ray_train_job_is_found_numbered_and_pages_nobody(ray):
    job = until_daemon(ray, HEALTHY, [], timeout=180)
    source = {r["signals"].get("rank_source") for r in job["ranks"]}
    assert source == ({"record"} if ray["mode"] == "auto" else {"wire"}), job["ranks"]
    # one job, found on the wire, whichever else numbers its ranks
    assert job["job"]["launcher_kind"] == "wire", job["job"]
    started = time.monotonic()
    report = _until_diagnosed(ray, "healthy", HEALTHY)
    ranks = by_rank(report)
    assert {r: ranks[r]["pid"] for r in ranks} == ray["pids"], report["ranks"]
    # the evidence is the training thread's, not the idle main thread's
    assert all(ranks[r]["signals"].get("stack") not in ("idle_user", None) for r in ranks), \
        [ranks[r]["signals"].get("stack") for r in ranks]
    # watched: no page while it trains (Ray's controller, driver and idle workers
    # beside it are no ranks and no job)
    while True:
        assert not [b for b in ray["hook"].bodies() if b["status"] == "firing"], \
            ray["hook"].bodies()
        if time.monotonic() - started >= WATCH_S[ray["mode"]]:
            break
        time.sleep(1)  # the watch's pace, not a synchronisation
    doc = _status(ray)
    others = [j for j in doc["jobs"] if not (
        {r["pid"] for r in j["ranks"]} & set(ray["pids"].values()))]
    assert not [j for j in others if j["job"]["verdict"] not in ("healthy", "warming_up")], others


def test_a_stopped_ray_worker_is_the_culprit(ray):
    pid = ray["pids"][1]
    os.kill(pid, signal.SIGSTOP)
    try:
        job = until_daemon(ray, {0: ("blocked_in_collective", "victim"),
                                 1: ("stopped", "culprit")}, [1])
        assert "kill -CONT" in job["job"]["summary"], job["job"]
        firing = wait_until(lambda: [b for b in ray["hook"].bodies()
                                     if b["status"] == "firing" and b["verdict"] == "stopped"],
                            60, what="the stopped worker's page")
        assert firing[-1]["culprits"] == [1], firing[-1]
        report = _until_diagnosed(ray, "stopped", {0: ("blocked_in_collective", "victim"),
                                                   1: ("stopped", "culprit")})
        # the victim's evidence is its training thread waiting in DDP's all-reduce
        assert by_rank(report)[0]["signals"]["stack"] in ("collective", "ddp_backward"), \
            by_rank(report)[0]["signals"]
    finally:
        os.kill(pid, signal.SIGCONT)
    until_daemon(ray, HEALTHY, [], timeout=120)


# with records (auto) a late rank is the straggler from its heartbeats as on any
# launcher (tests/diagnose/test_diagnose_trainer.py); what is Ray's own is how a
# starved worker looks without them, so this one runs on the plain job only
@pytest.mark.parametrize("ray", ["plain"], indirect=True)
def test_a_starved_ray_worker_is_the_straggler(ray):
    _pin(ray["pids"][1], str(MINE[1]))
    busy = _busy(MINE[1], BUSY)
    try:
        wait_until(lambda: (lambda s: s if s[1] >= 0.5 else None)(_wait_share(ray["pids"])),
                   30, interval=0, what="rank 1 waiting for its CPU")
        job = until_daemon(ray, {0: ("waiting_on_peer", "victim"),
                                 1: ("straggler", "culprit")}, [1], timeout=150)
        one = next(r for r in job["ranks"] if r["rank"] == 1)
        # its run-queue wait says why; with records, how late it arrives may say it first
        assert one["rule"] == "straggler-starved", one
        report = _until_diagnosed(ray, "contended", {0: ("waiting_on_peer", "victim"),
                                                     1: ("straggler", "culprit")})
        assert "waiting for a CPU" in by_rank(report)[1]["evidence"]
    finally:
        _stop(busy)
        _pin(ray["pids"][1], ",".join(map(str, MINE)))
    until_daemon(ray, HEALTHY, [], timeout=150)


def test_a_killed_ray_worker_is_the_culprit(ray):
    """Last: Ray ends the run when a worker dies (no retries configured)."""
    os.kill(ray["pids"][1], signal.SIGKILL)
    firing = wait_until(lambda: [b for b in ray["hook"].bodies()
                                 if b["status"] == "firing" and b["verdict"] == "dead"],
                        90, what="the killed worker's page")
    alert = firing[-1]
    assert alert["culprits"] == [1], (alert["summary"], ray["daemon"].output()[-3000:])
    assert "was killed by SIGKILL" in alert["summary"], alert["summary"]
