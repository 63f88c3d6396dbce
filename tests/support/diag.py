"""Helpers for tests that diagnose real jobs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil

from conftest import REPO, is_torchrun_agent, wait_until


def diagnose(pid: int, *extra: str, hb_dir: str | None = None, prefix=()) -> tuple[int, dict]:
    """`prefix`: run diagnose through it, e.g. `ip netns exec NS` for a second node's view."""
    env = dict(os.environ, PYTHONPATH=REPO)
    if hb_dir:
        env["DDPWATCH_DIR"] = hb_dir
    out = subprocess.run([*prefix, sys.executable, "-m", "ddpwatch", "diagnose", "--json",
                          str(pid), *extra],
                         capture_output=True, text=True, env=env, timeout=120)
    if out.returncode not in (0, 1):
        raise AssertionError(f"diagnose exited {out.returncode}: {out.stderr}")
    return out.returncode, json.loads(out.stdout)


def by_rank(report: dict) -> dict[int, dict]:
    return {r["rank"]: r for r in report["ranks"]}


def verdicts(report: dict) -> dict[int, tuple[str, str]]:
    return {r["rank"]: (r["verdict"], r["role"]) for r in report["ranks"]}


def rank_pids(job, count: int, timeout: float = 180) -> list[int]:
    """Wait until the job has `count` rank processes (python with RANK set); sorted by rank."""
    def found():
        ranks = {}
        for proc in job.processes():
            try:
                env = proc.environ()
            except psutil.Error:
                continue
            if "RANK" in env and not is_torchrun_agent(proc.cmdline()):
                ranks[int(env["RANK"])] = proc.pid
        return [ranks[r] for r in sorted(ranks)] if len(ranks) == count else None
    return wait_until(found, timeout, what=f"{count} rank processes")


def launcher_pid(job) -> int:
    return wait_until(lambda: next((p.pid for p in job.processes()
                                    if is_torchrun_agent(p.cmdline())), None),
                      60, what="the torchrun agent")


def until_verdict(pid: int, expected: dict, timeout: float = 120, hb_dir=None, extra=(),
                  prefix=()) -> dict:
    """Diagnose until every rank has its expected (verdict, role); return that report."""
    last = {}

    def check():
        nonlocal last
        _, last = diagnose(pid, *extra, hb_dir=hb_dir, prefix=prefix)
        got = verdicts(last)
        return last if all(got.get(r) == v for r, v in expected.items()) else None
    try:
        return wait_until(check, timeout, interval=0.5, what=f"verdicts {expected}")
    except BaseException:
        print(json.dumps(last, indent=1)[:6000])
        raise


def until_verdict_with(pid: int, expected: dict, signal: str, timeout: float = 120,
                       hb_dir=None) -> dict:
    """until_verdict, and until every rank's signals hold `signal` too: a finding
    read from heartbeats is asserted on a report made after the records were
    published, not on the first "healthy" one."""
    def check():
        report = until_verdict(pid, expected, timeout, hb_dir=hb_dir)
        return report if all(r["signals"].get(signal) is not None
                              for r in report["ranks"]) else None
    return wait_until(check, timeout, interval=0.5, what=f"{expected} with {signal}")


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of a process (sched_setaffinity on the pid moves one thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass


def env_rank(port: int, rank: int, world: int = 2) -> dict:
    """Environment of a rank started by hand (env:// rendezvous, no torchrun)."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
            "RANK": str(rank), "LOCAL_RANK": str(rank)}


def by_hand(start_job, rank: int, addr: str, port: int, env=None, prefix=()):
    """A rank started by hand from a shell with env rendezvous (no torchrun)."""
    argv = [*prefix, "bash", "-c", '"$@"; exit $?', f"rank{rank}",
            sys.executable, "-m", "trainer", "--steps=0"]
    e = {"MASTER_ADDR": addr, "MASTER_PORT": str(port), "WORLD_SIZE": "2",
         "RANK": str(rank), "LOCAL_RANK": "0"}
    return start_job(argv, env=dict(e, **(env or {})), name=f"rank{rank}")


def python_pid(job, timeout: float = 60.0) -> int:
    """The one python process of a job started through a shell or `ip netns exec`."""
    def found():
        for p in job.processes():
            try:
                if "python" in os.path.basename(p.cmdline()[0]):
                    return p.pid
            except (psutil.Error, IndexError):
                continue
        return None
    return wait_until(found, timeout, what="the rank's python process")


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (tests decide bf16 expectations
    from it: CI's CPU may lack what this one has)."""
    with open("/proc/cpuinfo") as f:
        flags = set()
        for line in f:
            if line.startswith(("flags", "Features")):
                flags |= set(line.split(":", 1)[1].split())
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def removed_dir(path: str) -> bool:
    """Removes an empty directory (a test's cgroup); False while it is still busy
    (a process leaving it): call under wait_until."""
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False
