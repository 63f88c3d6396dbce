"""The second hostile review, for real: an unprivileged user (uid 65534, via
setpriv) against a real `python -m ddpwatch run` as root on loopback. Each test
asserts the daemon lives, stays within its memory, still judges the real job
beside the attack, reads no root file and prints no traceback."""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import time

import psutil

from attacker import NOBODY, as_nobody, job_with, need_root, no_traceback, keeps_ticking
from conftest import JOB_TAG, REPO, need, wait_until
from conftest import trainer as trainer_argv
from daemons import DaemonRun, get, our_status, rank_pid, trainer_job, with_heartbeats

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
# a fake rank holds a TCP socket, as a rank's store or peers are: a claim alone
# opens no incident (publish/limits.py shows_a_job), and this test reads a bundle
SITS = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        "print('ready', flush=True); time.sleep(3600)")


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
    # `sudo ddpwatch diagnose` reads through the rank's root as the daemon does: a
    # device over its hosts is not opened, the FIFO not waited on, root's file not read
    on_device = rank_over(start_job, shared_dir, "/dev/null", "on-device")
    for pid, why in ((on_fifo, "not a regular file"), (on_device, "not a regular file"),
                     (on_secret, "not readable by the process's own user")):
        done = subprocess.run([sys.executable, "-m", "ddpwatch", "diagnose", "--json",
                               "--no-stacks", str(pid)], capture_output=True, text=True,
                              timeout=120, cwd=REPO, stdin=subprocess.DEVNULL)
        assert done.returncode in (0, 1), (done.returncode, done.stderr[-2000:])
        assert MARKER not in done.stdout + done.stderr and SECRET_ADDR not in done.stdout
        rank = next(r for r in json.loads(done.stdout)["ranks"] if r["pid"] == pid)
        assert why in (rank["signals"].get("ns_unseen") or ""), rank["signals"]


# --- crowding the record directories, and a set-uid child of a fake launcher ---------

CROWD = 70  # more than the old global cap of 64 named directories

# uid 65534's processes that each name a record directory of their own, started
# before the victim's job, so they come first in pid order; and a fake torchrun
# (its argv says so) whose child is a set-uid-root program that lingers.
CROWDER = r"""
import os, sys, time
base, count, suid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tag = os.environ["%s"]  # the test's tag: its finalizer kills every one of these
for i in range(count):
    d = os.path.join(base, f"d{i}")
    os.mkdir(d, 0o700)
    env = {"PATH": "/usr/bin:/bin", "DDPWATCH_DIR": d, "%s": tag}
    os.posix_spawn("/usr/bin/python3", ["python3", "-I", "-c", "import time; time.sleep(600)"],
                   env)
launcher = os.path.join(base, "torchrun")
with open(launcher, "w") as f:
    f.write("import os, sys, time\n"
            "os.posix_spawn(sys.argv[-1], [sys.argv[-1], '600'], dict(os.environ, RANK='0', "
            "LOCAL_RANK='0', WORLD_SIZE='1', MASTER_ADDR='127.0.0.1', MASTER_PORT='29999'))\n"
            "time.sleep(600)\n")
os.posix_spawn("/usr/bin/python3", ["python3", "-I", launcher, "--nproc_per_node=1",
                                    "train.py", suid], {"PATH": "/usr/bin:/bin", "%s": tag})
print("crowded", flush=True)
time.sleep(600)
""" % (JOB_TAG, JOB_TAG, JOB_TAG)


