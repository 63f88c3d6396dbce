"""Ranks started by hand, one command each, no launcher and nothing of the job
in their exec-time environment (tests/jobs/thirdparty/byhand_ddp.py with
init_method="tcp://..." from its argv): `diagnose` on either pid groups them into
one job by their TCP connections to each other (observe/jobs/tcp_discovery.py), numbers them
from the evidence (the store's host is rank 0; the other of a closed pair is 1),
judges the job healthy, and names a stopped rank.

`DDPWATCH_SAVE_FIXTURES=1` copies the judged snapshots into tests/fixtures/snapshots
(thirdparty_byhand_<state>.json).
"""
from __future__ import annotations

import os
import shutil
import signal
import sys

import pytest
from conftest import Job, free_port, need, wait_until
from diag import by_rank, diagnose, until_verdict
from thirdparty_jobs import ANNOUNCE, HEALTHY, SNAPSHOTS, THIRDPARTY

JOB_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DDPWATCH_DIR")


@pytest.fixture(scope="module")
def byhand(tmp_path_factory):
    need(os.cpu_count() >= 2, "needs 2 CPUs")
    tmp = str(tmp_path_factory.mktemp("byhand"))
    env = {k: v for k, v in os.environ.items() if k not in JOB_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    url = f"tcp://127.0.0.1:{free_port()}"
    # two commands, two sessions and process trees, as typed in two terminals
    jobs = [Job([sys.executable, os.path.join(THIRDPARTY, "byhand_ddp.py"), "--rank", str(r),
                 "--world-size", "2", "--init-method", url], env,
                os.path.join(tmp, f"rank{r}.log")) for r in (0, 1)]
    try:
        pids = wait_until(lambda: (lambda f: f if len(f) == 2 else None)(
            {int(r): int(p) for job in jobs for r, _, p in ANNOUNCE.findall(job.output())}),
            240, interval=0.5, what="2 ranks started by hand")
        yield pids, tmp
    finally:
        for job in jobs:
            job.kill()


def _until(pids, tmp, state, expected, target):
    path = os.path.join(tmp, f"thirdparty_byhand_{state}.json")
    report = until_verdict(pids[target], expected, timeout=150, extra=("--save-snapshot", path))
    if os.environ.get("DDPWATCH_SAVE_FIXTURES") == "1" and state != "resumed":
        shutil.copy(path, SNAPSHOTS)
    return report


def test_ranks_started_by_hand_are_one_job_by_their_connections(byhand, need_py_spy):
    pids, tmp = byhand
    report = _until(pids, tmp, "healthy", HEALTHY, target=1)
    assert report["job"]["launcher_kind"] == "wire", report["job"]
    assert {r["rank"]: r["pid"] for r in report["ranks"]} == pids
    assert by_rank(report)[0]["signals"]["rank_source"] == "wire"
    assert report["job"]["culprits"] == []
    _, other = diagnose(pids[0])  # the same job from the other rank's pid
    assert sorted(r["pid"] for r in other["ranks"]) == sorted(pids.values())


def test_a_stopped_rank_started_by_hand_is_named(byhand, need_py_spy):
    pids, tmp = byhand
    os.kill(pids[1], signal.SIGSTOP)
    try:
        report = _until(pids, tmp, "stopped", {1: ("stopped", "culprit"),
                                               0: ("blocked_in_collective", "victim")},
                        target=0)
        assert report["job"]["culprits"] == [1]
    finally:
        os.kill(pids[1], signal.SIGCONT)
