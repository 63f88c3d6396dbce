"""diagnose on a plain DDP script (no ddpwatch import): stacks, CPU and sockets only."""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from conftest import REPO, free_port, torchrun, wait_until
from crafted import watched_status
from diag import diagnose, env_rank, launcher_pid, rank_pids, until_verdict, verdicts

PLAIN = os.path.join(REPO, "tests", "jobs", "plain_ddp.py")
pytestmark = pytest.mark.usefixtures("need_py_spy")


HEALTHY = {0: ("healthy", "none"), 1: ("healthy", "none")}


def test_rank_hung_outside_collectives(start_job):
    job = start_job(torchrun(2, PLAIN, "--hang-rank=1", "--at-step=5"))
    r0, r1 = rank_pids(job, 2)
    report = until_verdict(launcher_pid(job), {0: ("blocked_in_collective", "victim"),
                                               1: ("hung_outside_collective", "culprit")})
    assert report["job"]["culprits"] == [1]
    assert "plain_ddp.py" in report["ranks"][1]["stack"]


def test_desync(start_job):
    job = start_job(torchrun(2, PLAIN, "--desync-rank=1", "--at-step=5"))
    r0, r1 = rank_pids(job, 2)
    # rank 1 waits in a broadcast, rank 0 in DDP's gradient all-reduce: the stacks
    # name the rank that left the common path (judge/signals/stack.py link)
    report = until_verdict(r0, {0: ("desync", "victim"), 1: ("desync", "culprit")})
    assert report["job"]["verdict"] == "desync" and report["job"]["culprits"] == [1]


def test_straggler_by_slowdown(start_job):
    job = start_job(torchrun(2, PLAIN, "--slow-rank=1", "--factor=6"))
    r0, r1 = rank_pids(job, 2)
    report = until_verdict(r0, {0: ("waiting_on_peer", "victim"), 1: ("straggler", "culprit")})
    assert report["job"]["culprits"] == [1]


def test_oversubscribed_threads(start_job):
    cores = os.cpu_count()
    job = start_job(torchrun(2, PLAIN), env={"OMP_NUM_THREADS": str(cores * 2)})
    r0, r1 = rank_pids(job, 2)
    _, report = diagnose(r0)
    for rank in report["ranks"]:
        assert "oversubscribed" in [f["id"] for f in rank["findings"]], rank


def test_bare_env_rendezvous_process_waits_for_its_peer(start_job):
    job = start_job([sys.executable, PLAIN], env=env_rank(free_port(), 0))
    pid = job.proc.pid
    report = until_verdict(pid, {0: ("rendezvous_wait", "none")})
    assert report["job"]["verdict"] == "rendezvous_wait"
    assert not report["ranks"][0]["findings"]


def test_torchrun_agent_alone_at_rendezvous(start_job):
    port = free_port()
    job = start_job([sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                     "--nproc_per_node=1", "--rdzv-backend=c10d",
                     f"--rdzv-endpoint=127.0.0.1:{port}", PLAIN])
    report = until_verdict(job.proc.pid, {-1: ("rendezvous_wait", "none")})
    assert report["job"]["verdict"] == "rendezvous_wait"
    assert report["ranks"][0]["pid"] == job.proc.pid  # the agent itself is judged


def test_orphan_rank_holding_the_master_port(start_job):
    port = free_port()
    # The shell starts rank 0 in the background and exits: rank 0 is re-parented,
    # as a leftover of an earlier launch is, and it holds the TCPStore port.
    shell = start_job(["sh", "-c", f'"{sys.executable}" "{PLAIN}" & echo $!'],
                      env=env_rank(port, 0), name="orphan")
    assert shell.wait(30) == 0
    pid = int(wait_until(lambda: shell.output().strip(), 30, what="orphan pid"))
    report = until_verdict(pid, {0: ("rendezvous_wait", "none")})
    findings = {f["id"]: f for f in report["ranks"][0]["findings"]}
    assert "orphan" in findings and "True" in findings["orphan"]["evidence"]



