"""Attacks on the daemon's surface (docs/architecture.md "What a local user may
cost it", "Who may speak for the daemon"): each attack run for real against a
real `python -m ddpwatch run` (root, loopback, its own state dir and config);
where the attack is a local user's, the attacker runs as uid 65534 (setpriv).
Each test asserts the daemon keeps ticking, prints no traceback, and stays within
bounds."""
from __future__ import annotations

import ast
import json
import os
import resource
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

import otheruser
from attacker import (NOBODY, job_with, keeps_ticking, need_root, no_traceback,
                      python_as_nobody, refused_counts)
from conftest import REPO, free_port, need, wait_until
from daemons import DaemonRun, get

# strong: the daemon listens on 0.0.0.0 below (ddpwatch/signed/strength.py)
TOKEN = "c1f94e0b7a3d26e8f05b9c4a712d3e6f8b0a59c7d41e26f3a8b7c0d9e5f14a2b"
WHSEC = "whsec_c2VjcmV0LWZvci10ZXN0cy1vbmx5"
HOOK_PATH = "T0SECRET/B1SECRET/xyzSECRET"
SECRETS = (TOKEN, WHSEC, "pw-SECRET", HOOK_PATH)

# a 342-byte billion-laughs document: 9^9 "lol"s once expanded
ALIAS_BOMB = "a: &a [" + ",".join(['"lol"'] * 9) + "]\n" + "".join(
    f"{n}: &{n} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, n in zip("abcdefgh", "bcdefghi"))

# (name, bytes, line the error must name: for webhooks, the `webhooks:` line and the
# item's index)
BAD_FILES = [
    ("list_as_key", b"tick_s: 1\n[a]: 1\n", 2),
    ("python_tag", b"tick_s: !!python/name:os.system\n", 1),
    ("python_apply", b"log_format: text\ntick_s: !!python/object/apply:os.system [id]\n", 2),
    ("binary", b"tick_s: 1\n\xff\xfe\x00\x01\x80binary\n", 2),
    ("control_char", b"tick_s: 1\nlog_format: \x1b[31m\n", 2),
    ("inf", b"tick_s: .inf\n", 1),
    ("nan", b"tick_s: .nan\n", 1),
    ("too_small", b"tick_s: 0.0001\n", 1),
    ("window_nan", b"tick_s: 1\nwindow_s: .nan\n", 2),
    ("unknown_key", b"tick_s: 1\nmystery: 2\n", 2),
    ("deep", b"tick_s: " + b"[" * 5000 + b"\n", 1),
    ("alias_bomb", ALIAS_BOMB.encode(), 2),
    ("token_not_str", f"token: [{TOKEN}]\n".encode(), 1),
    ("webhook_secret_not_str", f"webhooks:\n  - type: generic\n    url: http://u:pw-SECRET@127.0.0.1:9/{HOOK_PATH}\n    secret: [{WHSEC}]\n".encode(), 1),
    ("webhook_bad_scheme", f"webhooks:\n  - type: generic\n    url: ftp://u:pw-SECRET@127.0.0.1/{HOOK_PATH}\n    secret: {WHSEC}\n".encode(), 1),
    ("peer_with_credentials", b"tick_s: 1\npeers: [http://u:pw-SECRET@node2:19500]\n", 2),
    ("webhook_timeout_nan", f"webhooks:\n  - {{type: generic, url: 'http://u:pw-SECRET@127.0.0.1:9/{HOOK_PATH}', timeout_s: .nan}}\n".encode(), 1),
]


def run_cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "ddpwatch", *args], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=REPO))


def refusals(daemon) -> list[str]:
    return [line for line in daemon.job.output().splitlines() if "reload refused" in line]


# --- config at start-up and on SIGHUP -----------------------------------------------
HEAP_LIMIT = 256 * 1024 * 1024


