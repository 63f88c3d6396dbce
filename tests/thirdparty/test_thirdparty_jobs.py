"""Real third-party trainers, no heartbeats, no ddpwatch inside:
Lightning's subprocess launcher, torch.multiprocessing.spawn and `accelerate
launch` on 2 CPU ranks (tests/jobs/thirdparty); torchrun, mpirun and srun (a
one-node SLURM cluster, tests/support/slurm.py) in the launcher test. One job per
launcher is shared by the states asserted on it (a job per fault is expensive
on 2 cores); each state is undone before the next. `DDPWATCH_SAVE_FIXTURES=1`
copies the snapshots the assertions were made on into tests/fixtures/snapshots
(thirdparty_<launcher>_<state>.json).
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time

import psutil
import pytest
from conftest import Job, free_port, need, wait_until
from diag import by_rank, removed_dir
from thirdparty_jobs import (ANNOUNCE, HEALTHY, LAUNCH, SCRIPTS, SNAPSHOTS, THIRDPARTY,
                             ThirdParty, start)

from ddpwatch.judge.vocabulary import VERDICTS


def _ranks_are_the_scripts_own(report: dict, tp: ThirdParty) -> None:
    """Each rank number as discovery found it is the one the script itself knows."""
    got = {r["rank"]: r["pid"] for r in report["ranks"]}
    assert got == tp.pids, (got, tp.pids)


def _duty_cycle(pid: int, stopped_s: float, running_s: float, done: threading.Event):
    while not done.is_set():
        os.kill(pid, signal.SIGSTOP)
        time.sleep(stopped_s)
        os.kill(pid, signal.SIGCONT)
        time.sleep(running_s)


def _cgroup_dir() -> tuple[str, str]:
    """A CPU cgroup hierarchy we may make a child in: v2, else v1's cpu controller."""
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        with open("/sys/fs/cgroup/cgroup.controllers") as f:
            if "cpu" in f.read().split():
                return "v2", "/sys/fs/cgroup"
    if os.path.exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
        return "v1", "/sys/fs/cgroup/cpu"
    return "", ""


@pytest.mark.parametrize("launcher", sorted(SCRIPTS))
def test_rank_hung_outside_collectives(launcher, tmp_path, need_py_spy):
    tp = start(launcher, str(tmp_path), fault="hang:1:30")
    try:
        report = tp.until("hung", {1: ("hung_outside_collective", "culprit"),
                                   0: ("blocked_in_collective", "victim")}, timeout=180)
        assert report["job"]["culprits"] == [1]
        _ranks_are_the_scripts_own(report, tp)
    finally:
        tp.job.kill()


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """One SLURM cluster for the module's srun jobs (tests/support/slurm.py)."""
    from slurm import Slurm
    cluster = Slurm(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.close()


@pytest.mark.parametrize("launcher", ["torchrun", "mpirun", "srun"])
def test_launcher_workers_are_one_job_with_their_launcher(launcher, tmp_path, request,
                                                          need_py_spy):
    """torchrun's agent, mpirun, or SLURM's slurmstepd under srun starts the
    workers, which are one job, numbered as the script itself says (mpirun:
    OMPI_COMM_WORLD_RANK, srun: SLURM_PROCID, no RANK); a stopped worker is the
    culprit there as under the other launchers (accelerate runs torchrun's
    agent: test_healthy_without_heartbeats)."""
    env = dict(os.environ)
    if launcher == "mpirun":
        need(shutil.which("mpirun") is not None,
             "needs Open MPI's mpirun (Debian package openmpi-bin)")
    if launcher == "srun":
        env = dict(request.getfixturevalue("slurm_cluster").env)  # its SLURM_CONF
    port = free_port()
    script = os.path.join(THIRDPARTY, f"{launcher}_ddp.py")
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MASTER_PORT=str(port))
    env.pop("DDPWATCH_DIR", None)
    job = Job(LAUNCH[launcher](port, script), env, str(tmp_path / f"{launcher}.log"))
    try:
        pids = wait_until(lambda: (lambda f: f if len(f) == 2 else None)(
            {int(r): int(p) for r, _, p in ANNOUNCE.findall(job.output())}),
            240, interval=0.5, what=f"{launcher}'s 2 ranks")
        tp = ThirdParty(launcher, job, pids, str(tmp_path))
        report = tp.until("healthy", HEALTHY)
        assert {r["rank"]: r["pid"] for r in report["ranks"]} == pids
        # torchrun sets RANK; the others' numbers are their launcher's convention
        source = "env" if launcher == "torchrun" else "launch"
        assert {r["rank"]: r["signals"]["rank_source"] for r in report["ranks"]} == {
            0: source, 1: source}
        if launcher == "srun":
            # srun itself is a client of slurmd: the tasks are slurmstepd's children
            parents = {psutil.Process(pid).parent().name() for pid in pids.values()}
            assert parents == {"slurmstepd"} and report["job"]["launcher_kind"] == "slurm"
        else:
            assert report["job"]["launcher_kind"] == launcher
            assert report["job"]["launcher_pid"] == job.proc.pid
        os.kill(pids[1], signal.SIGSTOP)
        report = tp.until("stopped", {1: ("stopped", "culprit"),
                                      0: ("blocked_in_collective", "victim")})
        assert report["job"]["culprits"] == [1]
    finally:
        job.kill()


