"""A rank SIGKILLed while `ddpwatch diagnose` watches its job: the
window's exit watch (probes/exits.py, opened by the sampler diagnose uses) sees
how it ended, so the report names it the culprit that died and its peer a
victim, with no heartbeats (an mp.spawn job, tests/jobs/thirdparty/spawn_ddp.py).

The kill is synchronised on diagnose itself: its first py-spy child runs once it
has found the job and taken its first sample, and the window is open from then
until its last sample. A kill that landed outside it (rank 1 not among the
ranks diagnose found alive) is retried on a new job."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

from conftest import REPO, need, wait_until
from diag import by_rank, until_verdict
from thirdparty_jobs import HEALTHY, start

ATTEMPTS = 3


def _py_spy_child(diag: psutil.Process) -> bool:
    try:
        return any(os.path.basename((c.cmdline() or [""])[0]) == "py-spy"
                   for c in diag.children(recursive=True))
    except psutil.Error:
        return False


def _diagnose_and_kill(tp) -> tuple[dict, float]:
    """diagnose rank 0's job; SIGKILL rank 1 once diagnose dumps the ranks' stacks.
    The report, and the seconds from the kill to diagnose's end."""
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("DDPWATCH_DIR", None)
    # a longer window than the default 1 s: a slow machine's kill lands inside too
    diag = subprocess.Popen([sys.executable, "-m", "ddpwatch", "diagnose", "--json",
                             "--window", "2", str(tp.pids[0])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        watched = psutil.Process(diag.pid)
        # polled fast: the first dump of the window lasts a few tens of ms
        deadline = time.monotonic() + 60
        while not _py_spy_child(watched) and diag.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(tp.pids[1], signal.SIGKILL)
        killed_at = time.monotonic()
        out, err = diag.communicate(timeout=120)
    finally:
        if diag.poll() is None:
            diag.kill()
            diag.communicate()
    assert diag.returncode in (0, 1), err
    return json.loads(out), time.monotonic() - killed_at


def test_a_rank_killed_inside_the_window_is_the_culprit_that_died(tmp_path, need_py_spy):
    need(os.geteuid() == 0, "the kernel's process events need root (CAP_NET_ADMIN)")
    for attempt in range(ATTEMPTS):
        tmp = tmp_path / f"try{attempt}"
        tmp.mkdir()
        tp = start("spawn", str(tmp))
        try:
            # a training job: both ranks judged healthy (progress seen), not starting
            until_verdict(tp.pids[0], HEALTHY, timeout=150)
            report, after_kill_s = _diagnose_and_kill(tp)
        finally:
            tp.job.kill()
        ranks = by_rank(report)
        # the window held rank 1 alive at its start: the kill landed inside it
        if ranks.get(1, {}).get("pid") == tp.pids[1] and after_kill_s > 0.2:
            break
        print(f"attempt {attempt}: the kill landed outside the window "
              f"({after_kill_s:.2f}s before diagnose ended): {json.dumps(report)[:2000]}")
    else:
        raise AssertionError(f"no kill inside diagnose's window in {ATTEMPTS} attempts")
    assert report["job"]["verdict"] == "dead" and report["job"]["culprits"] == [1], report["job"]
    culprit, victim = ranks[1], ranks[0]
    assert (culprit["verdict"], culprit["role"], culprit["rule"]) == (
        "dead", "culprit", "died-first"), culprit
    assert "was killed by SIGKILL" in culprit["evidence"], culprit
    assert "launched by spawn" in culprit["evidence"], culprit
    # rank 0 ended after it (the spawn parent tears the job down), or still waits
    # or fails at its next collective: a casualty either way
    assert victim["pid"] == tp.pids[0] and victim["role"] == "victim", victim
    assert victim["rule"] in ("ended-after-peer", "survivor-of-dead-peer",
                              "blocked-on-dead-peer"), victim
    assert "rank 1" in victim["evidence"] and "SIGKILL" in victim["evidence"], victim