@pytest.mark.parametrize("name, content, line", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_start_with_a_bad_file_exits_78_naming_file_and_line(tmp_path, name, content, line):
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(content)
    # The alias bomb took 15 s and 809 MB; any file must be refused within
    # an interpreter's worth of memory. A limit on the daemon's heap, not its
    # ru_maxrss: a forked child's high-water mark starts at its parent's size (this
    # test process holds whatever earlier tests imported).
    def small_heap():
        resource.setrlimit(resource.RLIMIT_DATA, (HEAP_LIMIT, HEAP_LIMIT))
    proc = subprocess.Popen([sys.executable, "-m", "ddpwatch", "run", "--config", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=REPO), preexec_fn=small_heap)
    started = time.monotonic()
    _, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - started
    err = err.decode("utf-8", "replace")
    assert proc.returncode == 78, err
    assert f"{path}:{line}:" in err and "Traceback" not in err, err
    assert not any(s in err for s in SECRETS), err
    assert elapsed < 30, elapsed


def test_sighup_with_each_bad_file_keeps_the_running_config(start_job, tmp_path, hb_dir,
                                                             receivers):
    hook = receivers()
    port = hook.url.rsplit(":", 1)[1].split("/")[0]
    good = {"token": TOKEN, "tick_s": 0.5,
            "webhooks": [{"type": "generic", "secret": WHSEC,
                          "url": f"http://u:pw-SECRET@127.0.0.1:{port}/{HOOK_PATH}"}]}
    daemon = DaemonRun(start_job, tmp_path, hb_dir, good)
    # the running config's secrets above each bad part (which adds its own)
    header = (f"token: {TOKEN}\npeer_token: {TOKEN}\nlisten: 127.0.0.1:{daemon.port}\n"
              f"state_dir: {daemon.state_dir}\nheartbeat_dir: ''\n").encode()
    for i, (name, content, line) in enumerate(BAD_FILES):
        daemon.config_path.write_bytes(header + content)
        sent = time.monotonic()
        daemon.job.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: len(refusals(daemon)) == i + 1, 30, what=f"reload of {name} refused")
        took = time.monotonic() - sent
        last = refusals(daemon)[-1]
        assert f"{daemon.config_path}:{line + 5}:" in last, last
        assert daemon.job.proc.poll() is None, f"{name} killed the daemon"
        assert took < 10, f"{name}: reload took {took:.1f}s"  # the bomb: 15 s before
    out = daemon.job.output()
    assert not any(s in out for s in SECRETS), out[-3000:]
    no_traceback(daemon)
    assert get(daemon.url + "/status")[0] == 401  # the old token still in force
    keeps_ticking(daemon, TOKEN)
    assert daemon.status(TOKEN)["node"]
    rss = psutil.Process(daemon.job.proc.pid).memory_info().rss
    assert rss < 300 * 2**20, f"daemon at {rss >> 20} MB after the alias bomb"


def listening(pid: int) -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN}


def test_reload_moves_the_socket_or_is_refused_never_serving_without_the_token(
        start_job, tmp_path, hb_dir):
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"token": TOKEN, "tick_s": 0.5})
    pid, port = daemon.job.proc.pid, daemon.port
    # 1. off loopback (all addresses), with a token
    daemon.write({"token": TOKEN, "tick_s": 0.5, "listen": f"0.0.0.0:{port}"})
    daemon.job.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: listening(pid) == {("0.0.0.0", port)}, 30, what="bound on 0.0.0.0")
    assert get(daemon.url + "/status")[0] == 401 and get(daemon.url + "/peer")[0] == 401
    # 2. back to loopback and the token dropped: the 0.0.0.0 socket must go
    daemon.write({"tick_s": 0.5, "listen": f"127.0.0.1:{port}"})
    daemon.job.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: listening(pid) == {("127.0.0.1", port)}, 30, what="only 127.0.0.1")
    assert get(daemon.url + "/status")[0] == 200
    # 3. off loopback without a token: refused, still loopback only
    other = free_port()
    daemon.write({"tick_s": 0.5, "listen": f"0.0.0.0:{other}"})
    daemon.job.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: len(refusals(daemon)) == 1, 30, what="reload refused")
    assert "not loopback: set a token" in refusals(daemon)[-1]
    assert listening(pid) == {("127.0.0.1", port)}
    # 4. a port someone else holds: refused with the reason, old socket still serving
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        taken = squatter.getsockname()[1]
        daemon.write({"token": TOKEN, "tick_s": 0.5, "listen": f"127.0.0.1:{taken}"})
        daemon.job.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: len(refusals(daemon)) == 2, 30, what="second reload refused")
        assert f"cannot listen on 127.0.0.1:{taken}" in refusals(daemon)[-1]
        assert listening(pid) == {("127.0.0.1", port)}
        assert get(daemon.url + "/status")[0] == 200  # the running config: no token
    # 5. a free loopback port with a token: moved, and the token in force there
    new_port = free_port()
    daemon.write({"token": TOKEN, "tick_s": 0.5, "listen": f"127.0.0.1:{new_port}"})
    daemon.job.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: listening(pid) == {("127.0.0.1", new_port)}, 30, what="moved")
    daemon.url = f"http://127.0.0.1:{new_port}"
    assert get(daemon.url + "/status")[0] == 401
    keeps_ticking(daemon, TOKEN)
    no_traceback(daemon)


