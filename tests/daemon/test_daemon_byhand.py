"""The daemon finds and judges ranks started by hand: two commands
typed in two terminals (tests/jobs/thirdparty/byhand_ddp.py with
init_method="tcp://..." from its argv), no launcher, nothing of the job in their
environment, no heartbeats. `ddpwatch run` groups them by their connections
(the wire_groups probe: the store's host and its client; observe/jobs/tcp_discovery.py),
numbers them from that evidence, judges them healthy once they train, and names
a stopped rank; two torch processes merely talking over TCP (a server and its
client, tests/jobs/torch_pair.py) are no job.

One daemon and one by-hand job for the module (starting jobs is most of the
time on 2 cores); each test leaves them as it found them.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import pytest
from conftest import REPO, Job, free_port, need, wait_until
from daemons import get
from thirdparty_jobs import ANNOUNCE, THIRDPARTY

from ddpwatch.observe.probes.wire_groups import TORCH_RECHECK_S

JOB_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DDPWATCH_DIR",
           "DDPWATCH_AUTO")
PAIR = re.compile(r"torch_pair: (server|client) connected pid=(\d+)")


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    need(os.cpu_count() >= 2, "needs 2 CPUs")
    tmp = tmp_path_factory.mktemp("byhand-daemon")
    env = {k: v for k, v in os.environ.items() if k not in JOB_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=REPO)
    port = free_port()
    config = tmp / "daemon.yaml"
    config.write_text(json.dumps({"listen": f"127.0.0.1:{port}", "state_dir": str(tmp / "state"),
                                  "heartbeat_dir": str(tmp / "no-records")}))
    jobs = [Job([sys.executable, "-m", "ddpwatch", "run", "--config", str(config)], env,
                str(tmp / "daemon.log"))]
    url = f"http://127.0.0.1:{port}"
    init = f"tcp://127.0.0.1:{free_port()}"
    pair_port = free_port()
    try:
        # two commands, two sessions and process trees, as typed in two terminals
        ranks = [Job([sys.executable, os.path.join(THIRDPARTY, "byhand_ddp.py"), "--rank",
                      str(r), "--world-size", "2", "--init-method", init], env,
                     str(tmp / f"rank{r}.log")) for r in (0, 1)]
        pair = [Job([sys.executable, os.path.join(REPO, "tests", "jobs", "torch_pair.py"), role,
                     str(pair_port)], env, str(tmp / f"{role}.log"))
                for role in ("server", "client")]
        jobs += ranks + pair
        pids = wait_until(lambda: (lambda f: f if len(f) == 2 else None)(
            {int(r): int(p) for job in ranks for r, _, p in ANNOUNCE.findall(job.output())}),
            240, interval=0.5, what="2 ranks started by hand")
        announced = time.time()
        talking = wait_until(lambda: (lambda f: f if len(f) == 2 else None)(
            {role: int(p) for job in pair for role, p in PAIR.findall(job.output())}),
            240, interval=0.5, what="two torch processes connected")
        talking_since = time.monotonic()
        wait_until(lambda: get(url + "/readyz")[0] == 200, 60, what="daemon ready")
        yield {"url": url, "pids": pids, "announced": announced, "pair": talking,
               "pair_since": talking_since, "daemon": jobs[0]}
    finally:
        for job in jobs:
            job.kill()


def status(url: str) -> dict:
    code, body = get(url + "/status")
    assert code == 200, (code, body)
    return json.loads(body)


def job_of(doc: dict, pids) -> dict | None:
    return next((j for j in doc["jobs"] if {r["pid"] for r in j["ranks"]} & set(pids)), None)


def until(watched, check, timeout: float, what: str) -> tuple[dict, dict]:
    """(status, our job) once `check(status, job)` holds; the last job seen on failure."""
    seen = []

    def ready():
        doc = status(watched["url"])
        job = job_of(doc, watched["pids"].values())
        seen[:] = [job]
        return (doc, job) if job is not None and check(doc, job) else None
    try:
        return wait_until(ready, timeout, interval=0.5, what=what)
    except BaseException:
        print(json.dumps(seen, indent=1)[:6000])
        print(watched["daemon"].output()[-3000:])
        raise


def test_ranks_started_by_hand_are_one_job_trained_and_healthy(watched):
    pids = watched["pids"]

    def trained(doc, job):
        # the very state: both ranks computing connected to each other, in a
        # reading taken after they announced their training (not at rendezvous)
        ranks = job["ranks"]
        return (doc["wall_time"] > watched["announced"] + 2
                and {r["rank"]: r["pid"] for r in ranks} == pids
                and all((r["verdict"], r["rule"]) == ("healthy", "healthy-cpu")
                        and r["signals"].get("gloo_unconnected") == 0 for r in ranks))
    doc, job = until(watched, trained, 150, "the by-hand job trained and healthy")
    assert job["job"]["launcher_kind"] == "wire", job["job"]
    assert job["job"]["culprits"] == [] and job["job"]["verdict"] == "healthy"
    assert {r["signals"]["rank_source"] for r in job["ranks"]} == {"wire"}
    assert "wire_groups" not in doc["probe_errors"], doc["probe_errors"]
    assert not [i for i in doc["incidents"] if i["job"] == job["key"]]


def test_two_torch_processes_merely_talking_are_no_job(watched):
    """Both imported torch and are connected to each other: the daemon has looked
    at them (their libtorch rechecked within TORCH_RECHECK_S, their sockets read
    on every pass since) and found no store and no mesh."""
    pair = set(watched["pair"].values())
    deadline = watched["pair_since"] + TORCH_RECHECK_S + 3
    while time.monotonic() < deadline:
        time.sleep(0.5)
    for _ in range(4):  # over several ticks
        doc = status(watched["url"])
        assert job_of(doc, watched["pids"].values()) is not None  # the daemon is looking
        assert job_of(doc, pair) is None, job_of(doc, pair)
        time.sleep(1.0)


def test_a_stopped_rank_started_by_hand_is_named_by_the_daemon(watched):
    pids = watched["pids"]
    os.kill(pids[1], signal.SIGSTOP)
    try:
        def named(doc, job):
            got = {r["rank"]: (r["verdict"], r["role"]) for r in job["ranks"]}
            return got == {1: ("stopped", "culprit"), 0: ("blocked_in_collective", "victim")}
        _, job = until(watched, named, 90, "rank 1 stopped culprit, rank 0 its victim")
        assert job["job"]["culprits"] == [1], job["job"]
        assert {r["rank"]: r["pid"] for r in job["ranks"]} == pids
    finally:
        os.kill(pids[1], signal.SIGCONT)


def test_a_killed_rank_started_by_hand_is_the_culprit(watched):
    """Last in the module: it ends the job. Rank 0 is then connected to no one
    (its peer's end closed, it soon fails too), and the job found on the wire is
    still judged as the job it was: rank 1 dead, the culprit."""
    pids = watched["pids"]
    os.kill(pids[1], signal.SIGKILL)

    def named(doc, job):
        got = {r["rank"]: (r["verdict"], r["role"]) for r in job["ranks"]}
        return got.get(1) == ("dead", "culprit") and job["job"]["culprits"] == [1]
    _, job = until(watched, named, 60, "rank 1 dead, the culprit")
    assert job["job"]["launcher_kind"] == "wire", job["job"]
    assert {r["rank"]: r["pid"] for r in job["ranks"]} == pids
