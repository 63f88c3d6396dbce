"""Real third-party jobs without heartbeats (tests/jobs/thirdparty): `start` launches
one on 2 CPU ranks with its launcher (LAUNCH: accelerate, torchrun, mpirun, srun; the
others run their script) and waits until each rank announces itself (ANNOUNCE);
ThirdParty.until diagnoses it until every rank has the expected verdict. Used by
tests/thirdparty, tests/daemon and tests/diagnose."""
from __future__ import annotations

import os
import re
import shutil
import sys

import psutil

from conftest import REPO, Job, free_port, need, wait_until
from diag import by_rank, until_verdict


THIRDPARTY = os.path.join(REPO, "tests", "jobs", "thirdparty")
SNAPSHOTS = os.path.join(REPO, "tests", "fixtures", "snapshots")
ANNOUNCE = re.compile(r"thirdparty: rank=(\d+) local_rank=\d+ world=(\d+) pid=(\d+)")
SCRIPTS = {"lightning": "lightning_ddp.py", "spawn": "spawn_ddp.py",
           "accelerate": "accelerate_ddp.py"}
HEALTHY = {0: ("healthy", "none"), 1: ("healthy", "none")}


class ThirdParty:
    def __init__(self, launcher: str, job: Job, pids: dict[int, int], tmp,
                 detached: bool = False):
        self.launcher, self.job, self.pids, self.tmp = launcher, job, pids, tmp
        self.detached = detached

    def until(self, state: str, expected: dict, timeout: float = 150) -> dict:
        """Diagnose rank 0 until every rank has its expected verdict and role; keep
        the snapshot the assertion was made on."""
        path = os.path.join(self.tmp, f"thirdparty_{self.launcher}_{state}.json")
        report = until_verdict(self.pids[0], expected, timeout=timeout,
                               extra=("--save-snapshot", path))
        if os.environ.get("DDPWATCH_SAVE_FIXTURES") == "1" and state != "resumed":
            shutil.copy(path, SNAPSHOTS)
        if self.detached:
            _no_orphan_though_detached(report, self)
        return report


def need_package(launcher: str) -> None:
    if launcher in ("lightning", "accelerate"):
        try:
            __import__(launcher)
        except ImportError:
            need(False, f"{launcher} is not installed (setup.cfg extra 'test')")


def _no_orphan_though_detached(report: dict, tp: ThirdParty) -> None:
    """A live job whose starter exited (nohup, setsid, a closed SSH session) is no
    leftover in any state: its rank 0 has lost its parent, and no rank is an
    orphan (rules/default.yaml `orphan`)."""
    ranks = by_rank(report)
    if psutil.Process(tp.pids[0]).ppid() == 1:  # not a subreaper, which ddpwatch cannot tell
        assert ranks[0]["signals"]["parent_gone"] is True, ranks[0]["signals"]
    orphans = [r["rank"] for r in report["ranks"]
               if any(f["id"] == "orphan" for f in r["findings"])]
    assert not orphans, report["ranks"]


def start(launcher: str, tmp, fault: str = "", env: dict | None = None,
          detached: bool = False) -> ThirdParty:
    """`detached`: started by a shell that exits at once, as nohup or setsid leave a
    job: its first process is re-parented to init."""
    need_package(launcher)
    need(os.cpu_count() >= 2, "needs 2 CPUs")
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               MASTER_PORT=str(port), DDPWATCH_TEST_FAULT=fault, **(env or {}))
    env.pop("DDPWATCH_DIR", None)
    script = os.path.join(THIRDPARTY, SCRIPTS[launcher])
    command = LAUNCH[launcher](port, script) if launcher in LAUNCH else [sys.executable, script]
    if detached:
        command = ["sh", "-c", '"$@" &', "sh", *command]
    job = Job(command, env, os.path.join(tmp, f"{launcher}.log"))

    def announced():
        found = {int(r): int(p) for r, _, p in ANNOUNCE.findall(job.output())}
        return found if len(found) == 2 else None
    try:
        pids = wait_until(announced, 240, interval=0.5, what=f"{launcher}'s 2 ranks")
    except BaseException:
        job.kill()
        print(job.output()[-3000:])
        raise
    return ThirdParty(launcher, job, pids, tmp, detached)


LAUNCH = {
    "accelerate": lambda port, script: [
        os.path.join(os.path.dirname(sys.executable), "accelerate"), "launch", "--multi_gpu",
        "--num_processes=2", f"--main_process_port={port}", script],
    "torchrun": lambda port, script: [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={port}", script],
    # Open MPI refuses root without the flag; two ranks on a 2-core machine need no
    # slots from a hostfile
    "mpirun": lambda port, script: [
        "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
        "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={port}", "-x", "OMP_NUM_THREADS",
        "-x", "PYTHONUNBUFFERED", sys.executable, script],
    # srun passes its whole environment on (--export=ALL): MASTER_PORT among it
    "srun": lambda port, script: ["srun", "-n", "2", sys.executable, script],
}
