"""A rank slowed by CPU contention, no heartbeats: real third-party
jobs (mp.spawn as PyTorch's DDP tutorial, Lightning) on 2 CPU ranks where rank 1
shares its CPU with busy processes. `diagnose` names rank 1 the straggler with
its run-queue wait as evidence and rank 0 the waiting victim; a job slowed
equally on every rank by a shared machine is no alarm.

Why earlier attempts saw no starvation: with autogroup scheduling
(/proc/sys/kernel/sched_autogroup_enabled, the default of most distributions)
CFS shares a CPU between *sessions* first, then between the tasks of each. The
job runs in a session of its own, so any number of busy loops started from the
test's session took at most half of the rank's CPU, however many or however
niced. Each busy process here gets a session of its own, as another user's
program would, and the contention is measured (schedstat) before a verdict is
asserted on it.

`DDPWATCH_SAVE_FIXTURES=1` copies the judged snapshots into tests/fixtures/snapshots
(thirdparty_<launcher>_contended.json, _shared.json).
"""
from __future__ import annotations

import os
import shutil

import pytest
from conftest import need, wait_until
from contention import BUSY, MINE, _busy, _pin, _stop, _wait_share
from diag import by_rank, diagnose
from thirdparty_jobs import HEALTHY, SCRIPTS, SNAPSHOTS, start

from ddpwatch.judge.vocabulary import VERDICTS

SHARED = 4  # busy processes on each CPU when the machine is shared equally
CALM = {v.name for v in VERDICTS if v.calm}
ALL = ",".join(map(str, MINE))


def _keep(tp, state: str, report_path: str) -> None:
    if os.environ.get("DDPWATCH_SAVE_FIXTURES") == "1":
        shutil.copy(report_path, os.path.join(SNAPSHOTS, f"thirdparty_{tp.launcher}_{state}.json"))


@pytest.fixture(scope="module", params=sorted(SCRIPTS))
def third(request, tmp_path_factory):
    need(len(MINE) >= 2 and shutil.which("taskset") is not None,
         "needs 2 CPUs and taskset (util-linux)")
    tp = start(request.param, str(tmp_path_factory.mktemp(request.param)))
    yield tp
    tp.job.kill()


def test_rank_sharing_its_cpu_is_the_straggler(third, need_py_spy):
    third.until("healthy", HEALTHY)
    _pin(third.pids[1], str(MINE[1]))
    busy = _busy(MINE[1], BUSY)
    try:
        # the contention is real before any verdict is asserted on it
        shares = wait_until(lambda: (lambda s: s if s[1] >= 0.5 else None)(
            _wait_share(third.pids)), 30, interval=0, what="rank 1 waiting for its CPU")
        report = third.until("contended", {1: ("straggler", "culprit"),
                                           0: ("waiting_on_peer", "victim")}, timeout=90)
        one = by_rank(report)[1]
        assert one["rule"] == "straggler-starved", one
        assert report["job"]["culprits"] == [1]
        assert one["signals"]["cpu_wait_share"] >= 0.4, (one["signals"], shares)
        assert "waiting for a CPU" in one["evidence"], one["evidence"]
        # the busy processes, named (probes/competitors.py)
        assert "python pid" in one["signals"].get("competitors", ""), one["signals"]
        _keep(third, "contended", os.path.join(third.tmp, f"thirdparty_{third.launcher}"
                                                          f"_contended.json"))
    finally:
        _stop(busy)
        _pin(third.pids[1], ALL)


# Once, on one launcher: what is asserted does not depend on it (the wall time
# of real jobs on 2 cores is the suite's budget)
@pytest.mark.parametrize("third", ["spawn"], indirect=True)
def test_a_job_slowed_equally_by_a_shared_machine_is_no_alarm(third, need_py_spy):
    third.until("healthy", HEALTHY)
    _pin(third.pids[0], str(MINE[0]))
    _pin(third.pids[1], str(MINE[1]))
    busy = _busy(MINE[0], SHARED) + _busy(MINE[1], SHARED)
    path = os.path.join(third.tmp, "shared.json")
    try:
        shares = wait_until(lambda: (lambda s: s if min(s.values()) >= 0.4 else None)(
            _wait_share(third.pids)), 30, interval=0, what="both ranks waiting for a CPU")
        for _ in range(3):
            _, report = diagnose(third.pids[0], "--save-snapshot", path)
            assert report["job"]["culprits"] == [], (report["job"], shares)
            for r in report["ranks"]:
                assert r["verdict"] in CALM and r["role"] == "none", (r, shares)
        _keep(third, "shared", path)
    finally:
        _stop(busy)
        for pid in third.pids.values():
            _pin(pid, ALL)
