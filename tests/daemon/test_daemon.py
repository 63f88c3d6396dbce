"""`ddpwatch run` against real 2-rank trainer jobs: incidents, /status, /metrics,
signed webhooks, retries, SIGHUP, restarts."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, free_port, need, wait_until
from daemons import DaemonRun, get, our_status, rank_pid, trainer_job, with_heartbeats
from diag import by_hand

SECRET = "whsec_" + "c2VjcmV0LWZvci10ZXN0cy1vbmx5"  # base64 of a test-only key


def test_stall_is_an_incident_with_signed_webhook_and_sigcont_resolves_it(
        start_job, tmp_path, hb_dir, receivers):
    hook = receivers()
    daemon = DaemonRun(start_job, tmp_path, hb_dir,
                       {"webhooks": [{"type": "generic", "url": hook.url, "secret": SECRET}],
                        "resolve_after_s": 2})
    trainer = trainer_job(start_job)
    healthy = wait_until(lambda: (lambda s: s if len(s["ranks"]) == 2 and s["job"]["verdict"] ==
                                  "healthy" else None)(our_status(daemon, trainer)), 180,
                         what="healthy job")
    victim_pid = rank_pid(healthy, 1)
    # a healthy job whose ranks all move on keeps its last look on some ticks
    # (docs/architecture.md "Steady jobs"); the stop below still shows at once
    wait_until(lambda: kept_looks(daemon) >= 2, 60, what="looks kept by steady ticks")
    os.kill(victim_pid, signal.SIGSTOP)
    stalled = wait_until(lambda: (lambda s: s if s["job"]["culprits"] == [1] else None)(
        our_status(daemon, trainer)), 60, what="culprit in /status")
    assert stalled["job"]["verdict"] == "stopped"
    # the incident opens once the problem is confirmed on a second tick
    incident = wait_until(lambda: next((i for i in daemon.status()["incidents"]
                                        if i["state"] != "resolved" and i["job"] == stalled["key"]),
                                       None), 30, what="the incident")
    assert incident["culprits"] == [1] and os.path.isdir(incident["bundle"])
    bundle = json.load(open(os.path.join(incident["bundle"], "report.json")))
    assert bundle["job"]["culprits"] == [1]
    # the ranks' raw records, copied before anything can kill the job
    assert sorted(os.listdir(os.path.join(incident["bundle"], "records"))) == sorted(
        f"rank{r['rank']}-pid{r['pid']}.hb" for r in healthy["ranks"])
    # Watched lean while healthy (schedstat only, no sockets), the evidence is
    # read in detail once the job is suspect: thread states, wchan, sockets.
    history = json.load(open(os.path.join(incident["bundle"], "snapshots.json")))["history"]
    newest = history[-1]
    culprit = next(p for p in newest["processes"]["procs"] if p["pid"] == victim_pid)
    assert {t["state"] for t in culprit["threads"]} == {"T"}
    assert newest["sockets"] is not None
    metrics = daemon.metrics()
    assert 'ddpwatch_job_culprit{' in metrics and 'rank="1"' in metrics
    key = stalled["key"]
    firing = wait_until(lambda: [b for b in hook.bodies() if b["status"] == "firing"
                                 and b["job"] == key], 30, what="firing webhook")
    assert firing[0]["culprits"] == [1] and firing[0]["verdict"] == "stopped"
    from ddpwatch.publish.alerts.generic import verify_hub, verify_standard
    signed = next(r for r in hook.requests if json.loads(r.body)["job"] == key)
    headers, body = signed.headers, signed.body
    assert verify_standard(SECRET, headers, body) and verify_hub(SECRET, headers, body)
    assert not verify_standard(SECRET + "x", headers, body)
    os.kill(victim_pid, signal.SIGCONT)
    wait_until(lambda: [b for b in hook.bodies() if b["status"] == "resolved"
                        and b["job"] == key], 90, what="resolved webhook")
    # resumed, a rank catching up is at most `slowing` (calm: watch/slow.py)
    assert our_status(daemon, trainer)["job"]["verdict"] in ("healthy", "warming_up", "slowing")


def test_a_rank_killed_while_its_job_is_steady_is_the_dead_culprit(start_job, tmp_path, hb_dir):
    """A steady job's ticks keep its last look and sample none of its processes
    (docs/architecture.md "Steady jobs"), while the exits probe keeps the ends of
    the pids sampled in the last two surveys only: the kernel's word that a rank
    died must still be kept for such a job (Sampler.watch_ends). Rank 1 killed
    in the second kept tick in a row, two surveys after the last look, is the
    dead culprit of the job held after torchrun ends the rest."""
    need(os.geteuid() == 0, "the kernel's process events need root (CAP_NET_ADMIN)")
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"resolve_after_s": 600})
    trainer = trainer_job(start_job)
    healthy = wait_until(lambda: (lambda s: s if with_heartbeats(s) and s["job"]["verdict"] ==
                                  "healthy" else None)(our_status(daemon, trainer)), 180,
                         what="healthy job with heartbeats")
    key, victim = healthy["key"], rank_pid(healthy, 1)

    def job(status):
        return next((j for j in status["jobs"] if j["key"] == key), None)

    def second_kept_tick():
        status = daemon.status()
        j = job(status)
        return j is not None and status["wall_time"] - j["looked_at"] >= 1.5
    wait_until(second_kept_tick, 60, interval=0.02,
               what="a tick that kept the job's look of two ticks before")
    os.kill(victim, signal.SIGKILL)
    dead = wait_until(lambda: (lambda j: j if j and j["job"]["culprits"] == [1] else None)(
        job(daemon.status())), 60, what="the killed rank named the culprit")
    assert dead["job"]["verdict"] == "dead", dead["job"]
    culprit = next(r for r in dead["ranks"] if r["rank"] == 1)
    assert culprit["pid"] == victim and "SIGKILL" in culprit["evidence"], culprit


def kept_looks(daemon) -> float:
    """ddpwatch_looks_kept_total from the daemon's /metrics."""
    for line in daemon.metrics().splitlines():
        if line.startswith("ddpwatch_looks_kept_total "):
            return float(line.split()[1])
    return 0.0