def test_a_users_crowd_of_record_directories_and_a_setuid_child_neither_hide_nor_join(
        start_job, tmp_path, hb_dir, shared_dir):
    """Before: 64 processes of one user, each naming a record directory of its own,
    filled the daemon's cap, and another user's records went unread; and a fake
    launcher's set-uid-root child became a rank of the user's job, so root's
    process was read and dumped with the daemon's privileges."""
    need_root()
    need(os.access(PYTHON, os.X_OK), f"{PYTHON} missing")
    base = os.path.join(shared_dir, "crowd")
    os.mkdir(base, 0o755)
    os.chown(base, NOBODY, NOBODY)
    suid = os.path.join(shared_dir, "suid-sleep")  # what su or sudo is while it waits
    shutil.copy("/usr/bin/sleep", suid)
    os.chmod(suid, 0o4755)
    # (start_job would hand the crowd the victim's DDPWATCH_DIR: it names none)
    crowd = start_job(as_nobody(PYTHON, "-I", "-c", CROWDER, base, str(CROWD), suid),
                      name="crowd", env={"DDPWATCH_DIR": ""})
    wait_until(lambda: "crowded" in crowd.output(), 60, what="the crowd started")
    tag = crowd.tag
    setuid_child = wait_until(lambda: next(
        (p.pid for p in psutil.process_iter(["exe", "uids"])
         if p.info["exe"] == suid and p.info["uids"].effective == 0), None), 30,
        what="the set-uid child running as root")
    # the victim: root's trainer, its records in a directory of its own, named only
    # by its ranks' DDPWATCH_DIR (the daemon is given none)
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"tick_s": 0.5}, env={"DDPWATCH_DIR": ""})
    trainer = trainer_job(start_job)
    read = wait_until(lambda: with_heartbeats(our_status(daemon, trainer)), 120,
                      what="the victim's records read beside the crowd")
    assert len(read["ranks"]) == 2
    status = daemon.status()
    assert not any(r["pid"] == setuid_child for j in status["jobs"] for r in j["ranks"]), \
        [j["ranks"] for j in status["jobs"]]
    assert len([p for p in psutil.process_iter(["environ"])
                if (p.info["environ"] or {}).get(JOB_TAG) == tag]) >= CROWD
    keeps_ticking(daemon)
    no_traceback(daemon)


# --- cost: ranks in namespaces of their own, and ranks of 20 000 files, 4 000 threads --

NS_RANKS = 12
# A fake rank of uid 65534 in a user and network namespace of its own, with a
# listening socket: its namespace's socket table is then worth reading, and each
# read walks the kernel's whole connection hash (observe/budget.py).
NS_RANK = r"""
import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print("ready", flush=True)
time.sleep(600)
"""
# One more, as heavy as a user can make one process: 20 000 open files (or as
# many as the hard limit allows), 4 000 threads, and 20 000 addresses in its namespace.
HEAVY_RANK = r"""
import os, socket, subprocess, sys, threading, time
ip = next(p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip") if os.path.exists(p))
subprocess.run([ip, "link", "set", "lo", "up"], check=True)
batch = "\n".join(f"addr add 10.{i >> 16}.{(i >> 8) & 255}.{i & 255}/32 dev lo"
                  for i in range(20000))
subprocess.run([ip, "-batch", "-"], input=batch.encode(), check=True)
fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(int(sys.argv[1]))]
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
threading.stack_size(65536)
for _ in range(4000):
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
print("ready", flush=True)
time.sleep(600)
"""


def tick_durations(daemon, seconds: float) -> list[float]:
    """ddpwatch_tick_duration_seconds of each tick seen over `seconds`."""
    seen, last = [], None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        text = daemon.metrics()
        tick = metric_value(text, "ddpwatch_ticks_total")
        if tick is not None and tick != last:
            last = tick
            seen.append(metric_value(text, "ddpwatch_tick_duration_seconds"))
        time.sleep(0.1)
    return [s for s in seen if s is not None]


