"""A local user's attacks on the daemon, for real (docs/architecture.md "What a
local user may cost it"): an unprivileged user (uid 65534, via setpriv) against
a real `ddpwatch run` daemon running as root on loopback, beside a real 2-rank
trainer job of root's (the victim) that is then stalled with SIGSTOP.

The attacks run together for a window, then the test asserts that the daemon
kept ticking, the victim's incident opened (culprit named, bundle under the
state directory), nothing was written outside the state directory, no
traceback was printed, and the figures stayed in bounds: tick time, py-spy
runs, the daemon's CPU. The bounds are generous (a shared 2-core machine); the
daemon before these bounds crashed (SIGBUS) within 24-56 s, ticked in
0.36-0.55 s with junk files, and ran py-spy 65 times per 10 s with forged records.

And a daemon killed with SIGKILL and started again resolves the incident it
had opened, under the same id, and pages no second time.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time

import psutil
import pytest

from conftest import need, wait_until
from daemons import DaemonRun, get, our_status, rank_pid, trainer_job

NOBODY = 65534
PYTHON = "/usr/bin/python3"  # the venv's interpreter lives under /root, out of nobody's reach
WINDOW_S = 30.0


def need_hostile_setup():
    need(os.geteuid() == 0, "needs root: the daemon runs as root, the attacker as uid 65534")
    need(shutil.which("setpriv") is not None, "setpriv (util-linux) missing")
    need(os.access(PYTHON, os.X_OK), f"{PYTHON} missing")


def as_nobody(*argv) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]


@pytest.fixture
def playground():
    """A directory under /tmp that uid 65534 can reach (tmp_path cannot: it is
    root's 0700), with the attacker's own 0700 record directory in it and a
    root-only directory the attacker would like root to write into."""
    base = tempfile.mkdtemp(prefix="ddpw-hostile-", dir="/tmp")
    os.chmod(base, 0o755)
    mine = os.path.join(base, "nobody")
    os.mkdir(mine, 0o700)
    os.chown(mine, NOBODY, NOBODY)
    rootonly = os.path.join(base, "rootonly")
    os.mkdir(rootonly, 0o700)
    yield base, mine, rootonly
    shutil.rmtree(base, ignore_errors=True)


def record_bytes(pid: int, rank: int, uid: int, run_id: str = "forged") -> bytes:
    """A well-formed record (what a forger writes): made now, so after the process
    it names started (the pid-reuse check passes), inside a collective for long."""
    from ddpwatch.heartbeat import layout
    head = layout.pack_header(
        pid=pid, rank=rank, local_rank=rank, world_size=64, uid=uid, started_at=time.monotonic(),
        started_wall=time.time(), run_id=run_id, hostname=os.uname().nodename,
        torch_version="2.13.0", backend="gloo", device_type="cpu", compute_dtype="float32",
        data_fingerprint="", data_batches=-1, data_shards=-1)
    values = {name: 0 for name, _ in layout.PROGRESS_FIELDS}
    now = time.monotonic()
    values.update(collective_seq=7, op=layout.OP_CODE["all_reduce"], entered_at=now,
                  phase=layout.Phase.INSIDE, outstanding=1, updated_at=now)
    progress = layout.PROGRESS.pack(*(values[n] for n, _ in layout.PROGRESS_FIELDS))
    return (head + layout.SEQ.pack(2) + progress).ljust(layout.RECORD_SIZE, b"\0")


# The forger: 30 records naming root's process (kept in the attacker's own
# directory, which its running python names in DDPWATCH_DIR), then it waits.
FORGER = r"""
import os, sys, time
mine, forged, sleeper = sys.argv[1], sys.argv[2], sys.argv[3]
blob = open(forged, "rb").read()
for i in range(30):
    with open(os.path.join(mine, f"rank{i}-pid{sleeper}.hb"), "wb") as f:
        f.write(blob)
print("ready", flush=True)
time.sleep(3600)
"""

# The flooder: 20 000 junk files, then records it truncates and rewrites in a
# loop (the old mmapped reader died of SIGBUS within 24-56 s of this). A short
# sleep per round keeps thousands of races a second without taking a core
# from the daemon on a 2-core machine (that would measure the machine, not it).
FLOODER = r"""
import os, sys, time
mine, own = sys.argv[1], sys.argv[2]
for i in range(20000):
    with open(os.path.join(mine, f"junk{i}.hb"), "wb") as f:
        f.write(b"junk" * (i % 7))
good = open(own, "rb").read()
paths = [os.path.join(mine, f"rank{100 + i}-pid{os.getpid()}.hb") for i in range(8)]
fds = [os.open(p, os.O_RDWR | os.O_CREAT, 0o600) for p in paths]
print("ready", flush=True)
n = 0
while True:
    for fd in fds:
        os.pwrite(fd, good, 0)
        os.ftruncate(fd, (n * 977) % len(good))
        os.pwrite(fd, good[: (n * 131) % len(good)], 0)
        n += 1
    time.sleep(0.0005)
"""

# a rank's process shows more than a claim (a TCP socket, as a rank's store or
# peers are: publish/limits.py shows_a_job), so its stall is an incident
STOP_SELF = ("import os, signal, socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); "
             "s.listen(); print('ready', flush=True); os.kill(os.getpid(), signal.SIGSTOP)")
LOOK_LIKE_A_RANK = "import time; print('ready', flush=True); time.sleep(3600)"


def samples(text: str) -> list[tuple[str, str, float]]:
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            m = re.match(r"([a-zA-Z_:][\w:]*)(\{.*\})? (\S+)$", line)
            if m:
                out.append((m.group(1), m.group(2) or "", float(m.group(3))))
    return out


def metric(text: str, name: str) -> float | None:
    return next((v for n, labels, v in samples(text) if n == name and not labels), None)


def files_under(root: str) -> set[str]:
    """Every file and directory below `root`."""
    return {os.path.join(d, name) for d, dirs, files in os.walk(root) for name in dirs + files}


class Watch:
    """The daemon's figures over a window, sampled once a second."""

    def __init__(self, daemon, seconds: float):
        proc = psutil.Process(daemon.job.proc.pid)
        first, t0, cpu0 = daemon.metrics(), time.monotonic(), sum(proc.cpu_times()[:2])
        self.ticks, self.durations, self.rank_pids = [], [], set()
        while time.monotonic() - t0 < seconds:
            assert daemon.job.proc.poll() is None, daemon.job.output()[-3000:]
            text = daemon.metrics()
            self.ticks.append(metric(text, "ddpwatch_ticks_total"))
            self.durations.append(metric(text, "ddpwatch_tick_duration_seconds"))
            keys = [(n, labels) for n, labels, _ in samples(text)]
            assert len(keys) == len(set(keys)), "duplicate series on /metrics"
            status = daemon.status()
            self.rank_pids |= {r["pid"] for j in status["jobs"] for r in j["ranks"]}
            time.sleep(1.0)
        self.elapsed, self.last = time.monotonic() - t0, daemon.metrics()
        self.cpu = (sum(proc.cpu_times()[:2]) - cpu0) / self.elapsed
        self.dumps = (metric(self.last, "ddpwatch_stack_dumps_total")
                      - metric(first, "ddpwatch_stack_dumps_total"))
        self.median = statistics.median(self.durations)

    def __str__(self):
        return (f"{self.ticks[-1] - self.ticks[0]:.0f} ticks in {self.elapsed:.0f}s, tick median "
                f"{self.median:.3f}s max {max(self.durations):.3f}s, {self.dumps:.0f} py-spy "
                f"runs, daemon CPU {self.cpu:.0%}")


def test_unprivileged_attacks_do_not_crash_blind_mislead_or_steer_the_daemon(
        start_job, tmp_path, hb_dir, playground, need_py_spy):
    need_hostile_setup()
    base, mine, rootonly = playground
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"resolve_after_s": 2})
    trainer = trainer_job(start_job)
    healthy = wait_until(lambda: (lambda s: s if len(s["ranks"]) == 2 and all(
        r["signals"].get("hb_step") is not None for r in s["ranks"]) and s["job"]["verdict"]
        == "healthy" else None)(our_status(daemon, trainer)), 240, what="healthy victim job")
    victim_key = healthy["key"]
    master = next(p.environ() for p in trainer.processes() if "RANK" in p.environ())

    # root's process that forged records name, and what the attackers are handed
    sleeper = start_job(["sleep", "3600"], name="root-sleep")
    sleep_pid = sleeper.proc.pid
    blobs = os.path.join(base, "blobs")
    os.mkdir(blobs)
    os.chmod(blobs, 0o755)
    forged, own = os.path.join(blobs, "forged"), os.path.join(blobs, "own")
    for path, data in ((forged, record_bytes(sleep_pid, 1, NOBODY)),
                       (own, record_bytes(0, 100, NOBODY, "racer"))):
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o644)
    env = {"DDPWATCH_DIR": mine, "HOME": base, "PYTHONPATH": ""}
    forger = start_job(as_nobody(PYTHON, "-c", FORGER, mine, forged, str(sleep_pid)), env=env,
                       name="forger")
    # run id = a path out of the state directory, through a symlink to a root-only one
    os.symlink(rootonly, os.path.join(mine, "L"))
    escape = "../" * 24 + os.path.join(mine, "L", "pwn").lstrip("/")
    climber = start_job(as_nobody(PYTHON, "-c", STOP_SELF), name="climber", env=dict(
        env, TORCHELASTIC_RUN_ID=escape, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1"))
    # a second user's process claiming the victim's run id and rendezvous
    twin = start_job(as_nobody(PYTHON, "-c", LOOK_LIKE_A_RANK), name="twin", env=dict(
        env, **{k: master[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE",
                                       "TORCHELASTIC_RUN_ID") if k in master},
        RANK="0", LOCAL_RANK="0"))
    for job in (forger, climber, twin):
        wait_until(lambda: "ready" in job.output(), 60, what="attacker process")
    before_files = files_under(base) - files_under(mine)

    # the victim stalls (rank 1 stopped): its incident opens, twin or no twin
    victim_pid = rank_pid(healthy, 1)
    os.kill(victim_pid, signal.SIGSTOP)
    incident = wait_until(lambda: next((i for i in daemon.status()["incidents"]
                                        if i["job"] == victim_key and i["state"] != "resolved"),
                                       None), 60, what="the victim's incident")
    assert incident["culprits"] == [1] and incident["owner"].startswith("u0.")
    state_dir = os.path.realpath(daemon.state_dir)
    assert os.path.realpath(incident["bundle"]).startswith(state_dir + "/incidents/")
    quiet = Watch(daemon, 12)  # the stalled victim's own cost: the baseline

    flooder = start_job(as_nobody(PYTHON, "-c", FLOODER, mine, own), env=env, name="flooder")
    wait_until(lambda: "ready" in flooder.output(), 180, what="the flooder's 20 000 files")
    flooded = Watch(daemon, WINDOW_S)
    print(f"\nbaseline: {quiet}\nflooded:  {flooded}")

    status = daemon.status()
    assert any(i["id"] == incident["id"] and i["state"] != "resolved"
               for i in status["incidents"]), "the victim's incident must stay open"
    # the twin is a job of its own, never the victim's (and never silences it)
    victim_view = next(j for j in status["jobs"] if j["key"] == victim_key)
    assert twin.proc.pid not in {r["pid"] for r in victim_view["ranks"]}
    # forged records made no rank of root's sleep
    assert sleep_pid not in quiet.rank_pids | flooded.rank_pids
    # nothing written outside the state directory, however the run id climbs
    assert os.listdir(rootonly) == []
    assert files_under(base) - files_under(mine) == before_files
    for i in status["incidents"]:
        assert not i["bundle"] or os.path.realpath(i["bundle"]).startswith(state_dir + "/")
    # the climber's own stall is an incident too: its bundle went under the state
    # directory, by a sanitised name
    climbed = [i for i in status["incidents"] if i["job"].endswith("/L/pwn")]
    assert climbed and all(os.path.dirname(os.path.realpath(i["bundle"])) ==
                           os.path.join(state_dir, "incidents") for i in climbed), climbed
    # kept ticking, about as fast and cheaply as before the flood (the old
    # daemon: +0.3-0.5 s a tick), and not steered into py-spy runs (the old one:
    # 65 per 10 s with forged records)
    for watch in (quiet, flooded):
        assert watch.ticks[-1] - watch.ticks[0] >= watch.elapsed / 2, watch.ticks
        assert watch.dumps <= 2 * watch.elapsed / 5 + 6, str(watch)
        assert watch.cpu < 0.6, str(watch)
    assert flooded.median < quiet.median + 0.1, f"{quiet} / {flooded}"
    # the junk and the races are skipped files, not a failed probe
    assert 'ddpwatch_probe_success{probe="heartbeats"} 1.0' in flooded.last
    assert "Traceback" not in daemon.job.output()
    assert daemon.job.proc.poll() is None


def test_sigkill_and_restart_resolve_the_same_incident_without_a_second_page(
        start_job, tmp_path, hb_dir, receivers, need_py_spy):
    need(os.geteuid() == 0, "needs root (the daemon as it runs in production)")
    hook = receivers()
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {
        "webhooks": [{"type": "generic", "url": hook.url}], "resolve_after_s": 2})
    trainer = trainer_job(start_job)
    healthy = wait_until(lambda: (lambda s: s if len(s["ranks"]) == 2 and s["job"]["verdict"]
                                  == "healthy" else None)(our_status(daemon, trainer)), 240,
                         what="healthy job")
    key = healthy["key"]
    victim_pid = rank_pid(healthy, 1)
    os.kill(victim_pid, signal.SIGSTOP)
    firing = wait_until(lambda: [b for b in hook.bodies() if b["status"] == "firing"
                                 and b["job"] == key], 90, what="firing webhook")
    incident_id = firing[0]["incident_id"]
    wait_until(lambda: os.path.exists(os.path.join(daemon.state_dir, "incidents.json")), 10,
               what="incidents saved")

    os.kill(daemon.job.proc.pid, signal.SIGKILL)
    daemon.job.proc.wait(timeout=30)
    first_run = daemon.job
    daemon.start()
    # the new daemon has the incident, under its id, still open
    resumed = wait_until(lambda: next((i for i in daemon.status()["incidents"]
                                       if i["id"] == incident_id), None), 30,
                         what="the incident after restart")
    assert resumed["state"] != "resolved" and resumed["culprits"] == [1]
    # it goes on judging the same stall for a while: no second page
    ticks = metric(daemon.metrics(), "ddpwatch_ticks_total")
    wait_until(lambda: metric(daemon.metrics(), "ddpwatch_ticks_total") >= ticks + 8, 60,
               what="8 ticks after restart")
    assert [b["incident_id"] for b in hook.bodies() if b["job"] == key] == [incident_id]
    opened = [i for i in daemon.status()["incidents"] if i["job"] == key]
    assert [i["id"] for i in opened] == [incident_id]

    # the job ends (killed whole: a resumed rank catching up is judged a straggler
    # for a moment, a change of judgement that is sent as such, restart or not)
    trainer.kill()
    resolved = wait_until(lambda: [b for b in hook.bodies() if b["status"] == "resolved"
                                   and b["job"] == key], 90, what="resolved webhook")
    assert [b["incident_id"] for b in resolved] == [incident_id]
    fired = [(b["status"], b["verdict"], b["culprits"]) for b in hook.bodies() if b["job"] == key]
    assert len([f for f in fired if f[0] == "firing"]) == 1, fired
    for run in (first_run, daemon.job):
        assert "Traceback" not in run.output()
    assert get(daemon.url + "/readyz")[0] == 200


def test_a_full_disk_leaves_the_incident_without_bundle_said_and_retried(
        start_job, tmp_path, hb_dir, need_py_spy):
    """The state directory on a 1 MiB tmpfs, filled: the incident opens all the
    same, says why it has no bundle (/status, /metrics), and gets its bundle
    once there is room again."""
    need(os.geteuid() == 0 and shutil.which("mount") is not None, "needs root to mount a tmpfs")
    state = tmp_path / "state"
    state.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs",
                           str(state)], capture_output=True, text=True)
    need(done.returncode == 0, f"cannot mount a tmpfs: {done.stderr}")
    try:
        filler = state / "filler"
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        daemon = DaemonRun(start_job, tmp_path, hb_dir, {"resolve_after_s": 2})
        trainer = trainer_job(start_job)
        healthy = wait_until(lambda: (lambda s: s if len(s["ranks"]) == 2 and s["job"]["verdict"]
                                      == "healthy" else None)(our_status(daemon, trainer)), 240,
                             what="healthy job")
        key = healthy["key"]
        os.kill(rank_pid(healthy, 1), signal.SIGSTOP)
        incident = wait_until(lambda: next((i for i in daemon.status()["incidents"]
                                            if i["job"] == key and i["bundle_error"]), None), 60,
                              what="an incident without bundle")
        assert incident["bundle"] == "" and "No space left" in incident["bundle_error"]
        text = daemon.metrics()
        assert f'ddpwatch_incidents_without_bundle{{ddp_job="{key}"}} 1.0' in text
        failed = [v for n, labels, v in samples(text) if n == "ddpwatch_stage_failures_total"
                  and labels == '{stage="bundle"}']
        assert failed and failed[0] >= 1
        assert daemon.status()["stage_failures"]["bundle"] >= 1
        os.unlink(filler)
        written = wait_until(lambda: next((i for i in daemon.status()["incidents"]
                                           if i["id"] == incident["id"] and i["bundle"]), None),
                             30, what="the bundle, retried")
        assert written["bundle_error"] == "" and os.path.isdir(written["bundle"])
        assert "ddpwatch_incidents_without_bundle" not in daemon.metrics()
        wait_until(lambda: (state / "incidents.json").exists(), 10, what="incidents saved")
        assert "Traceback" not in daemon.job.output()
    finally:
        subprocess.run(["umount", "-l", str(state)], capture_output=True)
