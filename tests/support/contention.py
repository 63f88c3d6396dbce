"""CPU contention made and measured (tests/thirdparty): busy processes pinned
beside a rank, a rank's threads pinned to CPUs, and the share of the time a rank
wanted a CPU that it spent waiting for one (schedstat)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

# busy processes beside the rank on its CPU: it gets at most 1/(BUSY+1) of it, well
# below what other users' load takes from its peer on a shared 2-core machine
BUSY = 8
# the CPUs we may use (a container's cpuset may not start at 0)
MINE = sorted(os.sched_getaffinity(0))


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