# --- HTTP ---------------------------------------------------------------------------
IDLE_ATTACK = r"""
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
held, failed = [], 0
for _ in range(n):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", port))
        held.append(s)
    except OSError:
        failed += 1
        s.close()
print(f"opened {len(held)} failed {failed}", flush=True)
time.sleep(600)
"""


def test_1030_idle_connections_neither_exhaust_descriptors_nor_stall_metrics(
        start_job, tmp_path, hb_dir):
    need_root()
    need(shutil.which("prlimit") is not None, "prlimit (util-linux) missing")
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"tick_s": 0.5})
    pid = daemon.job.proc.pid
    attacker = start_job(python_as_nobody("-c", IDLE_ATTACK, str(daemon.port), "1030",
                                          nofile=4096), name="idle-attacker")
    wait_until(lambda: "opened" in attacker.output(), 120, what="1030 connections opened")
    opened = int(re.search(r"opened (\d+)", attacker.output()).group(1))
    assert opened >= 1000, attacker.output()
    # while they are held open: /metrics answers within a scrape timeout, and the
    # daemon holds a bounded number of descriptors
    started = time.monotonic()
    code, body = get(daemon.url + "/metrics")
    assert code == 200 and b"ddpwatch_up 1.0" in body and time.monotonic() - started < 10
    assert psutil.Process(pid).num_fds() < 300
    keeps_ticking(daemon)
    metrics = get(daemon.url + "/metrics")[1].decode()
    assert 'ddpwatch_probe_success{probe="heartbeats"} 1.0' in metrics  # discovery not EMFILE
    refused = refused_counts(metrics)
    assert refused.get("evicted", 0) + refused.get("expired", 0) > 0, refused
    no_traceback(daemon)


DRIP_ATTACK = r"""
import socket, sys, time
port, n, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
request = b"GET /status HTTP/1.0\r\nX-Slow: " + b"a" * 4000 + b"\r\n\r\n"
conns, sent = [], 0
end = time.monotonic() + seconds
print("dripping", flush=True)
while time.monotonic() < end:
    while len(conns) < n:  # keep n connections dripping; reopen the ones cut
        try:
            conns.append([socket.create_connection(("127.0.0.1", port), timeout=5), 0])
        except OSError:
            break
    for c in list(conns):
        try:
            c[0].send(request[c[1]:c[1] + 1]); c[1] += 1; sent += 1
        except OSError:
            conns.remove(c)
    time.sleep(0.5)
print("sent", sent, flush=True)
"""


