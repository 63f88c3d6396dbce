"""The daemon's port and its token, attacked for real by an unprivileged user
(uid 65534) beside a real root daemon and a real 2-rank trainer job.

While a daemon is down (boot, a restart after a crash) its port is free, and
any user could bind it first. Before: the restarted daemon exited 69, and the
daemon's clients (`ddpwatch status`, the peers' daemons) sent `Authorization:
Bearer <token>` to the squatter and believed its answers, forged `alerting`
claims included (publish/alerts/route.py), so one user on one node could read
the cluster's token and silence a job's pages.

Now (README, "Trust model"): clients sign requests and never send the token,
and use an answer only if it proves the token (ddpwatch/signed/auth.py); and
under systemd the port is systemd's (systemd/ddpwatch.socket), held across
restarts, so nobody can take it at all (ddpwatch/sdnotify.py listen_socket).

And who may read what: a daemon without a token (loopback only) shows each
local user their own jobs only (ddpwatch/publish/viewer.py).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import pytest

from attacker import as_nobody, need_root
from conftest import REPO, free_port, need, wait_until
from daemons import DaemonRun, get, our_status, rank_pid, trainer_job

PYTHON = "/usr/bin/python3"  # the checkout's venv may be out of nobody's reach
TOKEN = "cluster-token-0123456789abcdef"  # loopback: any strength


def need_setup():
    need_root()
    need(os.access(PYTHON, os.X_OK), f"{PYTHON} missing")


@pytest.fixture
def playground():
    """A directory uid 65534 can reach and write (tmp_path is root's 0700)."""
    base = tempfile.mkdtemp(prefix="ddpw-squat-", dir="/tmp")
    os.chmod(base, 0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def ddpwatch_status(url: str, token: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddpwatch", "status", "--url", url],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          stdin=subprocess.DEVNULL, env={**os.environ, "DDPWATCH_TOKEN": token})


def test_a_program_on_a_daemons_port_gets_no_token_and_is_not_believed(
        start_job, tmp_path, hb_dir, receivers, playground):
    need_setup()
    script = os.path.join(playground, "squatter.py")
    shutil.copy(os.path.join(REPO, "tests", "jobs", "squatter.py"), script)
    os.chmod(script, 0o644)
    heard, url_file = os.path.join(playground, "heard.log"), os.path.join(playground, "url")
    port = free_port()
    squatter_url = f"http://127.0.0.1:{port}"
    squatter = start_job(as_nobody(PYTHON, "-I", script, str(port), heard, url_file),
                         name="squatter")
    wait_until(lambda: "listening" in squatter.output(), 30, what="the squatter listening")

    # a peer's port taken: this node's daemon asks it, as it would the real peer
    hook = receivers()
    daemon = DaemonRun(start_job, tmp_path, hb_dir,
                       {"token": TOKEN, "peers": [squatter_url], "resolve_after_s": 2,
                        "webhooks": [{"type": "generic", "url": hook.url}]})
    with open(url_file, "w") as f:
        f.write(daemon.url)
    os.chmod(url_file, 0o644)
    trainer = trainer_job(start_job)
    healthy = wait_until(lambda: (lambda s: s if len(s["ranks"]) == 2 and s["job"]["verdict"]
                                  == "healthy" else None)(our_status_t(daemon, trainer)), 180,
                         what="healthy job")

    # `ddpwatch status` against the squatter: refused, nothing of its shown
    done = ddpwatch_status(squatter_url, TOKEN)
    assert done.returncode == 76, (done.returncode, done.stdout, done.stderr)
    assert "does not prove the token" in done.stderr and not done.stdout, done.stderr
    assert "Traceback" not in done.stderr
    # ... and against the real daemon: proven, shown
    real = ddpwatch_status(daemon.url, TOKEN)
    assert real.returncode == 0 and "node " in real.stdout, (real.stdout, real.stderr)

    # the squatter's rank 0 and claim are not used: the real job pages from here
    os.kill(rank_pid(healthy, 1), signal.SIGSTOP)
    firing = wait_until(lambda: [b for b in hook.bodies() if b["status"] == "firing"
                                 and b["job"] == healthy["key"]], 90,
                        what="the stopped rank paged by this node")
    assert firing[0]["culprits"] == [1]
    status = daemon.status(token=TOKEN)
    peer = next(p for p in status["peers"] if p["url"] == squatter_url)
    assert "not proven" in peer["error"] and peer["node"] != "evil-node", peer
    ours_now = next(j for j in status["jobs"] if j["key"] == healthy["key"])
    assert all(r.get("host") != "evil-node" and r["pid"] != 4242 for r in ours_now["ranks"]), \
        ours_now["ranks"]

    # it was asked many times, and never handed the token, nor a signed request
    # to collect and replay at the live daemon later (signed/auth.py: the client
    # asks for a challenge first, and the squatter cannot prove one)
    requests = open(heard).read()
    assert requests.count("GET /challenge?c=") >= 3, requests[-2000:]
    assert TOKEN not in requests and "Bearer" not in requests, requests[-2000:]
    assert "GET /peer" not in requests and "GET /status" not in requests, requests[-2000:]
    captured = [line.partition(": ")[2] for line in requests.splitlines()
                if line.startswith("Authorization: ")]
    assert not captured, captured[:3]

    # Who may read what, on loopback without a token: a second daemon sees the same
    # stopped job. Root sees it and its incident; uid 65534 sees neither: not the
    # job's command lines and stacks, not its incident's page or bundle.
    open_daemon = DaemonRun(start_job, tmp_path, hb_dir, {"resolve_after_s": 2},
                            name="tokenless")
    incident = wait_until(lambda: next(
        (i for i in open_daemon.status()["incidents"]
         if i["job"] == healthy["key"] and i["state"] != "resolved"), None), 90,
        what="the tokenless daemon's incident")
    as_root = open_daemon.status()
    assert any(j["key"] == healthy["key"] for j in as_root["jobs"])
    seen = nobody_gets(open_daemon.url, "/status", "/incidents/",
                       f"/incidents/{incident['id']}", f"/incidents/{incident['id']}/report.json",
                       "/peer", "/metrics")
    status = json.loads(seen["/status"][1])
    assert seen["/status"][0] == 200 and status["jobs"] == [] and status["incidents"] == [] \
        and status["ranks"] == [], status
    assert str(rank_pid(healthy, 1)) not in seen["/status"][1]
    assert seen["/incidents/"][0] == 200 and incident["id"] not in seen["/incidents/"][1]
    assert seen[f"/incidents/{incident['id']}"][0] == 404
    assert seen[f"/incidents/{incident['id']}/report.json"][0] == 404
    assert json.loads(seen["/peer"][1])["jobs"] == {}
    assert seen["/metrics"][0] == 200  # numbers and labels, for Prometheus: public


class Sniffer:
    """Request heads sent to `port` on loopback, as anyone who can read the
    wire (a packet socket) captures them; only those the daemon has answered
    (a request replayed before its original arrived would prove nothing)."""

    def __init__(self, port: int):
        import socket
        import threading
        self.port, self._stop = port, threading.Event()
        self._asked: dict[int, bytes] = {}  # client port -> its request head
        self._answered: set[int] = set()
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        self._sock.bind(("lo", 0))
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                frame = self._sock.recv(65536)
            except OSError:
                continue
            if frame[12:14] != b"\x08\x00" or frame[23] != 6:  # IPv4, TCP
                continue
            tcp = frame[14 + (frame[14] & 0x0F) * 4:]
            src, dst = int.from_bytes(tcp[0:2], "big"), int.from_bytes(tcp[2:4], "big")
            payload = tcp[(tcp[12] >> 4) * 4:]
            if dst == self.port and payload.startswith(b"GET "):
                self._asked[src] = payload
            elif src == self.port and payload.startswith(b"HTTP/"):
                self._answered.add(dst)

    def signed(self) -> list[str]:
        """Heads of answered requests that carry a signature."""
        return [head.decode("latin-1") for port, head in list(self._asked.items())
                if port in self._answered and b"Authorization: DDPWatch" in head]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


def replayed_as_nobody(playground: str, heads: list[str], *urls: str) -> dict:
    """(url, head) -> status of each head sent verbatim by uid 65534 to each url."""
    script = os.path.join(playground, "collector.py")
    shutil.copy(os.path.join(REPO, "tests", "jobs", "collector.py"), script)
    os.chmod(script, 0o644)
    path = os.path.join(playground, f"heads-{len(os.listdir(playground))}.json")
    with open(path, "w") as f:
        json.dump(heads, f)
    os.chmod(path, 0o644)
    done = subprocess.run(as_nobody(PYTHON, "-I", script, "replay", path, *urls),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return {(url, heads[i]): code for url, i, code in json.loads(done.stdout)}


def test_signed_requests_collected_or_captured_are_refused_later_and_elsewhere(
        start_job, tmp_path, hb_dir, playground):
    """Two nodes sharing the token, A and B; B's peer view polls A. Captured
    on the wire, what `ddpwatch status` and the peer view send to A is good
    neither again at A nor at B. With A down, a squatter (uid 65534) on its port
    collects what those clients send it, relaying their challenges to B's live
    daemon; once A is back, nothing it collected or captured is taken by A
    (restarted: a new identity) or B. Before (a MAC over method, target, time
    and nonce only), each was taken once: uid 65534 read root's full /status."""
    need_setup()
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    a = DaemonRun(start_job, a_dir, hb_dir, {"token": TOKEN}, name="a")
    b = DaemonRun(start_job, b_dir, hb_dir, {"token": TOKEN, "peers": [a.url]}, name="b")

    def peer_a_error(want) -> bool:
        peer = next((p for p in b.status(token=TOKEN)["peers"] if p["url"] == a.url), None)
        return peer is not None and want(peer["error"])

    # on the wire, while A lives: each signed request was answered, once
    sniffer = Sniffer(a.port)
    try:
        live = ddpwatch_status(a.url, TOKEN)
        assert live.returncode == 0 and "node " in live.stdout, (live.stdout, live.stderr)
        captured = wait_until(lambda: (lambda s: s if any(" /status " in h for h in s) and any(
            " /peer " in h for h in s) else None)(sniffer.signed()), 60,
            what="a signed /status and /peer captured")
    finally:
        sniffer.close()
    refused = replayed_as_nobody(playground, captured, a.url, b.url)
    assert set(refused.values()) == {401}, refused   # used at A; made for A, not B

    # A down, and uid 65534 on its port: what the clients send it is collected
    a.job.kill()
    heard = os.path.join(playground, "heard.log")
    collector = os.path.join(playground, "collector.py")
    squatter = start_job(as_nobody(PYTHON, "-I", collector, "collect", str(a.port), heard,
                                   b.url), name="squatter")
    wait_until(lambda: "listening" in squatter.output(), 30, what="the squatter listening")
    done = ddpwatch_status(a.url, TOKEN)
    assert done.returncode == 76 and not done.stdout, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    by_status = len(open(heard).read().splitlines())
    assert by_status >= 1
    wait_until(lambda: len(open(heard).read().splitlines()) >= by_status + 3, 60,
               what="the peer view asking the squatter thrice")
    assert peer_a_error(lambda e: "not proven" in e or "relays" in e)
    squatter.kill()
    collected = [json.loads(line) for line in open(heard).read().splitlines()]
    assert not any(TOKEN in h or "Bearer" in h for h in collected), collected[:3]

    # A is back: nothing collected or captured is taken by A or by B
    a.start()
    replays = replayed_as_nobody(playground, collected + captured, a.url, b.url)
    taken = {k: code for k, code in replays.items()
             if code != 401 and not k[1].startswith("GET /challenge?")}
    assert not taken, taken
    # ... and the client saw through the relay: it signed nothing for the squatter
    assert not [h for h in collected if "Authorization:" in h], collected[:3]
    assert "relays a daemon elsewhere" in done.stderr, done.stderr
    # the restarted daemon serves its clients
    assert ddpwatch_status(a.url, TOKEN).returncode == 0
    wait_until(lambda: peer_a_error(lambda e: e == ""), 60, what="B's peer view of A again")

    # a request signed over a challenge A gave, never sent: A's restart voids it
    from ddpwatch.signed import auth, client
    pending, _ = auth.sign_request(TOKEN, "GET", "/status", client._challenge(a.url, TOKEN, 10))
    a.job.kill()
    a.start()
    request = urllib.request.Request(a.url + "/status", headers={"Authorization": pending})
    with pytest.raises(urllib.error.HTTPError) as refused_after_restart:
        urllib.request.urlopen(request, timeout=10)
    assert refused_after_restart.value.code == 401
    assert "did not give" in refused_after_restart.value.read().decode()


def nobody_gets(url: str, *paths: str) -> dict[str, tuple[int, str]]:
    """path -> (status, body) of GETs made by uid 65534."""
    code = (
        "import json, sys, urllib.request, urllib.error\n"
        "out = {}\n"
        "for path in sys.argv[2:]:\n"
        "    try:\n"
        "        with urllib.request.urlopen(sys.argv[1] + path, timeout=20) as r:\n"
        "            out[path] = (r.status, r.read().decode('utf-8', 'replace'))\n"
        "    except urllib.error.HTTPError as e:\n"
        "        out[path] = (e.code, '')\n"
        "print(json.dumps(out))\n")
    done = subprocess.run(as_nobody(PYTHON, "-I", "-c", code, url, *paths),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return {k: tuple(v) for k, v in json.loads(done.stdout).items()}


def our_status_t(daemon, trainer) -> dict:
    from daemons import ours
    return ours(daemon.status(token=TOKEN), trainer)


ACTIVATE = """\
import os, sys
# as systemd starts a socket-activated service: the socket at fd 3, LISTEN_PID
# this very process, LISTEN_FDS its count (sd_listen_fds(3))
os.dup2(int(sys.argv[1]), 3)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def test_with_systemds_socket_nobody_takes_the_port_while_the_daemon_is_down(
        start_job, tmp_path, hb_dir):
    need_setup()
    import socket
    port = free_port()
    held = socket.socket()  # what ddpwatch.socket makes systemd do, from boot on
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("127.0.0.1", port))
    held.listen(16)
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "daemon.yaml"
    config.write_text(json.dumps({"listen": f"127.0.0.1:{port}", "token": TOKEN,
                                  "state_dir": str(tmp_path / "state"), "heartbeat_dir": ""}))

    def start_daemon(cfg=config):
        return start_job([sys.executable, "-c", ACTIVATE, str(held.fileno()), "-m", "ddpwatch",
                          "run", "--config", str(cfg)], name="daemon",
                         pass_fds=(held.fileno(),))

    first = start_daemon()
    wait_until(lambda: get(url + "/readyz")[0] == 200, 60, what="the daemon ready")
    assert "systemd's socket" in first.output()
    assert ddpwatch_status(url, TOKEN).returncode == 0
    first.proc.kill()  # a crash: systemd would restart it on the same socket
    first.wait(30)

    # down: the port is still held, so uid 65534 cannot take it
    taken = subprocess.run(as_nobody(PYTHON, "-I", "-c", (
        "import socket, sys\n"
        "s = socket.socket()\n"
        "try:\n"
        f"    s.bind(('127.0.0.1', {port})); s.listen(); print('bound')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n")), capture_output=True, text=True, timeout=30)
    assert taken.stdout.split() == ["refused", str(errno.EADDRINUSE)], taken

    start_daemon()
    wait_until(lambda: get(url + "/readyz")[0] == 200, 60, what="the restarted daemon ready")
    again = ddpwatch_status(url, TOKEN)
    assert again.returncode == 0, again.stderr

    # a config whose listen is not the socket's: exit 78 naming both
    elsewhere = tmp_path / "elsewhere.yaml"
    other = free_port()
    elsewhere.write_text(json.dumps({"listen": f"127.0.0.1:{other}",
                                     "state_dir": str(tmp_path / "state2"),
                                     "heartbeat_dir": ""}))
    wrong = start_daemon(elsewhere)
    assert wrong.wait(60) == 78
    out = wrong.output()
    assert f"127.0.0.1:{other}" in out and f"127.0.0.1:{port}" in out and "ListenStream" in out, \
        out
    assert "Traceback" not in out
    held.close()


def test_the_shipped_socket_unit_holds_the_port_the_shipped_config_listens_on():
    import yaml
    unit = open(os.path.join(REPO, "systemd", "ddpwatch.socket")).read()
    service = open(os.path.join(REPO, "systemd", "ddpwatch.service")).read()
    config = yaml.safe_load(open(os.path.join(REPO, "systemd", "config.yaml")))
    streams = [line.split("=", 1)[1].strip() for line in unit.splitlines()
               if line.startswith("ListenStream=")]
    assert streams == [config["listen"]]  # exactly one: sdnotify.listen_socket takes one
    assert "Accept=no" in unit
    assert "Requires=ddpwatch.socket" in service and "After=ddpwatch.socket" in service
    if shutil.which("systemd-analyze"):
        out = subprocess.run(["systemd-analyze", "verify", "ddpwatch.socket", "ddpwatch.service"],
                             cwd=os.path.join(REPO, "systemd"), capture_output=True, text=True,
                             timeout=120)
        # the one complaint left is the install path of ExecStart, absent here
        problems = [line for line in (out.stdout + out.stderr).splitlines()
                    if line.strip() and "/usr/local/bin/ddpwatch is not executable" not in line]
        assert not problems, problems
