"""The second hostile review, for real: an unprivileged user (uid 65534, via
setpriv) against a real `python -m ddpwatch run` as root on loopback. Each test
asserts the daemon lives, stays within its memory, still judges the real job
beside the attack, reads no root file and prints no traceback."""
from __future__ import annotations

import os
import signal
import subprocess

import psutil

from conftest import JOB_TAG, need, wait_until
from test_daemon import DaemonRun, get, our_status, rank_pid, trainer_job
from test_hostile_surface import (NOBODY, as_nobody, job_with, need_root, no_traceback,
                                  keeps_ticking, shared_dir)  # noqa: F401 (a fixture)

PYTHON = "/usr/bin/python3"  # the venv's interpreter is out of uid 65534's reach

# --- memory: command lines of any size ---------------------------------------------

HOGS = 25
ARG = 128 * 1024 - 1  # the kernel's MAX_ARG_STRLEN: one argument is at most 32 pages
ARGS_PER_HOG = 32     # 4 MiB of argv each
ENV_PER_HOG = 8       # and 1 MiB of environment for the ones named like Python
# What the attack may add to the daemon's peak RSS. The old daemon kept every
# command line whole (about 1:1): 25 x 4 MiB = +100 MiB; bounded reads keep a
# few KiB of each.
RSS_BUDGET = 30 * 2**20

# The hog raises its own stack limit (the soft one, up to the hard one: any user
# may), which raises the kernel's limit on argv + environment (a quarter of it,
# at most 6 MiB: fs/exec.c bprm_stack_limits), then execs a shell
# that sleeps with 4 MiB of arguments. `; :` keeps the shell from exec'ing sleep
# (the big argv stays in the sleeping process). Every fifth one calls itself
# python3, so the daemon reads its environment too.
HOG = r"""
import os, resource, sys
i = int(sys.argv[1])
_, hard = resource.getrlimit(resource.RLIMIT_STACK)
resource.setrlimit(resource.RLIMIT_STACK, (hard, hard))
big = "A" * %d
env = {"PATH": "/usr/bin:/bin", "%s": os.environ["%s"]}  # the test's tag: its processes
argv0 = "sh"
if i %% 5 == 0:
    argv0 = "python3"
    env.update({f"PAD{n}": big[:-8] for n in range(%d)})  # "PADn=" within the 32 pages
os.execve("/bin/sh", [argv0, "-c", "sleep 600; :", "x"] + [big] * %d, env)
""" % (ARG, JOB_TAG, JOB_TAG, ENV_PER_HOG, ARGS_PER_HOG)


def hwm(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def cmdline_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return len(f.read())
    except OSError:
        return 0


def test_command_lines_of_megabytes_leave_the_daemon_within_its_memory(
        start_job, tmp_path, hb_dir, need_py_spy):
    need_root()
    need(os.access(PYTHON, os.X_OK), f"{PYTHON} missing")
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"resolve_after_s": 2})
    trainer = trainer_job(start_job)
    healthy = wait_until(lambda: (lambda s: s if len(s["ranks"]) == 2 and s["job"]["verdict"]
                                  == "healthy" else None)(our_status(daemon, trainer)), 240,
                         what="healthy job")
    daemon_pid = daemon.job.proc.pid
    keeps_ticking(daemon)
    before = hwm(daemon_pid)

    hogs = [start_job(as_nobody(PYTHON, "-c", HOG, str(i)), name=f"hog{i}") for i in range(HOGS)]

    def hogs_up():
        sizes = [cmdline_bytes(p.pid) for h in hogs for p in h.processes()]
        return len([s for s in sizes if s > ARGS_PER_HOG * ARG]) == HOGS
    wait_until(hogs_up, 60, what=f"{HOGS} sleeping shells with 4 MiB of argv each")
    # the daemon's tables, its cache (after CACHE_AFTER_S) and a page over them
    ticks = daemon.status()["tick"]
    wait_until(lambda: daemon.status()["tick"] >= ticks + 6, 60, what="six ticks over the hogs")
    get(daemon.url + "/status")

    # it still judges the real job: rank 1 stopped is an incident naming it
    os.kill(rank_pid(healthy, 1), signal.SIGSTOP)
    incident = wait_until(lambda: next((i for i in daemon.status()["incidents"]
                                        if i["job"] == healthy["key"]
                                        and i["state"] != "resolved"), None), 90,
                          what="the real job's incident beside the hogs")
    assert incident["culprits"] == [1]
    grown = hwm(daemon_pid) - before
    print(f"\ndaemon peak RSS {before >> 20} MiB before, +{grown >> 20} MiB with {HOGS} hogs")
    assert grown < RSS_BUDGET, f"daemon's peak RSS grew {grown >> 20} MiB beside the hogs"
    assert daemon.job.proc.poll() is None
    no_traceback(daemon)