def test_compile_is_warm_up_not_a_hang(start_job, tmp_path):
    # A fresh inductor cache, so the job really compiles while it is diagnosed.
    job = start_job(torchrun(2, PLAIN, "--compile", "--layers=60"),
                    env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    r0, r1 = rank_pids(job, 2)
    # from DDP's set-up on (before it, a rank importing torch looks busy, not compiling)
    wait_until(lambda: job.output().count("ready") >= 2, 120, interval=0.05, what="DDP set up")
    seen = []

    def trained():
        window = tmp_path / f"window{len(seen)}.json"
        _, report = diagnose(r0, "--save-snapshot", str(window))
        seen.append((report, window))
        return all(r["verdict"] == "healthy" for r in report["ranks"]) and len(report["ranks"]) == 2
    wait_until(trained, 240, interval=0.1, what="the compiled job training")
    # while it compiled, nobody was blamed and nothing was called a hang
    assert any(r["verdict"] == "warming_up" for report, _ in seen for r in report["ranks"]), [
        {r["rank"]: (r["rule"], r["signals"].get("stack")) for r in rep["ranks"]}
        for rep, _ in seen]
    for report, _ in seen:
        assert report["job"]["culprits"] == [], report["job"]
        assert not {r["verdict"] for r in report["ranks"]} & {
            "blocked_in_collective", "hung_outside_collective", "desync", "stopped"}
    # the daemon's /status says the same of each window that compiled: its watch adds
    # only the job's past (tests/unit/watch/test_compile_agreement_unit.py)
    compiled = [(report, window) for report, window in seen
                if any(r["signals"].get("stack") == "compile" for r in report["ranks"])]
    assert compiled
    for report, window in compiled:
        status = watched_status(str(window))
        assert [(r["rank"], r["verdict"], r["rule"]) for r in status["ranks"]] == [
            (r["rank"], r["verdict"], r["rule"]) for r in report["ranks"]]
        assert status["job"]["verdict"] == report["job"]["verdict"]


def test_killed_rank_on_the_same_host(start_job):
    """No heartbeats and no torchrun: when rank 1 is killed, the kernel resets its
    sockets and Gloo fails rank 0 within a second or two. While rank 0 still exists,
    the only trace of rank 1 is its absence from an all-local job: diagnose names
    it dead and rank 0 its victim."""
    seen = []
    for attempt in range(4):
        port = free_port()
        jobs = [start_job([sys.executable, PLAIN], env=env_rank(port, r), name=f"r{r}")
                for r in (0, 1)]
        r0, r1 = (j.proc.pid for j in jobs)
        wait_until(lambda: all("ready" in j.output() for j in jobs), 120, interval=0.05,
                   what="both ranks set up")
        os.kill(r1, signal.SIGKILL)
        deadline = time.monotonic() + 120  # rank 0 may stay at rendezvous: never for ever
        while jobs[0].proc.poll() is None and time.monotonic() < deadline:
            try:
                code, report = diagnose(r0, "--window=0.3", "--no-stacks")
            except AssertionError:  # exit 69: rank 0 went away while being looked at
                break
            if verdicts(report).get(1, ("",))[0] == "dead":
                seen.append(report)
        if seen:
            break
    else:
        pytest.fail("rank 0 never outlived rank 1 long enough to be diagnosed")
    for report in seen:
        assert verdicts(report) == {0: ("blocked_in_collective", "victim"),
                                    1: ("dead", "culprit")}
        assert report["job"]["culprits"] == [1] and report["job"]["verdict"] == "dead"


# --- one shared job, last in the module: it lives until the module ends, and
# must not load the machine under the tests above ---------------------------------
@pytest.fixture(scope="module")
def plain(start_module_job):
    """One healthy job for the states that are undone after (stopped).
    The script parses --dtype and never uses it: nothing computes in bf16."""
    job = start_module_job(torchrun(2, PLAIN, "--dtype=bfloat16"))
    return rank_pids(job, 2)


def test_healthy_and_a_bf16_flag_with_no_effect_is_no_finding(plain):
    # a flag alone is no evidence (heartbeat dtype or bf16 kernels would be)
    report = until_verdict(plain[0], HEALTHY)
    assert report["job"]["verdict"] == "healthy" and report["job"]["culprits"] == []
    assert all(not r["findings"] for r in report["ranks"])


def test_rank_stopped(plain):
    r0, r1 = plain
    until_verdict(r0, HEALTHY)
    os.kill(r1, signal.SIGSTOP)
    try:
        report = until_verdict(r0, {0: ("blocked_in_collective", "victim"),
                                    1: ("stopped", "culprit")})
        assert report["job"]["verdict"] == "stopped" and report["job"]["culprits"] == [1]
    finally:
        os.kill(r1, signal.SIGCONT)  # a stopped rank must not be left behind
    until_verdict(r0, HEALTHY)
