"""A SIGKILLed rank of a third-party job without heartbeats, under the daemon
(issue 13). mp.spawn and Lightning end the whole job within a second of one
rank's death (the peer's collective fails, "Connection closed by peer", and the
launcher tears the rest down), so the next tick finds nothing: the daemon learns
how each process ended from the kernel's process events (probes/exits.py), holds
the job, names the first to die as the culprit and the others as its victims,
and the incident fires and bundles. `DDPWATCH_SAVE_FIXTURES=1` copies the
incident's snapshots into tests/fixtures/snapshots (thirdparty_<launcher>_killed.json).
"""
from __future__ import annotations

import json
import os
import shutil
import signal

import pytest
from conftest import REPO, need, wait_until
from test_daemon import DaemonRun
from test_thirdparty_jobs import start

SNAPSHOTS = os.path.join(REPO, "tests", "fixtures", "snapshots")


def _job_of(status: dict, pids: set[int]) -> dict | None:
    for job in status["jobs"]:
        if {r["pid"] for r in job["ranks"]} & pids:
            return job
    return None


def _trains(daemon, pids: set[int]):
    """The job once the daemon judges both ranks healthy: progress seen (CPU with
    its peers connected), not a first report of a job still starting."""
    job = _job_of(daemon.status(), pids)
    if job and len(job["ranks"]) == 2 and job["job"]["verdict"] == "healthy" and all(
            r["verdict"] == "healthy" for r in job["ranks"]):
        return job
    return None


@pytest.mark.parametrize("launcher", ["spawn", "lightning"])
def test_killed_rank_is_the_culprit_after_the_job_is_gone(launcher, start_job, tmp_path,
                                                          hb_dir, receivers):
    need(os.geteuid() == 0, "the kernel's process events need root (CAP_NET_ADMIN)")
    hook = receivers()
    daemon = DaemonRun(start_job, tmp_path, hb_dir,
                       {"webhooks": [{"type": "generic", "url": hook.url}],
                        "resolve_after_s": 600})
    tp = start(launcher, str(tmp_path))
    try:
        pids = set(tp.pids.values())
        healthy = wait_until(lambda: _trains(daemon, pids), 150, interval=0.5,
                             what=f"{launcher} job judged healthy by the daemon")
        key = healthy["key"]
        os.kill(tp.pids[1], signal.SIGKILL)
        firing = wait_until(lambda: [b for b in hook.bodies() if b["status"] == "firing"
                                     and b["job"] == key], 60, what="firing webhook")
        # the job is gone by now (the launcher ended it); the daemon judged it anyway
        tp.job.wait(timeout=60)
    finally:
        tp.job.kill()
    alert = firing[-1]
    assert alert["verdict"] == "dead" and alert["culprits"] == [1], alert
    assert "rank 1" in alert["summary"] and "killed by SIGKILL" in alert["summary"], alert
    incident = wait_until(lambda: next((i for i in daemon.status()["incidents"]
                                        if i["job"] == key and i["bundle"]), None),
                          30, what="the incident's bundle")
    report = json.load(open(os.path.join(incident["bundle"], "report.json")))
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert report["job"]["culprits"] == [1]
    culprit, victim = ranks[1], ranks[0]
    assert (culprit["verdict"], culprit["role"], culprit["rule"]) == ("dead", "culprit",
                                                                      "died-first"), culprit
    assert culprit["pid"] == tp.pids[1] and "was killed by SIGKILL" in culprit["evidence"]
    assert f"launched by {launcher}" in culprit["evidence"]
    assert victim["role"] == "victim" and victim["pid"] == tp.pids[0], victim
    assert "after rank 1 was killed by SIGKILL" in victim["evidence"] or \
        "rank 1 (pid" in victim["evidence"], victim
    if os.environ.get("DDPWATCH_SAVE_FIXTURES") == "1":
        shutil.copy(os.path.join(incident["bundle"], "snapshots.json"),
                    os.path.join(SNAPSHOTS, f"thirdparty_{launcher}_killed.json"))