def test_slow_dripping_clients_hold_no_worker(start_job, tmp_path, hb_dir):
    """40 connections sending a byte every half second (slowloris), reopened as
    they are cut: /metrics still answers at once, every time."""
    need_root()
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"tick_s": 0.5})
    attacker = start_job(python_as_nobody("-c", DRIP_ATTACK, str(daemon.port), "40",
                                          "12"), name="drip-attacker")
    wait_until(lambda: "dripping" in attacker.output(), 60, what="the drip attack")
    time.sleep(1)  # let the drippers take their places (not a synchronisation)
    for _ in range(8):
        started = time.monotonic()
        code, _ = get(daemon.url + "/metrics")
        assert code == 200 and time.monotonic() - started < 5, code
        time.sleep(0.5)
    wait_until(lambda: "sent" in attacker.output(), 60, what="the end of the drip attack")
    # what the server refused is in /metrics: the drippers were cut or expired
    refused = refused_counts(get(daemon.url + "/metrics")[1].decode())
    assert refused.get("cut", 0) + refused.get("expired", 0) > 0, refused
    keeps_ticking(daemon)
    no_traceback(daemon)


RESET_ATTACK = r"""
import socket, struct, sys
port = int(sys.argv[1])
def rst(s):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
for i in range(150):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    kind = i % 5
    if kind == 0:
        s.sendall(b"GET /status HTTP/1.0\r\n")          # half a request, then RST
    elif kind == 1:
        s.sendall(b"GET /status HTTP/1.0\r\n\r\n")      # ask, and RST before reading
    elif kind == 2:
        s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(200))  # TLS hello
    elif kind == 3:
        s.sendall(b"GET /" + b"A" * 70000 + b" HTTP/1.0\r\n\r\n")  # an overlong line
    else:
        s.sendall(b"GET /metrics HTTP/1.0\r\n" + b"X: y\r\n" * 200 + b"\r\n")  # many headers
    rst(s)
print("done", flush=True)
"""


def test_client_resets_and_garbage_log_no_traceback_and_json_stays_json(
        start_job, tmp_path, hb_dir):
    need_root()
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"tick_s": 0.5, "log_format": "json"})
    attacker = start_job(python_as_nobody("-c", RESET_ATTACK, str(daemon.port)),
                         name="reset-attacker")
    wait_until(lambda: "done" in attacker.output(), 120, what="the reset attack")
    keeps_ticking(daemon)
    out = daemon.job.output()
    assert "Traceback" not in out, out[-3000:]
    for line in out.splitlines():
        json.loads(line)  # every line the daemon printed is a JSON log record


HONEST_RANK = r"""
import os, socket, time
from ddpwatch.heartbeat import writer
w = writer.open_writer(os.environ["DDPWATCH_DIR"])
# an established TCP connection in the rank's network namespace, idle
server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname())
peer, _ = server.accept()
client.sendall(b"x"); peer.recv(1)
print("ready", w.path, flush=True)
while True:
    w.step()
    time.sleep(0.5)
"""


def fake_rank_script(honest: bool = False) -> str:
    """A user's process that looks like a rank and writes its own heartbeat record,
    with NaN and infinities in every float of it (its own record: allowed); or
    (honest) steps every 0.5 s and holds an idle TCP connection."""
    if honest:
        return HONEST_RANK
    return r"""
import math, mmap, os, struct, time
from ddpwatch.heartbeat import layout, writer
w = writer.open_writer(os.environ["DDPWATCH_DIR"])
w.step(); w.step()
fd = os.open(w.path, os.O_RDWR)
mem = mmap.mmap(fd, layout.RECORD_SIZE)
poison = [float("nan"), float("inf"), float("-inf")]
print("ready", w.path, flush=True)
while True:
    for i, (name, code) in enumerate(layout.PROGRESS_FIELDS):
        if code == "d":
            struct.pack_into("<d", mem, layout.PROGRESS_OFFSET + 8 * i, poison[i % 3])
    time.sleep(0.2)
"""


ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31mrun\r\u202e"