def test_failing_receiver_gets_retries_while_ticks_keep_their_pace(
        start_job, tmp_path, hb_dir, receivers):
    # hangs past the 1 s timeout, then 500, then 429 with Retry-After, then 200
    hook = receivers([(200, {}, 6.0), (500, {}), (429, {"Retry-After": "1"}), (200, {})])
    daemon = DaemonRun(start_job, tmp_path, hb_dir,
                       {"webhooks": [{"type": "generic", "url": hook.url, "timeout_s": 1}]})
    trainer = trainer_job(start_job, "hang:rank=1:step=10")
    wait_until(lambda: our_status(daemon, trainer)["job"]["culprits"] == [1], 180, what="culprit")
    wait_until(lambda: hook.requests, 30, what="first delivery attempt")
    ticks_before, started = daemon.status()["tick"], time.monotonic()
    wait_until(lambda: len(hook.requests) >= 4, 60, what="4 delivery attempts")
    times = [r.at for r in hook.requests]
    assert times[3] - times[2] >= 0.9  # Retry-After: 1 was honoured
    assert len({b["incident_id"] for b in hook.bodies()}) == 1  # one message
    # while the receiver hung and failed, the loop kept ticking (1 s tick)
    elapsed = time.monotonic() - started
    ticks = daemon.status()["tick"] - ticks_before
    assert elapsed > 1.5 and ticks >= elapsed / 3, (ticks, elapsed)
    # and /metrics tells operators how delivery went (the next tick publishes it)
    def delivered(outcome):
        line = next((line for line in daemon.metrics().splitlines() if line.startswith(
            f'ddpwatch_webhook_alerts_total{{outcome="{outcome}",sink=')), "x 0")
        return float(line.rsplit(" ", 1)[1])
    wait_until(lambda: delivered("sent") >= 1, 30, what="a sent alert in /metrics")
    assert delivered("retried") >= 3


def test_bad_config_on_sighup_keeps_the_running_one(start_job, tmp_path, hb_dir):
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"tick_s": 0.5})
    daemon.config_path.write_text("tick_s: 0.5\nbogus_key: 1\n")
    daemon.job.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reload refused" in daemon.job.output(), 30, what="reload refused in log")
    assert "bogus_key" in daemon.job.output() and f"{daemon.config_path}:2" in daemon.job.output()
    assert get(daemon.url + "/readyz")[0] == 200 and get(daemon.url + "/status")[0] == 200
    daemon.write({"tick_s": 0.5, "token": "s3cret"})
    daemon.job.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: get(daemon.url + "/status")[0] == 401, 30, what="token in force")
    assert daemon.status(token="s3cret")["node"]


