"""A real daemon watches real healthy third-party jobs without heartbeats, from
their launch (imports, init_process_group, DDP set-up) through 50 s of
training: no alarm, ever (benchmarks/soak.py watches torchrun and Lightning
jobs for longer).

The four launchers' jobs (Lightning, torch.multiprocessing.spawn, accelerate,
torchrun; 2 CPU ranks each) run at once on purpose: 8 ranks sharing 2 cores are
slowed alike, and a user sharing a machine expects that to be no straggler. The
daemon's /status is read every second and every reading is kept; the daemon
reads its window evidence between ticks (observe/window/between.py) as it does in
production. Then, beside the same jobs, one rank stopped 70% of the time is
named the straggler by the same daemon: the window evidence at work.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import psutil
import pytest
from conftest import REPO, Job, free_port, need, wait_until
from daemons import get
from thirdparty_jobs import ANNOUNCE, LAUNCH, THIRDPARTY

from ddpwatch.judge.vocabulary import CALM

TRAIN_S = 50.0  # watched for this long after each job's ranks announced themselves


def command(launcher: str) -> list[str]:
    script = os.path.join(THIRDPARTY, f"{launcher}_ddp.py")
    if launcher in LAUNCH:
        return LAUNCH[launcher](free_port(), script)
    return [sys.executable, script]


class Poller(threading.Thread):
    """/status every second; every reading kept with its time."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.readings, self.done = url, [], threading.Event()

    def run(self):
        while not self.done.wait(1.0):
            code, body = get(self.url + "/status")
            if code == 200:
                self.readings.append((time.monotonic(), json.loads(body)))


def _ours(jobs: dict[str, Job]) -> dict[int, str]:
    """pid -> launcher, for every process of our jobs (launchers re-execute and spawn)."""
    pids = {}
    for name, job in jobs.items():
        try:
            root = psutil.Process(job.proc.pid)
            for p in [root] + root.children(recursive=True):
                pids[p.pid] = name
        except psutil.Error:
            continue
    return pids


def _part_stopped(poller: Poller, pids: dict[int, int]) -> dict:
    """Stop rank 1 70% of each 100 ms until /status names it; its job's status."""
    done = threading.Event()

    def cycle():
        while not done.is_set():
            os.kill(pids[1], signal.SIGSTOP)
            time.sleep(0.07)
            os.kill(pids[1], signal.SIGCONT)
            time.sleep(0.03)
    started = time.monotonic() + 1.0  # a reading taken after the first stops
    cycler = threading.Thread(target=cycle, daemon=True)
    cycler.start()

    last = []

    def named():
        for at, status in poller.readings[-3:]:
            if at < started:
                continue
            for job in status["jobs"]:
                if {r["pid"] for r in job["ranks"]} == set(pids.values()):
                    last[:] = [[(r["rank"], r["verdict"], r["rule"], r["signals"].get(
                        "duty_samples"), r["signals"].get("stopped_share"), r["signals"].get(
                        "stop_switches")) for r in job["ranks"]], job["job"]["culprits"]]
                    # the very state asserted: culprit and its victim in one reading
                    by_rank = {r["rank"]: r for r in job["ranks"]}
                    if (by_rank.get(1, {}).get("rule") == "straggler-part-stopped"
                            and by_rank.get(0, {}).get("verdict") == "waiting_on_peer"
                            and job["job"]["culprits"] == [1]):
                        return job
        return None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            job = named()
            if job:
                return job
            time.sleep(0.5)
        pytest.fail(f"the part-stopped rank was not named within 60 s; last seen "
                    f"(rank, verdict, rule, readings, stopped share, switches), culprits: {last}")
    finally:
        done.set()
        cycler.join(timeout=5)
        os.kill(pids[1], signal.SIGCONT)


# the readings a person needs beside a false alarm's rule and evidence
SHOWN_SIGNALS = ("cpu_ratio", "runqueue_wait_ratio", "duty_samples", "stopped_share", "stack")


def _clock(at: float, origin: float, wall_offset: float) -> str:
    """A reading's time: seconds into the watch and the wall clock (UTC), to find
    it in the daemon's log."""
    wall = time.strftime("%H:%M:%S", time.gmtime(at + wall_offset))
    return f"{at - origin:.1f} s into the watch ({wall} UTC)"


