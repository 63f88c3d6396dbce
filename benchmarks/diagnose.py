"""How fast `ddpwatch diagnose` answers, and what it costs the ranks. One run prints:

* wall time from the call to the verdict (target <= 3 s), median of N calls on a
  job stalled by `hang:rank=1`, and on a healthy job;
* wall time on an mp.spawn job without heartbeats (tests/jobs/thirdparty/
  spawn_ddp.py: no ddpwatch inside), judged over its sampled window alone;
* how long any rank was paused by it: py-spy runs --nonblocking (no pause) unless
  --native is asked, so this measures the longest gap between two heartbeats of
  the healthy job's ranks while diagnose runs, against the longest gap without.

    python benchmarks/diagnose.py [--calls N]
"""
from __future__ import annotations

from common import free_port  # benchmarks/common.py

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def start(fault: str | None, hb_dir: str) -> subprocess.Popen:
    env = dict(os.environ, DDPWATCH_DIR=hb_dir, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "trainer",
           "--steps=0", "--device-type=cpu"] + ([f"--fault={fault}"] if fault else [])
    return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def stop(job: subprocess.Popen) -> None:
    job.send_signal(signal.SIGTERM)
    try:
        job.wait(30)
    except subprocess.TimeoutExpired:
        pass
    try:  # whatever of its group is left (an mp.spawn parent leaves its children)
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def records(hb_dir):
    from ddpwatch.heartbeat import read_dir
    return read_dir(hb_dir)[0]


def wait_for(predicate, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    sys.exit("benchmark: the job never reached the state to measure")


def diagnose_times(pid: int, hb_dir: str, calls: int) -> tuple[list[float], list]:
    times, reports = [], []
    for _ in range(calls):
        t0 = time.monotonic()
        reports.append(diagnose(pid, hb_dir))
        times.append(time.monotonic() - t0)
    return times, [r["job"]["culprits"] for r in reports]


def diagnose(pid: int, hb_dir: str) -> dict:
    env = dict(os.environ, DDPWATCH_DIR=hb_dir, PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-m", "ddpwatch", "diagnose", "--json", str(pid)],
                         capture_output=True, text=True, env=env, timeout=120)
    return json.loads(out.stdout)


def without_heartbeats(calls: int) -> None:
    """A healthy mp.spawn job with no ddpwatch in it, once it trains."""
    script = os.path.join(REPO, "tests", "jobs", "thirdparty", "spawn_ddp.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()))
    env.pop("DDPWATCH_DIR", None)
    job = subprocess.Popen([sys.executable, script], env=env, cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    with tempfile.TemporaryDirectory() as empty:
        try:
            wait_for(lambda: [r["verdict"] for r in diagnose(job.pid, empty)["ranks"]]
                     == ["healthy", "healthy"])
            times, culprits = diagnose_times(job.pid, empty, calls)
        finally:
            stop(job)
    print(f"diagnose on an mp.spawn job without heartbeats (healthy, judged over its "
          f"window): median {statistics.median(times):.2f} s, max {max(times):.2f} s over "
          f"{len(times)} calls (target <= 3 s); culprits named: {culprits[0]}")


def longest_gap(hb_dir: str, seconds: float, during=None) -> float:
    """Longest time any rank's heartbeat stood still, sampled every 5 ms."""
    last_seen, longest = {}, 0.0
    worker = threading.Thread(target=during) if during else None
    if worker:
        worker.start()
    end = time.monotonic() + seconds
    while time.monotonic() < end or (worker and worker.is_alive()):
        now = time.monotonic()
        for r in records(hb_dir):
            key = (r.pid, r.seq)
            if r.pid not in last_seen or last_seen[r.pid][0] != key:
                last_seen[r.pid] = (key, now)
            longest = max(longest, now - last_seen[r.pid][1])
        time.sleep(0.005)
    if worker:
        worker.join()
    return longest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as hb_dir:
        job = start("hang:rank=1:step=10", hb_dir)
        try:
            wait_for(lambda: any(r.in_collective and time.monotonic() - r.entered_at > 3
                                 for r in records(hb_dir)))
            times, culprits = diagnose_times(job.pid, hb_dir, args.calls)
        finally:
            stop(job)
        print(f"diagnose on a stalled job (rank 1 hung): median {statistics.median(times):.2f} s, "
              f"max {max(times):.2f} s over {len(times)} calls (target <= 3 s); "
              f"culprits named: {culprits[0]}")
    with tempfile.TemporaryDirectory() as hb_dir:
        job = start(None, hb_dir)
        try:
            wait_for(lambda: len(records(hb_dir)) == 2 and min(r.step for r in records(hb_dir)) > 5)
            quiet = longest_gap(hb_dir, 8.0)
            holder = {}
            busy = longest_gap(hb_dir, 0.0, during=lambda: holder.update(
                r=diagnose_times(job.pid, hb_dir, args.calls)))
        finally:
            stop(job)
        times = holder["r"][0]
        print(f"diagnose on a healthy job: median {statistics.median(times):.2f} s "
              f"(target <= 3 s)")
        print(f"longest heartbeat gap of any rank: {busy * 1e3:.0f} ms while diagnose ran "
              f"{args.calls}x, {quiet * 1e3:.0f} ms over 8 s without it "
              f"(py-spy --nonblocking does not pause the ranks)")
    without_heartbeats(args.calls)


if __name__ == "__main__":
    main()