# --- files seen through a rank's root ------------------------------------------------

MARKER = "ROOT-ONLY-MARKER-6f1c"
SECRET_ADDR = "10.213.37.99"  # what root's file would give the node, were it read
SITS = "import time; print('ready', flush=True); time.sleep(3600)"


def rank_over(start_job, shared_dir, source: str, name: str):
    """A fake rank of uid 65534 in its own user and mount namespaces, with `source`
    bind-mounted over its /etc/hosts (a user can bind-mount what it can name,
    readable or not)."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29999", "TORCHELASTIC_RUN_ID": name, "HOME": shared_dir}
    job = start_job(as_nobody("unshare", "-Urm", "sh", "-c",
                              'mount --bind "$0" /etc/hosts && exec "$@"', source,
                              PYTHON, "-c", SITS), env=env, name=name)
    wait_until(lambda: "ready" in job.output(), 60, what=f"{name} up")
    pid = next(p.pid for p in job.processes() if "python" in p.name())
    assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    return pid


def unseen_of(daemon, pid: int) -> str:
    job = job_with(daemon.status(), pid)
    rank = next((r for r in job["ranks"] if r["pid"] == pid), None) if job else None
    return (rank or {}).get("signals", {}).get("ns_unseen") or ""


def test_a_fifo_or_roots_file_over_a_ranks_hosts_is_neither_waited_on_nor_read(
        start_job, tmp_path, hb_dir, shared_dir):
    need_root()
    need(subprocess.run(as_nobody("unshare", "-Urm", "true")).returncode == 0,
         "uid 65534 cannot make a user namespace here (unshare -Urm)")
    secret = os.path.join(shared_dir, "secret")
    with open(secret, "w") as f:
        f.write(f"{SECRET_ADDR} {os.uname().nodename}\n# {MARKER}\n")
    os.chmod(secret, 0o600)  # root's alone, as /etc/shadow
    fifo = os.path.join(shared_dir, "fifo")
    os.mkfifo(fifo)
    os.chmod(fifo, 0o666)  # readable by anyone: only its kind refuses it
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"tick_s": 0.5, "resolve_after_s": 2})
    on_fifo = rank_over(start_job, shared_dir, fifo, "on-fifo")
    on_secret = rank_over(start_job, shared_dir, secret, "on-secret")

    # the probe looked at both, and refused both for what they are
    assert "not a regular file" in wait_until(lambda: unseen_of(daemon, on_fifo), 60,
                                              what="the FIFO rank's hosts view")
    assert "not readable by the process's own user" in wait_until(
        lambda: unseen_of(daemon, on_secret), 60, what="the secret rank's hosts view")
    keeps_ticking(daemon)  # never blocked on the FIFO
    # what anyone may see of the daemon: no byte of root's file
    wait_until(lambda: any(i["bundle"] for i in daemon.status()["incidents"]), 60,
               what="a bundle of the fake ranks' incidents")
    for path in ("/status", "/metrics", "/peer", "/incidents"):
        body = get(daemon.url + path)[1].decode("utf-8", "replace")
        assert MARKER not in body and SECRET_ADDR not in body, path
    for d, _, files in os.walk(daemon.state_dir):
        for name in files:
            with open(os.path.join(d, name), "rb") as f:
                data = f.read()
            assert MARKER.encode() not in data and SECRET_ADDR.encode() not in data, name
    assert daemon.job.proc.poll() is None
    no_traceback(daemon)