def start_fake_rank(start_job, shared_dir, run_id="hostile-run", as_root=False, honest=False,
                    prefix=()):
    port = free_port()
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": run_id,
           "DDPWATCH_DIR": os.path.join(shared_dir, "hb-root" if as_root else "hb-user")}
    os.makedirs(env["DDPWATCH_DIR"], mode=0o700, exist_ok=True)
    if not as_root:
        os.chown(env["DDPWATCH_DIR"], NOBODY, NOBODY)
    argv = ([sys.executable, "-c", fake_rank_script(honest)] if as_root else
            python_as_nobody("-c", fake_rank_script(honest)))
    job = start_job([*prefix, *argv], env=env, name="fake-rank")
    wait_until(lambda: "ready" in job.output(), 60, what="the fake rank's record")
    rank_pid = next(p.pid for p in job.processes() if "python" in p.name())
    return job, rank_pid


def strict_json(body: bytes):
    def refuse(name):
        raise AssertionError(f"/status carries {name}")
    return json.loads(body, parse_constant=refuse)


def test_nan_in_a_users_record_never_reaches_status_json(start_job, tmp_path, hb_dir,
                                                        shared_dir):
    need_root()
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"tick_s": 0.5})
    _, pid = start_fake_rank(start_job, shared_dir)
    wait_until(lambda: job_with(strict_json(get(daemon.url + "/status")[1]), pid), 60,
               what="the user's rank in /status")
    for _ in range(5):  # several ticks over the poisoned record, each strict JSON
        code, body = get(daemon.url + "/status")
        assert code == 200
        strict_json(body)
        strict_json(get(daemon.url + "/peer")[1])
        time.sleep(0.5)
    keeps_ticking(daemon)
    no_traceback(daemon)


def test_escape_sequences_from_a_user_are_shown_escaped_by_status(start_job, tmp_path, hb_dir,
                                                                  shared_dir):
    need_root()
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"tick_s": 0.5})
    _, pid = start_fake_rank(start_job, shared_dir, run_id=ESCAPES, honest=True)
    wait_until(lambda: job_with(daemon.status(), pid), 60, what="the user's rank in /status")
    out = run_cli("status", "--url", daemon.url)
    assert out.returncode == 0, out.stderr
    assert str(pid) in out.stdout
    shown = out.stdout
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]", shown), repr(shown)
    # the other commands that print what ranks wrote: `ranks` (the run id in its
    # table) and `diagnose` (a report a person reads)
    for args in (("ranks",), ("diagnose", "--no-stacks", str(pid))):
        out = run_cli(*args)
        assert str(pid) in out.stdout, (args, out.stdout, out.stderr)
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]",
                             out.stdout + out.stderr), (args, repr(out.stdout + out.stderr))
    keeps_ticking(daemon)
    no_traceback(daemon)


STACKS_ATTACK = r"""
import sys, time, urllib.request, urllib.error
url, seconds = sys.argv[1], float(sys.argv[2])
codes = {}
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        with urllib.request.urlopen(url + "/status?stacks=1", timeout=10) as r:
            r.read(); codes[r.status] = codes.get(r.status, 0) + 1
    except urllib.error.HTTPError as err:
        codes[err.code] = codes.get(err.code, 0) + 1
    time.sleep(0.02)
print("codes", codes, flush=True)
"""


def dumps_total(daemon) -> int:
    """py-spy runs since the daemon started, as /metrics says (the sampler's count,
    ddpwatch_stack_dumps_total). A dump lasts about 10 ms: polling the daemon's
    children missed root's requested one in a full run."""
    found = re.search(r"^ddpwatch_stack_dumps_total (\S+)$", daemon.metrics(), re.M)
    assert found, "no ddpwatch_stack_dumps_total in /metrics"
    return int(float(found.group(1)))


def dumps_over(daemon, seconds: float) -> int:
    """py-spy runs of the daemon's ticks over the next `seconds` (the count of the
    last tick before the end: what a tick under way dumps is counted by the next)."""
    before = dumps_total(daemon)
    time.sleep(seconds)  # an interval counted, not a state awaited
    return dumps_total(daemon) - before