def test_restarted_daemon_picks_the_ranks_up_again(start_job, tmp_path, hb_dir):
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {})
    trainer = trainer_job(start_job)
    first = wait_until(lambda: with_heartbeats(our_status(daemon, trainer)), 180,
                       what="2 ranks with records")
    daemon.job.proc.kill()
    daemon.job.proc.wait(30)
    # as a system service would be: not in the trainer's environment, so its
    # DDPWATCH_DIR differs; the records are found where the ranks say they write
    daemon.start(env={"DDPWATCH_DIR": str(tmp_path / "daemon-own-dir")})
    again = wait_until(lambda: with_heartbeats(our_status(daemon, trainer)), 60,
                       what="2 ranks after restart")
    assert {r["pid"] for r in again["ranks"]} == {r["pid"] for r in first["ranks"]}
    table = subprocess.run([sys.executable, "-m", "ddpwatch", "status", "--url", daemon.url],
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=REPO))
    assert table.returncode == 0 and again["key"] in table.stdout
    assert all(str(r["pid"]) in table.stdout for r in again["ranks"])
    steps = {r["pid"]: r["signals"].get("hb_step") for r in again["ranks"]}
    assert all(s is not None for s in steps.values())  # read back from the records


def test_metrics_pass_promtool(start_job, tmp_path, hb_dir):
    need(shutil.which("promtool") is not None, "promtool (Debian package prometheus) missing")
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {})
    trainer = trainer_job(start_job)
    wait_until(lambda: with_heartbeats(our_status(daemon, trainer)), 180, what="2 ranks")
    text = daemon.metrics()
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    for name in ("ddpwatch_up", "ddpwatch_rank_state", "ddpwatch_rank_step",
                 "ddpwatch_rank_heartbeat_age_seconds", "ddpwatch_probe_success",
                 "ddpwatch_tick_duration_seconds"):
        assert name in text


@pytest.mark.parametrize("content, message", [
    ("tick_s: 1\nnot_a_key: 2\n", ":2: unknown key 'not_a_key'"),
    ("listen: 0.0.0.0:19999\n", "not loopback: set a token"),
    ("tick_s: fast\n", "tick_s"),
    ("tick_s: 1\npeers: [node2:19500]\n", ":2: peers: 'node2:19500' is not a daemon's base URL"),
    ("peers: {node2: 19500}\n", ":1: peers: a dict is not a valid list"),
    ("peer_max_age_s: 0\n", ":1: peer_max_age_s: 0 is not a number of seconds within 0.1.."),
    ("tick_s: 1\nopen_after_s: {healty: 5}\n",
     ":2: open_after_s: 'healty' is not a verdict that opens an incident"),
    ("open_after_s:\n  straggler: soon\n", ":1: open_after_s: straggler: 'soon' is not a number"),
    ("peers: [http://node2:19500]\npeer_max_age_s: 2\n",
     "peer_max_age_s (2) must exceed tick_s + probe_timeout_s (3)"),
])
def test_bad_config_exits_78_naming_file_and_line(tmp_path, content, message):
    path = tmp_path / "c.yaml"
    path.write_text(content)
    out = subprocess.run([sys.executable, "-m", "ddpwatch", "run", "--config", str(path)],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 78, out.stderr
    assert str(path) in out.stderr and message in out.stderr
    assert "Traceback" not in out.stderr


def test_status_command_without_a_daemon_says_so():
    out = subprocess.run([sys.executable, "-m", "ddpwatch", "status", "--url",
                          f"http://127.0.0.1:{free_port()}"], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 69 and "no daemon answers" in out.stderr


def test_http_endpoints_and_token(start_job, tmp_path, hb_dir):
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"token": "t0ken"})
    assert get(daemon.url + "/healthz")[0] == 200
    assert get(daemon.url + "/nope")[0] == 404
    assert get(daemon.url + "/status")[0] == 401
    assert get(daemon.url + "/status", "wrong")[0] == 401
    assert daemon.status(token="t0ken")["tick"] >= 1
    assert b"ddpwatch_up 1.0" in get(daemon.url + "/metrics")[1]


def test_systemd_ready_after_first_tick_and_sigterm_flushes_and_stops(
        start_job, tmp_path, hb_dir, receivers):
    import socket as socketlib
    notify_path = str(tmp_path / "notify.sock")
    sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_DGRAM)
    sock.bind(notify_path)
    sock.settimeout(60)
    hook = receivers([(200, {}, 3.0)])  # a slow receiver: the flush must wait for it
    port = free_port()
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"listen": f"127.0.0.1:{port}",
                                  "state_dir": str(tmp_path / "state"),
                                  "webhooks": [{"type": "generic", "url": hook.url}]}))
    daemon = start_job([sys.executable, "-m", "ddpwatch", "run", "--config", str(config)],
                       env={"NOTIFY_SOCKET": notify_path}, name="daemon")
    try:
        assert sock.recv(256) == b"READY=1"  # sent once the first tick is published
        assert get(f"http://127.0.0.1:{port}/readyz")[0] == 200
        trainer = trainer_job(start_job, "stop:rank=1:step=5")
        wait_until(lambda: hook.requests, 180, what="the firing alert")
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(30) == 0
        assert sock.recv(256) == b"STOPPING=1"
        assert "stopped (0 alert(s) left undelivered)" in daemon.output()
        assert trainer.proc.poll() is None  # watching never touched the job
    finally:
        sock.close()