def test_mpirun_inside_a_slurm_step_is_numbered_as_mpi_numbers_it(tmp_path, slurm_cluster,
                                                                   need_py_spy):
    """An mpirun run by srun (as in a batch script) passes the step's
    SLURM_PROCID, 0, on to both ranks it starts: they are mpirun's job, numbered
    by OMPI_COMM_WORLD_RANK as the script numbers itself, not both rank 0
    (launchers.py TABLE: MPI's variables before SLURM's)."""
    need(shutil.which("mpirun") is not None,
         "needs Open MPI's mpirun (Debian package openmpi-bin)")
    port = free_port()
    env = dict(slurm_cluster.env, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               MASTER_PORT=str(port))
    env.pop("DDPWATCH_DIR", None)
    # The suite's SLURM node is named dwnode, not this host's name, so Open MPI
    # would start its daemon "there" by an srun inside the step, which waits
    # for the CPU the step holds. Told not to use SLURM's allocation, mpirun
    # starts both ranks here, as it does on a cluster whose nodes are its hosts;
    # they inherit the step's variables all the same.
    mpirun = LAUNCH["mpirun"](port, os.path.join(THIRDPARTY, "mpirun_ddp.py"))
    mpirun[1:1] = ["--mca", "ras", "^slurm", "--mca", "plm", "^slurm"]
    job = Job(["srun", "-n", "1"] + mpirun, env, str(tmp_path / "srun-mpirun.log"))
    try:
        pids = wait_until(lambda: (lambda f: f if len(f) == 2 else None)(
            {int(r): int(p) for r, _, p in ANNOUNCE.findall(job.output())}),
            240, interval=0.5, what="mpirun's 2 ranks in the srun step")
        for pid in pids.values():  # what made both rank 0 before
            with open(f"/proc/{pid}/environ", "rb") as f:
                assert b"\0SLURM_PROCID=0\0" in b"\0" + f.read()
        tp = ThirdParty("mpirun", job, pids, str(tmp_path))
        report = tp.until("healthy", HEALTHY)
        _ranks_are_the_scripts_own(report, tp)
        assert {r["signals"]["rank_source"] for r in report["ranks"]} == {"launch"}
        assert report["job"]["launcher_kind"] == "mpirun"
        assert psutil.Process(report["job"]["launcher_pid"]).name() == "mpirun"
    finally:
        job.kill()
        slurm_cluster.cancel_all()


# opens no incident (judge/vocabulary.py `calm`: fine, or could not be judged yet,
# e.g. a child spawned a moment ago, idle, with no stack) or waits for its peers
ALARM_FREE = {v.name for v in VERDICTS if v.calm} | {"rendezvous_wait"}