@pytest.mark.parametrize("token", ["", TOKEN], ids=["no-token", "token"])
def test_stacks_requests_in_a_loop_run_py_spy_a_bounded_number_of_times(
        start_job, tmp_path, hb_dir, shared_dir, need_py_spy, token):
    need_root()
    config = {"tick_s": 0.5, "stacks_min_interval_s": 5, **({"token": token} if token else {})}
    daemon = DaemonRun(start_job, tmp_path, hb_dir, config)
    _, pid = start_fake_rank(start_job, shared_dir, as_root=True)
    wait_until(lambda: job_with(daemon.status(token=token or None), pid), 60,
               what="the rank in /status")
    attacker = start_job(python_as_nobody("-c", STACKS_ATTACK, daemon.url, "8"),
                         name="stacks-attacker")
    runs = dumps_over(daemon, 8.5)  # the one rank is the only one on the node
    wait_until(lambda: "codes" in attacker.output(), 60, what="the attacker's tally")
    codes = ast.literal_eval(attacker.output().split("codes", 1)[1].strip())  # {status: n}
    assert sum(codes.values()) > 50, codes
    if token:
        assert set(codes) == {401}, codes  # no token, no stacks, no /status
    # 8 s at one dump per 5 s on request plus one per 5 s on suspicion, per rank
    # (16 runs in 8 s when every request forced one)
    assert runs <= 5, runs
    keeps_ticking(daemon, token or None)
    no_traceback(daemon)


ONE_STACKS_REQUEST = r"""
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/status?stacks=1", timeout=20) as r:
    print("status", r.status, r.headers.get("X-Ddpwatch-Stacks", "asked"), flush=True)
"""


def test_a_users_stacks_request_dumps_only_their_own_ranks(start_job, tmp_path, hb_dir,
                                                           need_py_spy):
    """Before, any local user's /status?stacks=1 made the next tick dump every
    job's ranks, other users' included. Now a request dumps the jobs its asker
    may see (publish/viewer.py): root's healthy job is left alone when uid 65534
    asks, and dumped when root does."""
    need_root()
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"tick_s": 0.5, "stacks_min_interval_s": 1})
    from daemons import trainer_job
    trainer = trainer_job(start_job)
    wait_until(lambda: (lambda j: j if j and j["job"]["verdict"] == "healthy"
                        and len(j["ranks"]) == 2 else None)(
        next((j for j in daemon.status()["jobs"] if {r["pid"] for r in j["ranks"]}
              <= {p.pid for p in trainer.processes()} and j["ranks"]), None)), 180,
        what="root's job healthy")
    # root's job is the only one on the node: the daemon's count of py-spy runs
    # is its ranks' dumps
    assert dumps_over(daemon, 2.0) == 0  # healthy: no dumps of its own
    asker = start_job(python_as_nobody("-c", ONE_STACKS_REQUEST, daemon.url), name="asker")
    wait_until(lambda: "status" in asker.output(), 60, what="uid 65534's request answered")
    assert "status 200 asked" in asker.output(), asker.output()
    assert dumps_over(daemon, 3.0) == 0, "uid 65534's request dumped root's ranks"
    before = dumps_total(daemon)
    code, _ = get(daemon.url + "/status?stacks=1")  # root asks: dumped
    assert code == 200
    wait_until(lambda: dumps_total(daemon) - before >= 2, 10,
               what=lambda: f"root's own request to dump its 2 ranks (py-spy runs "
                            f"{dumps_total(daemon) - before})")
    no_traceback(daemon)


# --- the unit -----------------------------------------------------------------------
UNIT = os.path.join(REPO, "systemd", "ddpwatch.service")