def false_alarms(seen: dict[str, list], origin: float, wall_offset: float,
                 announced: dict[str, float]) -> list[str]:
    """One paragraph per false alarm: a rank's run of readings with one verdict
    that is not calm (or a role), naming the job, the rank, the rule, its
    evidence and readings, and when it began and ended."""
    out = []
    for name, series in seen.items():
        runs: dict[int, list] = {}  # rank -> [first (at, job, rank status), last at, count]
        for at, job in series + [(None, {"ranks": []})]:
            present = {r["rank"]: r for r in job["ranks"]}
            for rank in sorted(set(runs) | set(present)):
                r = present.get(rank)
                alarm = r is not None and (r["verdict"] not in CALM or r["role"] != "none")
                what = (r["verdict"], r["role"], r["rule"]) if alarm else None
                run = runs.get(rank)
                if run and (what is None or what != run[3]):
                    (first_at, first_job, first), last_at, count, _ = runs.pop(rank)
                    since = (f"{first_at - announced[name]:+.1f} s from its ranks' announcement"
                             if name in announced else "before its ranks announced")
                    shown = {k: v for k, v in first["signals"].items() if k in SHOWN_SIGNALS}
                    out.append(
                        f"{name} job {first_job['key']} rank {rank} (pid {first['pid']}): "
                        f"{first['verdict']} ({first['role']}) by rule {first['rule']!r} "
                        f"from {_clock(first_at, origin, wall_offset)}, {since}, to "
                        f"{last_at - origin:.1f} s ({count} readings); job culprits "
                        f"{first_job['job'].get('culprits')}; evidence: {first['evidence']}; "
                        f"signals: {shown}")
                    run = None
                if what is not None:
                    if run:
                        run[1], run[2] = at, run[2] + 1
                    else:
                        runs[rank] = [(at, job, r), at, 1, what]
    return out


def test_healthy_jobs_are_no_alarm_from_launch_through_their_watch(tmp_path, receivers, need_py_spy):
    need(os.cpu_count() >= 2, "needs 2 CPUs")
    for module in ("lightning", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            need(False, f"{module} is not installed (setup.cfg extra 'test')")
    hook = receivers()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "daemon.yaml"
    config.write_text(json.dumps({
        "listen": f"127.0.0.1:{port}", "state_dir": str(tmp_path / "state"),
        "heartbeat_dir": str(tmp_path / "no-records"),
        "webhooks": [{"type": "generic", "url": hook.url}]}))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=REPO)
    env.pop("DDPWATCH_DIR", None)
    env.pop("DDPWATCH_AUTO", None)
    daemon = Job([sys.executable, "-m", "ddpwatch", "run", "--config", str(config)], env,
                 str(tmp_path / "daemon.log"))
    jobs: dict[str, Job] = {}
    poller = Poller(url)
    wall_offset = time.time() - time.monotonic()  # readings' monotonic times -> wall clock
    try:
        wait_until(lambda: get(url + "/readyz")[0] == 200, 60, what="daemon ready")
        poller.start()
        for launcher in ("lightning", "spawn", "accelerate", "torchrun"):
            jobs[launcher] = Job(command(launcher), dict(env, MASTER_PORT=str(free_port())),
                                 str(tmp_path / f"{launcher}.log"))
        announced: dict[str, float] = {}
        pids: dict[str, dict[int, int]] = {}

        def trained_long_enough():
            for name, job in jobs.items():
                assert job.proc.poll() is None, (name, job.output()[-3000:])
                found = {int(r): int(p) for r, _, p in ANNOUNCE.findall(job.output())}
                if len(found) == 2 and name not in announced:
                    announced[name], pids[name] = time.monotonic(), found
            return len(announced) == len(jobs) and all(
                time.monotonic() - t >= TRAIN_S for t in announced.values())
        wait_until(trained_long_enough, 240 + TRAIN_S, interval=1.0,
                   what=f"every job announced and trained for {TRAIN_S:g} s")
        ours_at_end = _ours(jobs)
        # Then the same daemon, beside the same jobs: spawn's rank 1 stopped 70% of
        # the time is the straggler, from the states it reads between ticks.
        fault_at = time.monotonic()
        straggled = _part_stopped(poller, pids["spawn"])
    finally:
        poller.done.set()
        poller.join(timeout=15)
        for job in jobs.values():
            job.kill()
        daemon.kill()
    with open(daemon.log_path, errors="replace") as f:
        print(f.read()[-2000:])

    readings = [(at, status) for at, status in poller.readings if at < fault_at]
    assert len(readings) >= TRAIN_S, len(readings)  # about one a second
    seen: dict[str, list] = {name: [] for name in jobs}  # launcher -> (t, job status)
    keys: dict[str, str] = {}
    ours = dict(ours_at_end)
    for name, ranks in pids.items():
        ours.update({pid: name for pid in ranks.values()})
    for at, status in readings:
        for job in status["jobs"]:
            member = {ours.get(r["pid"]) for r in job["ranks"]} | {
                ours.get(job["job"]["launcher_pid"])}
            member.discard(None)
            if member:
                assert len(member) == 1, job  # one job each, never two mixed
                name = member.pop()
                seen[name].append((at, job))
                keys[job["key"]] = name
    for name, series in seen.items():  # the timeline, for a person reading a failure
        before = None
        for at, job in series:
            now = tuple((r["rank"], r["verdict"], r["rule"]) for r in job["ranks"])
            if now != before:
                print(f"{name} {at - readings[0][0]:6.1f}s", now, {
                    r["rank"]: {k: r["signals"].get(k) for k in (
                        "cpu_ratio", "runqueue_wait_ratio", "duty_samples", "stack")}
                    for r in job["ranks"]})
                before = now
    problems = false_alarms(seen, readings[0][0], wall_offset, announced)
    assert not problems, (f"{len(problems)} false alarm(s) on healthy jobs (the timeline "
                          f"and the daemon's log are in the captured output):\n" +
                          "\n".join(problems))
    incidents = {}  # incident id -> (first reading, incident): one line each
    for at, status in readings:
        for i in status["incidents"]:
            if i["job"] in keys:
                incidents.setdefault(i.get("id"), (at, i))
    assert not incidents, "incidents opened on healthy jobs:\n" + "\n".join(
        f"{keys[i['job']]} job {i['job']}: incident {i.get('id')} {i.get('verdict')} culprits "
        f"{i.get('culprits')}, first seen {_clock(at, readings[0][0], wall_offset)}: "
        f"{i.get('summary')}" for at, i in incidents.values())
    hooks = [b for b in (json.loads(r.body) for r in hook.requests if r.at < fault_at)
             if b.get("job") in keys]
    assert not hooks, f"webhooks sent for healthy jobs: {hooks}"
    for name, series in seen.items():
        assert series, f"{name}: never in /status"
        # at the end, from progress: both ranks trained and connected, not starting
        at, last = series[-1]
        assert {r["pid"]: r["rank"] for r in last["ranks"]} == {
            p: r for r, p in pids[name].items()}, (name, last["ranks"])
        for r in last["ranks"]:
            assert r["verdict"] == "healthy", (name, r)
            assert r["signals"].get("gloo_unconnected") == 0, (name, r["signals"])
        assert at - announced[name] >= TRAIN_S - 5, name
    # the window evidence: the part-stopped rank (after the healthy watch)
    by_rank = {r["rank"]: r for r in straggled["ranks"]}
    assert straggled["job"]["culprits"] == [1], straggled["job"]
    assert (by_rank[1]["verdict"], by_rank[1]["rule"]) == ("straggler", "straggler-part-stopped")
    assert by_rank[0]["verdict"] == "waiting_on_peer" and by_rank[0]["role"] == "victim"
    assert 0.2 <= by_rank[1]["signals"]["stopped_share"] < 0.95


