"""The fault benchmark's quick run in the suite (benchmarks/faults.py --quick):
real jobs of several launchers stopped, killed, terminated, hung, slowed and left
alone, watched by a real `ddpwatch run` and judged by `ddpwatch diagnose`. Fails
when a run names a wrong culprit, misses a fault, a negative pages or an injection
never reached its state; rows the catalogue marks `known` (true findings about
ddpwatch) are printed, not failed. What the suite checks elsewhere stays out of
--quick (the healthy row: tests/daemon/test_daemon_healthy_watch.py watches four
launchers' healthy jobs at once; the kill row: tests/thirdparty/test_thirdparty_killed.py)."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time

from conftest import REPO, need

LIMIT_S = 300  # the bound for the quick run on a 2-core machine


def test_quick_fault_benchmark(tmp_path, need_py_spy):
    need(os.geteuid() == 0, "the daemon's exits probe (a death's page) needs root")
    began = time.monotonic()
    done = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "faults.py"),
                           "--quick", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=LIMIT_S + 120, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
    took = time.monotonic() - began
    print(done.stdout[-6000:], done.stderr[-3000:])
    [path] = glob.glob(str(tmp_path / "faults-*.json"))
    doc = json.load(open(path))
    s = doc["summary"]
    assert not s["broken"], s["broken"]
    unexpected = [r["name"] for r in doc["scenarios"] if r["ok"] is False and not r["known"]]
    assert not unexpected, f"runs not right: {unexpected}"
    assert done.returncode == 0, done.returncode
    assert s["scored"] >= 5, s
    assert took < LIMIT_S, f"the quick run took {took:.0f} s"