# A rank still building its model while its peer idles in DDP's set-up collective
# was judged a straggler (straggler-cpu) in one window of the start: rules
# starting-ddp-setup.
@pytest.mark.parametrize("launcher", ["spawn"])
def test_a_starting_job_is_no_alarm(launcher, tmp_path, need_py_spy):
    """From launch until both ranks train, diagnose of the process a person sees
    (the script they started) finds no culprit, no victim, nothing but start-up;
    a rank called healthy is connected to its peers."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               MASTER_PORT=str(free_port()))
    env.pop("DDPWATCH_DIR", None)
    job = Job([sys.executable, os.path.join(THIRDPARTY, SCRIPTS[launcher])], env,
              str(tmp_path / f"{launcher}.log"))
    seen = []
    try:
        def trains():
            from diag import diagnose
            path = str(tmp_path / "snapshot.json")
            _, report = diagnose(job.proc.pid, "--window=0.5", "--save-snapshot", path)
            seen.append(report)
            for r in report["ranks"]:  # the start-up states, for replay
                name = f"thirdparty_{launcher}_{r['rule'].replace('-', '_')}.json"
                if (os.environ.get("DDPWATCH_SAVE_FIXTURES") == "1" and r["rule"] in (
                        "starting", "starting-alone", "starting-ddp-setup")
                        and not os.path.exists(os.path.join(SNAPSHOTS, name))):
                    shutil.copy(path, os.path.join(SNAPSHOTS, name))
            ranks = report["ranks"]
            return len(ranks) == 2 and all(r["verdict"] == "healthy" for r in ranks) and len(
                ANNOUNCE.findall(job.output())) == 2
        wait_until(trains, 240, interval=0.2, what=f"{launcher} training")
    finally:
        job.kill()
    for report in seen:
        assert report["job"]["culprits"] == [], report["job"]
        for r in report["ranks"]:
            assert r["verdict"] in ALARM_FREE and r["role"] == "none", r
            if r["verdict"] == "healthy":
                assert r["signals"].get("gloo_unconnected") == 0, r["signals"]
    assert len(seen) >= 2


# --- one shared job per launcher, last in the module: the last one lives until the
# module ends and must not load the machine under the tests above --------------
# Lightning's is started as nohup or setsid leave a job, its starter gone at once:
# none of the states below is an orphan (ThirdParty.until checks every report).
@pytest.fixture(scope="module", params=sorted(SCRIPTS))
def third(request, tmp_path_factory):
    tp = start(request.param, str(tmp_path_factory.mktemp(request.param)),
               detached=request.param == "lightning")
    yield tp
    tp.job.kill()


def test_healthy_without_heartbeats(third, need_py_spy):
    report = third.until("healthy", HEALTHY)
    _ranks_are_the_scripts_own(report, third)
    if third.launcher == "accelerate":  # torchrun's agent inside accelerate's process
        assert report["job"]["launcher_kind"] == "accelerate"
        assert report["job"]["launcher_pid"] == third.job.proc.pid
    assert report["job"]["culprits"] == []
    assert all(not r["findings"] for r in report["ranks"]), report["ranks"]


def test_stopped_rank_is_the_culprit_and_its_peer_a_victim(third, need_py_spy):
    os.kill(third.pids[1], signal.SIGSTOP)
    try:
        report = third.until("stopped", {1: ("stopped", "culprit"),
                                         0: ("blocked_in_collective", "victim")})
        assert report["job"]["culprits"] == [1]
    finally:
        os.kill(third.pids[1], signal.SIGCONT)
    third.until("resumed", HEALTHY)


def test_rank_stopped_most_of_the_time_is_a_straggler_not_stopped(third, need_py_spy):
    done = threading.Event()
    cycler = threading.Thread(target=_duty_cycle, args=(third.pids[1], 0.07, 0.03, done),
                              daemon=True)
    cycler.start()
    try:
        report = third.until("part_stopped", {1: ("straggler", "culprit"),
                                              0: ("waiting_on_peer", "victim")})
        assert by_rank(report)[1]["signals"]["stopped_share"] < 0.95
        assert report["job"]["culprits"] == [1]
    finally:
        done.set()
        cycler.join(timeout=5)
        os.kill(third.pids[1], signal.SIGCONT)
    third.until("resumed", HEALTHY)


def test_straggler_by_cgroup_cpu_quota(third, need_py_spy):
    version, root = _cgroup_dir()
    need(os.geteuid() == 0 and bool(version), "needs root and a CPU cgroup hierarchy")
    group = os.path.join(root, f"ddpwatch-test-{os.getpid()}-{third.launcher}")
    os.mkdir(group)
    pid = third.pids[1]
    try:
        if version == "v2":
            with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu")
            with open(os.path.join(group, "cpu.max"), "w") as f:
                f.write("10000 100000")
        else:
            with open(os.path.join(group, "cpu.cfs_period_us"), "w") as f:
                f.write("100000")
            with open(os.path.join(group, "cpu.cfs_quota_us"), "w") as f:
                f.write("10000")
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(pid))
        report = third.until("throttled", {1: ("straggler", "culprit"),
                                           0: ("waiting_on_peer", "victim")})
        assert by_rank(report)[1]["rule"] == "straggler-throttled"
        assert report["job"]["culprits"] == [1]
    finally:
        with open(os.path.join(root, "cgroup.procs"), "w") as f:
            f.write(str(pid))
        wait_until(lambda: removed_dir(group), 30, what=f"{group} removed")
    third.until("resumed", HEALTHY)