def test_a_false_alarm_is_reported_with_job_rank_rule_evidence_and_time():
    """The healthy watch's failure message, from readings built here: each false
    alarm once, with its job, rank, rule, evidence and when it began and ended."""
    def job(r1_verdict, r1_role, rule):
        calm = {"rank": 0, "pid": 100, "verdict": "healthy", "role": "none", "rule": "healthy",
                "evidence": "", "signals": {}}
        return {"key": "127.0.0.1:29512", "job": {"culprits": [1] if r1_role == "culprit" else []},
                "ranks": [calm, {"rank": 1, "pid": 101, "verdict": r1_verdict, "role": r1_role,
                                 "rule": rule, "evidence": "ran 12% of the window",
                                 "signals": {"cpu_ratio": 0.12}}]}
    series = [(1000.0, job("healthy", "none", "healthy")),
              (1001.0, job("straggler", "culprit", "straggler-starved")),
              (1002.0, job("straggler", "culprit", "straggler-starved")),
              (1003.0, job("healthy", "none", "healthy")),
              (1004.0, job("warming_up", "none", "warming-up"))]
    found = false_alarms({"lightning": series}, 990.0, 0.0, {"lightning": 995.0})
    assert len(found) == 1, found
    alarm = found[0]
    for part in ("lightning job 127.0.0.1:29512 rank 1 (pid 101)", "straggler (culprit)",
                 "'straggler-starved'", "from 11.0 s into the watch (00:16:41 UTC)",
                 "+6.0 s from its ranks' announcement", "to 12.0 s (2 readings)",
                 "culprits [1]", "evidence: ran 12% of the window", "'cpu_ratio': 0.12"):
        assert part in alarm, (part, alarm)