def metric_value(text: str, name: str, **labels) -> float | None:
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
                   if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_ranks_in_namespaces_and_heavy_ranks_cost_the_tick_a_bounded_amount(
        start_job, tmp_path, hb_dir, need_py_spy):
    """Before: 12 such ranks took the tick from ~10 ms to 550 ms here (the
    issue measured 300-420 ms), and with the heavy rank beside them to a
    median of 3.2 s (6 s at worst: py-spy over 4 000 threads, psutil over 20 000
    addresses, every thread read ten times a second). Now each user gets a
    budget a pass (observe/budget.py), what it left out is counted, and the
    same attack costs the tick about 0.2 s here."""
    need_root()
    need(os.access(PYTHON, os.X_OK), f"{PYTHON} missing")
    need(subprocess.run(as_nobody("unshare", "-Urn", "true")).returncode == 0,
         "uid 65534 cannot make a user and network namespace here (unshare -Urn)")
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"tick_s": 1.0, "resolve_after_s": 2})
    trainer = trainer_job(start_job)
    healthy = wait_until(lambda: (lambda s: s if len(s["ranks"]) == 2 and s["job"]["verdict"]
                                  == "healthy" else None)(our_status(daemon, trainer)), 240,
                         what="healthy job")
    before = statistics.median(tick_durations(daemon, 6))
    rss_before = hwm(daemon.job.proc.pid)
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "DDPWATCH_DIR": ""}
    fakes = [start_job(as_nobody("unshare", "-Urn", PYTHON, "-I", "-c", NS_RANK),
                       env=dict(env, MASTER_PORT=str(21000 + i)), name=f"ns-rank{i}")
             for i in range(NS_RANKS)]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    files = min(20000, hard) - 100  # well past the probe's cap (budget.MAX_FDS) either way
    heavy = start_job(as_nobody("unshare", "-Urn", PYTHON, "-I", "-c", HEAVY_RANK, str(files),
                                nofile=min(hard, 20000)), env=dict(env, MASTER_PORT="21999"),
                      name="heavy-rank")
    for job in [*fakes, heavy]:
        wait_until(lambda: "ready" in job.output(), 120, what="the fake ranks up")
    wait_until(lambda: len(daemon.status()["jobs"]) > 1, 60, what="the fakes seen")
    during = tick_durations(daemon, 10)
    metrics = daemon.metrics()
    left = {w: metric_value(metrics, "ddpwatch_left_out_total", what=w)
            for w in ("fds", "threads", "helper_runs")}
    print(f"\ntick median {before * 1000:.0f} ms before, {statistics.median(during) * 1000:.0f} "
          f"ms (max {max(during) * 1000:.0f}) beside {NS_RANKS} namespaced ranks and a heavy "
          f"one; left out {left}")
    # the old daemon's 3.2 s median was 3.2 s over its ~20 ms; the bound allows 1 s
    assert statistics.median(during) < before + 1.0, during
    assert all(n and n > 0 for n in left.values()), left
    assert hwm(daemon.job.proc.pid) - rss_before < RSS_BUDGET
    # it still judges the real job: rank 1 stopped is an incident naming it
    os.kill(rank_pid(healthy, 1), signal.SIGSTOP)
    incident = wait_until(lambda: next((i for i in daemon.status()["incidents"]
                                        if i["job"] == healthy["key"]
                                        and i["state"] != "resolved"), None), 90,
                          what="the real job's incident beside the fakes")
    assert incident["culprits"] == [1]
    no_traceback(daemon)


# --- a fork and exit flood against the exits probe ---------------------------------

FORKER = r"""
import os, sys, time
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    n += 1
print("forked", n, flush=True)
"""


def test_a_fork_and_exit_flood_leaves_a_ranks_death_told_by_how_it_ended(
        start_job, tmp_path, hb_dir, receivers):
    """Any user can fork and exit thousands of times a second, and every exit is
    an event on the daemon's process-events socket (observe/probes/exits.py):
    the kernel filter, the drain's bound and the pids kept must still let the
    real job's SIGKILLed rank be told apart, by how it ended."""
    need_root()
    need(os.access(PYTHON, os.X_OK), f"{PYTHON} missing")
    hook = receivers()
    daemon = DaemonRun(start_job, tmp_path, hb_dir,
                       {"webhooks": [{"type": "generic", "url": hook.url}],
                        "resolve_after_s": 600})
    need(metric_value(daemon.metrics(), "ddpwatch_probe_success", probe="exits") == 1.0,
         "the exits probe cannot listen here (no process-events connector)")
    trainer = trainer_job(start_job)
    healthy = wait_until(lambda: (lambda s: s if len(s["ranks"]) == 2 and s["job"]["verdict"]
                                  == "healthy" else None)(our_status(daemon, trainer)), 240,
                         what="healthy job")
    forkers = [start_job(as_nobody(PYTHON, "-I", "-c", FORKER, "40"), name=f"forker{i}")
               for i in range(2)]
    wait_until(lambda: all(f.processes() for f in forkers), 30, what="the forkers running")
    os.kill(rank_pid(healthy, 1), signal.SIGKILL)
    firing = wait_until(lambda: [b for b in hook.bodies() if b["status"] == "firing"
                                 and b["job"] == healthy["key"] and b["verdict"] == "dead"],
                        60, what="the killed rank paged beside the flood")
    assert firing[-1]["culprits"] == [1]
    assert "was killed by SIGKILL" in firing[-1]["summary"], firing[-1]
    assert all(f.proc.poll() is None for f in forkers)  # the flood went on throughout
    no_traceback(daemon)