def test_unit_exposure_is_at_most_3():
    need(shutil.which("systemd-analyze") is not None, "systemd-analyze (Debian systemd) missing")
    out = subprocess.run(["systemd-analyze", "security", "--offline=yes", UNIT],
                         capture_output=True, text=True, timeout=120)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out.stdout + out.stderr)
    assert m, out.stdout + out.stderr
    assert float(m.group(1)) <= 3.0, out.stdout
    text = open(UNIT).read()
    for directive in ("SystemCallFilter=", "SystemCallArchitectures=native",
                      "RestrictNamespaces=net", "ProtectClock=yes", "ProtectKernelLogs=yes",
                      "ProtectHostname=yes", "UMask=0077", "LimitNOFILE=",
                      "RestartPreventExitStatus=78"):
        assert directive in text, directive
    # it reads other processes and never writes them (a taken-over daemon included)
    allowed = allowed_syscalls(unit_directives()["SystemCallFilter"])
    assert "process_vm_readv" in allowed and "setns" in allowed
    assert not {"process_vm_writev", "ptrace"} & allowed
    caps = re.search(r"^CapabilityBoundingSet=(.*)$", text, re.M).group(1).split()
    assert set(caps) == {"CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_NET_RAW",
                         "CAP_SYS_ADMIN", "CAP_NET_ADMIN"}


SERVICE_UID = 61873  # in systemd's DynamicUser range (61184-65519)