def test_stacks_on_request_for_a_healthy_job(start_job, tmp_path, hb_dir):
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {})
    trainer = trainer_job(start_job)
    # healthy, and past any start-up suspicion: no py-spy runs for a healthy job
    wait_until(lambda: (lambda s: s if s["job"]["verdict"] == "healthy" and with_heartbeats(s)
                        and all(r["stack"] == "" for r in s["ranks"]) else None)(
        our_status(daemon, trainer)), 180, what="a healthy job without stacks")
    asked = [0.0]

    def stacks_shown():
        # a person asks again when a dump came back empty (py-spy timed out on a
        # loaded machine); the daemon serves one request per stacks_min_interval_s
        if time.monotonic() - asked[0] > 6.0:
            get(daemon.url + "/status?stacks=1")
            asked[0] = time.monotonic()
        s = our_status(daemon, trainer)
        return s if all(r["stack"] for r in s["ranks"]) and len(s["ranks"]) == 2 else None
    with_stacks = wait_until(stacks_shown, 60, what="stacks after the request")
    assert with_stacks["job"]["verdict"] == "healthy"


def test_no_stacks_for_a_starting_job_until_the_grace_ends(start_job, tmp_path, hb_dir,
                                                            need_py_spy):
    """A job no rule can judge in its first seconds is starting: py-spy waits out
    watch/look.py STARTUP_GRACE_S (real /proc and py-spy; the daemon's clock is ours)."""
    from ddpwatch.config import load
    from ddpwatch.daemon import Daemon, load_rules
    from ddpwatch.watch.look import STARTUP_GRACE_S
    port = free_port()
    job = start_job([sys.executable, "-c", "import time; time.sleep(120)"],
                    env={"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    key = f"127.0.0.1:{port}"
    now = [1000.0]
    cfg = load(None, {"state_dir": str(tmp_path / "state"), "heartbeat_dir": hb_dir})
    daemon = Daemon(cfg, load_rules(cfg), clock=lambda: now[0])

    def stacks_taken(at: float):
        now[0] = 1000.0 + at
        view = daemon.tick()
        mine = next((j for j in view.jobs if j.key == key), None)
        return mine, mine is not None and mine.last.stacks is not None
    mine = wait_until(lambda: stacks_taken(0.0)[0], 60, what="the job discovered")
    assert mine.judgement.job.verdict == "unknown", "the test needs a job no rule judges"
    assert not stacks_taken(STARTUP_GRACE_S - 1)[1]
    assert stacks_taken(STARTUP_GRACE_S + 1)[1]
    assert job.proc.poll() is None


def test_a_firewall_on_this_node_is_named_from_the_wire(start_job, tmp_path, hb_dir, netns):
    """docs/design.md "A firewall that drops Gloo's data connections", seen by the daemon
    of the node whose firewall lets MASTER_PORT in and drops the rest: the second
    node's Gloo connects arrive on the veth and are never answered. Its packet capture
    counts them across ticks (they come seconds apart) and names this node's firewall,
    not the rank whose connects sit in SYN-SENT."""
    port = free_port()
    drop = ["INPUT", "-i", netns["host_if"], "-p", "tcp", "--syn", "!", "--dport", str(port),
            "-j", "DROP"]
    subprocess.run(["iptables", "-A", *drop], check=True)
    try:
        daemon = DaemonRun(start_job, tmp_path, hb_dir, {})
        by_hand(start_job, 0, netns["host_addr"], port,
                env={"GLOO_SOCKET_IFNAME": netns["host_if"]})
        by_hand(start_job, 1, netns["host_addr"], port,
                env={"GLOO_SOCKET_IFNAME": netns["peer_if"]}, prefix=netns["exec"])
        key = f"{netns['host_addr']}:{port}"

        def named():
            job = next((j for j in daemon.status()["jobs"] if j["key"] == key), None)
            return job if job and job["job"]["culprits"] == [0] else None
        job = wait_until(named, 120, what="rank 0's node named in /status")
    finally:
        subprocess.run(["iptables", "-D", *drop], check=False)
    ranks = {r["rank"]: r for r in job["ranks"]}
    assert ranks[0]["rule"] == "dropped-inbound"
    assert ranks[0]["signals"]["syn_in_from"] == netns["peer_addr"]
    assert ranks[1]["rule"] == "unreachable-peer-dropped-there"
    assert 'ddpwatch_probe_success{probe="traffic"} 1.0' in daemon.metrics()