# --- /dev/shm/ddpwatch planted by a user before root's job writes there -------------

SHM_PARENT = "/dev/shm/ddpwatch"


def private_shm(start_job):
    """A mount namespace whose /dev/shm is an empty tmpfs of its own, held by a
    sleeping process, and what starts a command in it (nsenter: the command
    keeps its pid). The test plants /dev/shm/ddpwatch there, never on the
    machine, where a real one may be in use (ddpwatch's default record
    directory): so it runs wherever the suite does."""
    need(shutil.which("unshare") is not None and shutil.which("nsenter") is not None,
         "needs unshare and nsenter for a mount namespace")
    holder = start_job(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs -o mode=1777 ddpwatch-test /dev/shm && exec sleep 3600"],
                       name="shm-holder")
    mounts = f"/proc/{holder.proc.pid}/mountinfo"

    def mounted():
        with open(mounts) as f:
            return any(line.split()[4] == "/dev/shm" and "ddpwatch-test" in line for line in f)
    wait_until(mounted, 30, what="the private /dev/shm mounted")
    enter = ["nsenter", f"--target={holder.proc.pid}", "--mount", "--"]

    def start_inside(argv, **kwargs):
        return start_job(enter + list(argv), **kwargs)
    return f"/proc/{holder.proc.pid}/root/dev/shm", enter, start_inside


def test_a_planted_shared_record_directory_neither_takes_roots_records_nor_hides_them(
        start_job, tmp_path, hb_dir, shared_dir):
    """Before, uid 65534 planted /dev/shm/ddpwatch as a link to a directory of its
    own: root's instrumented job chmodded the target 0700 and wrote and pruned
    its records there, and every other user's heartbeats were off. Now the
    writer goes beside a parent it does not trust (heartbeat/paths.py), and the
    daemon reads root's records there. All of it in a mount namespace of its
    own /dev/shm (private_shm)."""
    need_root()
    need(os.path.isdir("/dev/shm"), "no /dev/shm")
    shm, enter, start_inside = private_shm(start_job)
    target = os.path.join(shared_dir, "taken")
    os.mkdir(target, 0o777)
    os.chown(target, NOBODY, NOBODY)
    os.chmod(target, 0o777)
    planted = subprocess.run(enter + as_nobody("ln", "-s", target, SHM_PARENT),
                             capture_output=True, text=True, timeout=30)
    assert planted.returncode == 0, planted.stderr
    assert os.path.islink(os.path.join(shm, "ddpwatch"))
    # root's job and daemon with the default record directory (no DDPWATCH_DIR)
    daemon = DaemonRun(start_inside, tmp_path, hb_dir, {"tick_s": 0.5}, env={"DDPWATCH_DIR": ""})
    trainer = start_inside(trainer_argv(), env={"DDPWATCH_DIR": ""}, name="trainer")
    read = wait_until(lambda: with_heartbeats(our_status(daemon, trainer)), 180,
                      what="root's records read beside the planted parent")
    assert len(read["ranks"]) == 2
    st = os.stat(target)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o777)  # never chmodded
    assert os.listdir(target) == []  # nothing of root's written through the link
    beside = [n for n in os.listdir(shm) if n.startswith("ddpwatch-0")]
    assert beside, os.listdir(shm)
    no_traceback(daemon)
