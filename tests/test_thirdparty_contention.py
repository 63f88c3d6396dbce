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
import subprocess
import sys
import time

import pytest
from conftest import need, wait_until
from diag import by_rank, diagnose
from test_thirdparty_jobs import HEALTHY, SCRIPTS, SNAPSHOTS, start

from ddpwatch.judge.vocabulary import VERDICTS

# busy processes beside the rank on its CPU: it gets at most 1/(BUSY+1) of it, well
# below what other users' load takes from its peer on a shared 2-core machine
BUSY = 8
SHARED = 4  # busy processes on each CPU when the machine is shared equally
CALM = {v.name for v in VERDICTS if v.calm}
# the CPUs we may use (a container's cpuset may not start at 0)
MINE = sorted(os.sched_getaffinity(0))
ALL = ",".join(map(str, MINE))


def _busy(cpu: int, n: int) -> list[subprocess.Popen]:
    """`n` CPU-bound processes pinned to `cpu`, each in a session (and so a
    scheduler autogroup) of its own, like other users' programs."""
    return [subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c",
                              "while True: pass"], start_new_session=True,
                             stdin=subprocess.DEVNULL) for _ in range(n)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(timeout=30)


def _pin(pid: int, cpus: str) -> None:
    """Every thread of `pid` (torch's Gloo and autograd threads are tasks of their
    own: `taskset -p` alone would move the main thread only)."""
    subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], check=True,
                   stdout=subprocess.DEVNULL)


def _schedstat(pid: int) -> tuple[float, float]:
    """(seconds run, seconds waited for a CPU), summed over the threads."""
    run = wait = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
        except OSError:
            continue
        run, wait = run + int(fields[0]) / 1e9, wait + int(fields[1]) / 1e9
    return run, wait


def _wait_share(pids: dict[int, int], seconds: float = 2.0) -> dict[int, float]:
    """Each rank's share of the time it wanted a CPU that it spent waiting for one."""
    before = {r: _schedstat(p) for r, p in pids.items()}
    time.sleep(seconds)  # a measurement window, not a synchronisation
    out = {}
    for r, p in pids.items():
        run, wait = (a - b for a, b in zip(_schedstat(p), before[r]))
        out[r] = wait / (run + wait) if run + wait > 0 else 0.0
    return out


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
