"""`ddpwatch diagnose` with no pid, on a node that holds a healthy torchrun job, an
mp.spawn job with a stopped rank, a lone Python script and a job of uid 65534. The jobs are
shared by the module's tests (each leaves them as it found them). Other
people's jobs may run on the node too: the assertions are about these jobs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

import otheruser
import thirdparty_jobs
from conftest import REPO, Job, free_port, need, torchrun, wait_until
from diag import rank_pids, until_verdict

PLAIN = os.path.join(REPO, "tests", "jobs", "plain_ddp.py")
SPAWN = os.path.join(REPO, "tests", "jobs", "thirdparty", "spawn_ddp.py")
NOBODY = otheruser.NOBODY
pytestmark = pytest.mark.usefixtures("need_py_spy")


def node_diagnose(*extra: str, argv=None) -> tuple[int, str, str]:
    """`ddpwatch diagnose` without a pid (as root, or through `argv`)."""
    argv = argv or [sys.executable, "-m", "ddpwatch"]
    out = subprocess.run([*argv, "diagnose", *extra], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=REPO), timeout=180, cwd="/")
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, out.stdout, out.stderr


def job_holding(doc: dict, pid: int) -> dict | None:
    return next((j for j in doc["jobs"] if any(r["pid"] == pid for r in j.get("ranks", ()))),
                None)


@pytest.fixture(scope="module")
def node(tmp_path_factory, start_module_job):
    tmp = str(tmp_path_factory.mktemp("node"))
    healthy = start_module_job(torchrun(2, PLAIN), name="healthy")
    healthy_ranks = rank_pids(healthy, 2)
    stopped = thirdparty_jobs.start("spawn", tmp)
    lone = start_module_job([sys.executable, "-c", "import time; time.sleep(3600)"],
                            name="lone")
    runtime = otheruser.runtime()
    # uid 65534's own job: mp.spawn, rank 0 hung so both idle. mp.spawn execs
    # the parent's interpreter again: the system's, which that user can run (a
    # checkout's venv may point into /root), with torch from our site-packages
    port = free_port()
    site = next(p for p in sys.path if p.endswith("site-packages") and os.path.isdir(
        os.path.join(p, "torch")))
    need(os.path.isfile(otheruser.SYSTEM_PYTHON), f"needs {otheruser.SYSTEM_PYTHON}")
    # the checkout may sit in a 0700 directory (tests/deploy/test_clone_anywhere.py):
    # the user runs copies of the job's scripts, and torch through a read-only view
    scripts = otheruser.copy_readable(SPAWN, os.path.join(os.path.dirname(SPAWN), "faults.py"))
    # started in the copies' directory: mp.spawn's children chdir to their parent's
    # working directory, which the checkout's would refuse them
    theirs = Job(otheruser.as_user(NOBODY, "env", "-C", scripts, otheruser.SYSTEM_PYTHON, "-s",
                                   os.path.join(scripts, os.path.basename(SPAWN))),
                 dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", HOME="/tmp",
                      MASTER_PORT=str(port), PYTHONPATH=os.pathsep.join(
                          [scripts, otheruser.view_of(site)]),
                      DDPWATCH_TEST_FAULT="hang:0:2"),
                 os.path.join(tmp, "nobody.log"))
    try:
        def announced():
            found = {int(r): int(p) for r, _, p in
                     thirdparty_jobs.ANNOUNCE.findall(theirs.output())}
            return found if len(found) == 2 else None
        pids = wait_until(announced, 240, interval=0.5, what="uid 65534's 2 ranks")
        until_verdict(healthy_ranks[0], {0: ("healthy", "none"), 1: ("healthy", "none")})
        os.kill(stopped.pids[1], signal.SIGSTOP)
        wait_until(lambda: psutil.Process(stopped.pids[1]).status() == psutil.STATUS_STOPPED,
                   10, what="rank 1 stopped")
        yield {"healthy": healthy_ranks, "stopped": stopped.pids, "lone": lone.proc.pid,
               "theirs": pids, "runtime": runtime}
    finally:
        stopped.job.kill()
        theirs.kill()


def until_both_judged(node, *extra):
    """Diagnose the node until the stopped job shows its culprit and the healthy
    one is healthy (the healthy job may stall a tick on 2 busy cores)."""
    last = {}

    def judged():
        nonlocal last
        code, out, _ = node_diagnose("--json", *extra)
        last = json.loads(out)
        stopped = job_holding(last, node["stopped"][1])
        healthy = job_holding(last, node["healthy"][0])
        if stopped and healthy and stopped["job"]["culprits"] == [1] \
                and healthy["job"]["verdict"] == "healthy":
            return code, last
        return None
    try:
        return wait_until(judged, 150, interval=1.0, what="both jobs judged")
    except BaseException:
        print(json.dumps(last, indent=1)[:5000])
        raise


def test_node_names_the_stopped_job_first_and_omits_the_lone_script(node):
    code, doc = until_both_judged(node)
    assert code == 1
    stopped, healthy = job_holding(doc, node["stopped"][1]), job_holding(doc, node["healthy"][0])
    assert stopped["job"]["verdict"] == "stopped"
    ranks = {r["rank"]: r for r in stopped["ranks"]}
    assert ranks[1]["verdict"] == "stopped" and ranks[1]["role"] == "culprit"
    keys = [j["key"] for j in doc["jobs"]]
    assert keys.index(stopped["key"]) < keys.index(healthy["key"])
    # the same jobs as `diagnose <pid> --json` shows each
    assert {"job", "ranks", "probes", "stacks"} <= stopped.keys()
    assert stopped["stacks"] == {"read": True}
    assert job_holding(doc, node["lone"]) is None
    # as a person reads it: the stopped job's block, the healthy one's line
    code, text, _ = node_diagnose()
    assert code == 1, text
    block = text.index(f"=== job {stopped['key']} ===")
    line = text.index(f"ok    {healthy['key']}: HEALTHY, 2 rank(s)")
    assert block < line, text
    assert "culprit: rank 1" in text[block:text.index("\n\n", block + 1) + 200]
    assert f"pid {node['lone']} " not in text


def test_all_says_why_the_lone_script_is_no_rank(node):
    code, out, _ = node_diagnose("--json", "--all")
    seen = {s["pid"]: s for s in json.loads(out)["seen"]}
    assert "no rank variables" in seen[node["lone"]]["why"], seen.get(node["lone"])
    for pid in node["healthy"] + list(node["stopped"].values()):
        assert pid not in seen


def test_another_user_sees_only_its_own_job(node):
    """uid 65534 sees its own job only and is told that the others need root."""
    argv = otheruser.as_user(NOBODY, *node["runtime"].argv("-m", "ddpwatch"))
    theirs = node["theirs"]

    def seen():
        code, out, err = node_diagnose("--json", argv=argv)
        assert code in (0, 1), err
        doc = json.loads(out)
        return doc if job_holding(doc, theirs[0]) else None
    doc = wait_until(seen, 120, interval=1.0, what="uid 65534's job in its diagnose")
    for job in doc["jobs"]:  # its own only (other tests' uid 65534 jobs may run too)
        assert all(psutil.Process(r["pid"]).uids().effective == NOBODY
                   for r in job["ranks"]), job["ranks"]
    assert job_holding(doc, node["healthy"][0]) is None
    assert job_holding(doc, node["stopped"][0]) is None
    assert doc["others_hidden"] and "root" in doc["note"]
    assert job_holding(doc, theirs[0])["stacks"] == {"read": True}  # its own: no Yama here
    code, text, _ = node_diagnose(argv=argv)
    assert "other users' jobs need root (run it as root: sudo ddpwatch diagnose)" in text
    assert f"pid {node['healthy'][0]}" not in text


def test_without_cap_sys_ptrace_the_job_is_judged_without_stacks(node):
    """Root without CAP_SYS_PTRACE (a container started without it) may not attach
    to root's ranks that hold it (security/commoncap.c: a target's capabilities
    must be the caller's; py-spy then fails "Failed to get process executable
    name ... Permission denied"): the job is judged without stacks, every rank's
    evidence says so, and the missing evidence and its remedy are said once.
    (A rank's prctl(PR_SET_DUMPABLE, 0) was tried here too: this sandbox's root
    without the capability still read its environ, so the unit tests cover it.)"""
    argv = ["setpriv", "--bounding-set=-sys_ptrace", sys.executable, "-m", "ddpwatch"]
    stopped = node["stopped"]

    def judged():
        code, out, err = node_diagnose("--json", argv=argv)
        assert code in (0, 1), err
        doc = json.loads(out)
        job = job_holding(doc, stopped[0])
        return (doc, job) if job and job["job"]["culprits"] == [1] else None
    doc, job = wait_until(judged, 120, interval=1.0, what="the stopped job, without stacks")
    assert job["stacks"]["read"] is False
    assert "--cap-add=SYS_PTRACE" in job["stacks"]["remedy"]
    assert all(r["evidence"].endswith("(judged without stacks)") for r in job["ranks"])
    assert all(not r["stack"] for r in job["ranks"])
    assert doc["others_hidden"]  # other users' jobs: CAP_SYS_PTRACE too
    code, text, _ = node_diagnose(argv=argv)
    assert code == 1
    for pid in stopped.values():
        assert f"pid {pid} holds capabilities this process lacks" in job["stacks"]["missing"]
    line = "judged without stacks: pid "
    assert text.count(line) == 1, text
    assert "--cap-add=SYS_PTRACE" in text[text.index(line):]
