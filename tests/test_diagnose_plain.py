"""diagnose on a plain DDP script (no ddpwatch import): stacks, CPU and sockets only."""
from __future__ import annotations

import os
import signal

import pytest

from conftest import REPO, torchrun
from diag import diagnose, launcher_pid, rank_pids, until_verdict, verdicts

PLAIN = os.path.join(REPO, "tests", "jobs", "plain_ddp.py")
pytestmark = pytest.mark.usefixtures("need_py_spy")


def test_healthy(start_job):
    job = start_job(torchrun(2, PLAIN))
    r0, r1 = rank_pids(job, 2)
    report = until_verdict(r0, {0: ("healthy", "none"), 1: ("healthy", "none")})
    assert report["job"]["verdict"] == "healthy" and report["job"]["culprits"] == []


def test_rank_hung_outside_collectives(start_job):
    job = start_job(torchrun(2, PLAIN, "--hang-rank=1", "--at-step=5"))
    r0, r1 = rank_pids(job, 2)
    report = until_verdict(launcher_pid(job), {0: ("blocked_in_collective", "victim"),
                                               1: ("hung_outside_collective", "culprit")})
    assert report["job"]["culprits"] == [1]
    assert "plain_ddp.py" in report["ranks"][1]["stack"]


def test_rank_stopped(start_job):
    job = start_job(torchrun(2, PLAIN))
    r0, r1 = rank_pids(job, 2)
    until_verdict(r0, {0: ("healthy", "none"), 1: ("healthy", "none")})
    os.kill(r1, signal.SIGSTOP)
    report = until_verdict(r0, {0: ("blocked_in_collective", "victim"), 1: ("stopped", "culprit")})
    assert report["job"]["verdict"] == "stopped" and report["job"]["culprits"] == [1]
    os.kill(r1, signal.SIGCONT)  # a stopped rank must not be left behind (the finalizer also does)
    until_verdict(r0, {0: ("healthy", "none"), 1: ("healthy", "none")})


def test_desync(start_job):
    job = start_job(torchrun(2, PLAIN, "--desync-rank=1", "--at-step=5"))
    r0, r1 = rank_pids(job, 2)
    report = until_verdict(r0, {0: ("desync", "victim"), 1: ("desync", "victim")})
    assert report["job"]["verdict"] == "desync"


def test_straggler_by_slowdown(start_job):
    job = start_job(torchrun(2, PLAIN, "--slow-rank=1", "--factor=6"))
    r0, r1 = rank_pids(job, 2)
    report = until_verdict(r0, {0: ("waiting_on_peer", "victim"), 1: ("straggler", "culprit")})
    assert report["job"]["culprits"] == [1]