def unit_directives(path: str = UNIT) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def syscall_groups() -> dict[str, list[str]]:
    out = subprocess.run(["systemd-analyze", "syscall-filter", "--no-pager"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    groups, current = {}, None
    for line in out.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.split()[0], [])
        elif current is not None and line.strip() and not line.strip().startswith("#"):
            current.append(line.split()[0])
        elif not line.strip():
            current = None
    return groups


def allowed_syscalls(filters: list[str]) -> set[str]:
    """The set a unit's SystemCallFilter= lines let through (allow list, then ~deny)."""
    groups = syscall_groups()

    def expand(names, seen=()):
        result = set()
        for name in names:
            if name.startswith("@"):
                if name not in seen:
                    result |= expand(groups.get(name, ()), (*seen, name))
            else:
                result.add(name)
        return result
    allowed: set[str] = set()
    for value in filters:
        if value.startswith("~"):
            allowed -= expand(value[1:].split())
        else:
            allowed |= expand(value.split())
    return allowed


def metric(text: str, name: str, **labels) -> float | None:
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels
                   else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_every_probe_works_with_only_the_units_privileges(start_job, shared_dir, netns,
                                                          need_py_spy):
    """The daemon as the unit runs it, as far as that goes without systemd: a
    non-root uid holding exactly the unit's capabilities (ambient, bounding set),
    no_new_privs, its UMask and LimitNOFILE, traced by strace so every system call
    it and its helpers (py-spy, nsenter, ss, ip) made is checked against the
    unit's SystemCallFilter, and no writable+executable mapping is made
    (MemoryDenyWriteExecute). The job is a user's (uid 65534) rank in a network
    namespace of its own, its record 0600 in a 0700 directory."""
    need_root()
    need(shutil.which("strace") is not None, "strace (Debian strace) missing")
    need(shutil.which("systemd-analyze") is not None, "systemd-analyze (Debian systemd) missing")
    unit = unit_directives()
    caps = unit["CapabilityBoundingSet"][0].split()
    assert caps == unit["AmbientCapabilities"][0].split()
    capset = "-all," + ",".join("+" + c.lower().removeprefix("cap_") for c in caps)
    nofile = unit["LimitNOFILE"][0]
    umask = unit["UMask"][0]
    state = os.path.join(shared_dir, "state")
    os.makedirs(state)
    os.chown(state, SERVICE_UID, SERVICE_UID)
    port = free_port()
    config = os.path.join(shared_dir, "config.yaml")
    with open(config, "w") as f:
        f.write(f"listen: 127.0.0.1:{port}\ntick_s: 0.5\nprobe_timeout_s: 10\n"
                f"stacks_min_interval_s: 5\n")
    os.chmod(config, 0o644)
    trace = os.path.join(state, "strace.txt")
    _, pid = start_fake_rank(start_job, shared_dir, honest=True, prefix=netns["exec"])
    argv = ["prlimit", f"--nofile={nofile}:{nofile}",
            "setpriv", f"--reuid={SERVICE_UID}", f"--regid={SERVICE_UID}", "--clear-groups",
            f"--inh-caps={capset}", f"--ambient-caps={capset}", f"--bounding-set={capset}",
            "--no-new-privs",
            "sh", "-c", f'umask {umask} && exec strace -f -qq -s 64 -o "$0" "$@"', trace,
            *otheruser.runtime().argv("-m", "ddpwatch", "run", "--config", config)]
    daemon = start_job(argv, env={"DDPWATCH_STATE_DIR": state}, name="sandboxed-daemon")
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: get(url + "/readyz")[0] == 200, 120, what="the sandboxed daemon ready")
    status = lambda: json.loads(get(url + "/status")[1])  # noqa: E731

    def ours():
        job = job_with(status(), pid)
        return job and next(r for r in job["ranks"] if r["pid"] == pid)
    # process: the rank is found at all only if its environ (RANK...) is readable
    rank = wait_until(ours, 120, what="the user's rank discovered (CAP_SYS_PTRACE)")
    # heartbeats: a 0600 record in a 0700 directory of uid 65534
    wait_until(lambda: (ours() or {}).get("signals", {}).get("hb_step") is not None, 60,
               what="the user's record read (CAP_DAC_READ_SEARCH)")
    # stacks: py-spy of a process of another uid; sockets: ss inside its namespace
    # a dump's stacks and the detailed sockets read after it show in the ticks that
    # took them (the rank steps on, so they are not kept): watch for each
    deadline, stack, sockets, rank = time.monotonic() + 120, False, False, None
    while time.monotonic() < deadline and not (stack and sockets):
        get(url + "/status?stacks=1")  # at most one dump per 5 s: the rate limit
        rank = ours() or {}
        stack = stack or bool(rank.get("stack"))
        sockets = sockets or rank.get("signals", {}).get("peer_idle_s") is not None
        time.sleep(0.5)
    assert stack, f"no py-spy stacks of another user's rank (CAP_SYS_PTRACE): {rank}"
    assert sockets, f"sockets not read in the rank's namespace (nsenter: CAP_SYS_ADMIN): {rank}"
    text = get(url + "/metrics")[1].decode()
    for probe in ("heartbeats", "process", "traffic", "host", "exits"):
        if probe == "host" and metric(text, "ddpwatch_probe_success", probe=probe) is None:
            continue  # host runs on the first tick and every 60th
        assert metric(text, "ddpwatch_probe_success", probe=probe) == 1.0, (probe, text)
    assert "Traceback" not in daemon.output(), daemon.output()[-3000:]
    daemon.kill()
    # every system call made is one the unit's filter lets through
    allowed = allowed_syscalls(unit["SystemCallFilter"])
    made, wx, program, refused, setns = set(), [], {}, set(), []
    with open(trace) as f:
        for line in f:
            m = re.match(r"(\d+)\s+(?:<\.\.\. )?([a-z0-9_]+)[( ]", line)
            if not m:
                continue
            tid, call = m.groups()
            made.add(call)
            if call == "execve":
                program[tid] = line  # -s 0 hides the path; the pid tells the helper
            if call not in allowed:
                refused.add((call, program.get(tid, "?")[:200]))
            if re.search(r"\b(mmap|mprotect|pkey_mprotect)\(.*PROT_WRITE\|PROT_EXEC", line):
                wx.append(line.strip())
            # RestrictNamespaces=net: entering or making any other namespace is refused
            if call in ("setns", "unshare", "clone", "clone3") and re.search(
                    r"CLONE_NEW(NS|PID|UTS|IPC|USER|CGROUP|TIME)\b", line):
                refused.add((f"{call} (RestrictNamespaces=net)", line.strip()[:200]))
            if call == "setns":
                setns.append(line.strip())
    assert made and not refused, sorted(refused)
    assert any("CLONE_NEWNET" in line for line in setns), "nsenter never entered a namespace"
    assert not wx, wx[:5]
    assert oct(os.stat(trace).st_mode & 0o777) == "0o600"  # the unit's UMask applied
