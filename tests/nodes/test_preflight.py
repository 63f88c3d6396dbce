"""`ddpwatch preflight` on two "nodes": this host (the master, on its end of a
veth) and a network namespace (the worker). Each failure of docs/design.md
"Failures seen in real runs" that preflight checks for is made for real
(iptables in the worker's namespace, its own hosts file and hostname, an
interface of the other family, a stale listener on the master
port, another torch version on the worker's path) and read from both nodes'
tables; a healthy pair passes and a 2-rank Gloo job launched right after trains."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile

import psutil
import pytest

from conftest import REPO, free_port, need, wait_until

PLAIN = os.path.join(REPO, "tests", "jobs", "plain_ddp.py")
SECRET_ENV = "DDPWATCH_PREFLIGHT_SECRET"
TIMEOUT = 120


def ephemeral_range(netns) -> str:
    text = subprocess.run([*netns["exec"], "cat", "/proc/sys/net/ipv4/ip_local_port_range"],
                          capture_output=True, text=True, check=True).stdout.split()
    return f"{text[0]}-{text[1]}"


def preflight_pair(start_job, tmp_path, netns, port, master_env=None, worker_env=None,
                   worker_prefix=(), extra=()):
    """Both nodes' preflight, started together; (master doc, worker doc, codes)."""
    args = ["--master", f"{netns['host_addr']}:{port}", "--json", "--wait", "60", *extra]
    out_m, out_w = tmp_path / "master.json", tmp_path / "worker.json"
    cmd = [sys.executable, "-m", "ddpwatch", "preflight", *args]
    m = start_job(["sh", "-c", f'exec "$@" > {out_m}', "sh", *cmd],
                  env={"GLOO_SOCKET_IFNAME": netns["host_if"], **(master_env or {})}, name="master")
    w = start_job([*netns["exec"], *worker_prefix, "sh", "-c", f'exec "$@" > {out_w}', "sh", *cmd],
                  env={"GLOO_SOCKET_IFNAME": netns["peer_if"], **(worker_env or {})}, name="worker")
    codes = (m.wait(TIMEOUT), w.wait(TIMEOUT))
    docs = []
    for path, job in ((out_m, m), (out_w, w)):
        try:
            docs.append(json.loads(path.read_text()))
        except ValueError:
            raise AssertionError(f"no JSON from {path.name}: {job.output()}") from None
    return docs[0], docs[1], codes


def rows(doc, check, node_part=""):
    return [r for r in doc["checks"] if r["check"] == check and node_part in r["node"]]


def status_of(doc, check, node_part=""):
    found = rows(doc, check, node_part)
    assert found, (check, node_part, doc["checks"])
    return [r["status"] for r in found]


def iptables_in(netns, request, *rule):
    subprocess.run([*netns["exec"], "iptables", "-A", *rule], check=True)
    request.addfinalizer(lambda: subprocess.run([*netns["exec"], "iptables", "-D", *rule],
                                                capture_output=True, check=False))


def test_healthy_pair_passes_and_a_job_then_trains(start_job, tmp_path, netns):
    port = free_port()
    secret = {SECRET_ENV: "the-same-on-both-nodes"}
    master, worker, codes = preflight_pair(start_job, tmp_path, netns, port, master_env=secret,
                                           worker_env=secret, extra=["--params", "10000000"])
    assert codes == (0, 0), (master["checks"], worker["checks"])
    assert rows(master, "exchange")[0]["fact"] == "every message signed with the preflight secret"
    # a GPU in the box (CUDA visible) makes the bf16 row a warning, the only one allowed
    gpu = os.path.exists("/dev/nvidia0")
    assert {r["status"] for r in master["checks"] if r["check"] != "bf16"} == {"pass"}, \
        master["checks"]
    assert {r["status"] for r in master["checks"] if r["check"] == "bf16"} <= (
        {"pass", "warn"} if gpu else {"pass"})
    assert master["checks"] == worker["checks"]  # every node prints the whole table
    assert len(rows(master, "gloo_ports")) == 2  # both directions probed
    assert "all-reduce per step for 10,000,000 params" in rows(master, "allreduce")[0]["fact"]
    # The launch right after, on the same port (preflight left nothing behind):
    # torchrun on each node, rendezvous through the master's store, Gloo between them.
    def node(rank, ifname, prefix=()):
        return start_job([*prefix, sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                          "--nproc_per_node=1", f"--node_rank={rank}",
                          f"--master_addr={netns['host_addr']}", f"--master_port={port}",
                          PLAIN, "--steps", "40"], env={"GLOO_SOCKET_IFNAME": ifname},
                         name=f"node{rank}")
    n0 = node(0, netns["host_if"])
    n1 = node(1, netns["peer_if"], netns["exec"])
    for job, timeout in ((n0, 240), (n1, 60)):
        try:
            assert job.wait(timeout) == 0, job.output()
        except subprocess.TimeoutExpired:
            pytest.fail(f"the launch after preflight did not finish in {timeout} s\n"
                        f"--- node 0:\n{n0.output()[-3000:]}\n--- node 1:\n{n1.output()[-3000:]}")
    assert "rank 0 step 40 loss" in n0.output() and "rank 1 step 40 loss" in n1.output()


def test_worker_dropping_the_masters_connections_to_ephemeral_ports(start_job, tmp_path,
                                                                    netns, request):
    """docs/design.md "A firewall that drops Gloo's data connections": the store
    port works, Gloo's ports are dropped."""
    ports = ephemeral_range(netns)
    iptables_in(netns, request, "INPUT", "-p", "tcp", "--syn", "-s", netns["host_addr"],
                "--dport", ports.replace("-", ":"), "-j", "DROP")
    master, worker, codes = preflight_pair(start_job, tmp_path, netns, free_port())
    assert codes == (1, 1)
    for doc in (master, worker):
        assert status_of(doc, "store_reach") == ["pass"]
        assert status_of(doc, "gloo_ports") == ["pass", "fail"]
        bad = next(r for r in rows(doc, "gloo_ports") if r["status"] == "fail")
        assert bad["node"].startswith("worker 1") and netns["peer_addr"] in bad["node"]
        assert f"master vm ({netns['host_addr']}) -> worker 1" in bad["fact"].replace(
            socket.gethostname(), "vm")
        assert f"Gloo's ports {ports}" in bad["fact"] and "dropped silently" in bad["fact"]
        assert (f"iptables -I INPUT -p tcp -s {netns['host_addr']} --dport "
                f"{ports.replace('-', ':')} -j ACCEPT") in bad["fix"]


def test_refusing_is_told_apart_from_dropping(start_job, tmp_path, netns, request):
    ports = ephemeral_range(netns)
    iptables_in(netns, request, "INPUT", "-p", "tcp", "--syn", "-s", netns["host_addr"],
                "--dport", ports.replace("-", ":"), "-j", "REJECT", "--reject-with", "tcp-reset")
    master, _, codes = preflight_pair(start_job, tmp_path, netns, free_port())
    assert codes == (1, 1)
    bad = next(r for r in rows(master, "gloo_ports") if r["status"] == "fail")
    assert "refused" in bad["fact"] and "dropped" not in bad["fact"]
    assert "REJECT" in bad["fact"] and f"-s {netns['host_addr']}" in bad["fix"]


def test_worker_hostname_resolving_to_127_0_1_1(start_job, tmp_path, netns, request):
    need(shutil.which("unshare") is not None, "needs unshare for a UTS namespace")
    etc = f"/etc/netns/{netns['name']}"
    made_parent = not os.path.isdir("/etc/netns")
    os.makedirs(etc, exist_ok=True)

    def remove():
        shutil.rmtree(etc, ignore_errors=True)
        if made_parent:
            try:
                os.rmdir("/etc/netns")  # only if we made it and nothing else is there
            except OSError:
                pass
    request.addfinalizer(remove)
    with open(f"{etc}/hosts", "w") as f:
        f.write("127.0.0.1 localhost\n127.0.1.1 nodeb\n")
    uts = ["unshare", "--uts", "sh", "-c", 'hostname nodeb && exec "$@"', "uts"]
    master, worker, codes = preflight_pair(start_job, tmp_path, netns, free_port(),
                                           worker_env={"GLOO_SOCKET_IFNAME": ""},
                                           worker_prefix=uts)
    assert codes == (1, 1)
    row = rows(worker, "hostname", "nodeb")[0]
    assert row["status"] == "fail" and "127.0.1.1" in row["fact"]
    assert "/etc/hosts:2: 127.0.1.1 nodeb" in row["fact"]
    assert f"GLOO_SOCKET_IFNAME={netns['peer_if']}" in row["fix"]
    iface = rows(master, "gloo_iface", "nodeb")[0]
    assert iface["status"] == "fail" and "loopback" in iface["fact"]
    assert status_of(master, "hostname", netns["host_addr"]) == ["pass"]  # the master's pinned


def test_gloo_socket_ifname_of_the_other_family(start_job, tmp_path, netns):
    """The field's `ss1.ss_family == ss2.ss_family. 10 vs 2`: the worker's
    GLOO_SOCKET_IFNAME names an interface with only an IPv6 address."""
    v6 = f"d6{netns['name'][-6:]}"
    for cmd in (["ip", "link", "add", v6, "type", "veth", "peer", "name", v6 + "p"],
                ["ip", "link", "set", v6, "up"], ["ip", "link", "set", v6 + "p", "up"],
                ["ip", "-6", "addr", "add", "fd00:231::2/64", "dev", v6, "nodad"]):
        done = subprocess.run([*netns["exec"], *cmd], capture_output=True, text=True)
        need(done.returncode == 0, f"cannot add an IPv6 veth in the namespace: {done.stderr}")
    master, worker, codes = preflight_pair(start_job, tmp_path, netns, free_port(),
                                           worker_env={"GLOO_SOCKET_IFNAME": v6})
    assert codes == (1, 1)
    row = rows(master, "gloo_iface", "worker 1")[0]
    assert row["status"] == "fail" and "fd00:231::2" in row["fact"] and v6 in row["fact"]
    assert "IPv6" in row["fact"] and "uses IPv4" in row["fact"] and "ss_family" in row["fact"]
    assert f"GLOO_SOCKET_IFNAME={netns['peer_if']}" in row["fix"]
    # the master's own row names the mismatch too, from its side
    assert rows(master, "gloo_iface", "master")[0]["status"] == "fail"
    assert status_of(master, "gloo_ports") == ["pass", "pass"]  # the network itself is fine


def test_stale_process_holding_the_master_port(start_job, tmp_path, netns):
    """An orphan of an earlier launch (parent gone) listening on the port: named
    with its pid; the nodes still meet beside it (port+1) and check the rest."""
    port = next(p for p in iter(free_port, None) if _free(p + 1))
    stale = ("import socket,time; s=socket.socket(); "
             "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
             f"s.bind(('', {port})); s.listen(); time.sleep(600)")
    start_job(["sh", "-c", f'{sys.executable} -c "{stale}" & exit 0'], name="stale")

    def holder():
        for c in psutil.net_connections("tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port:
                return c.pid
    pid = wait_until(holder, 60, what=f"the stale listener on {port}")
    master, worker, codes = preflight_pair(start_job, tmp_path, netns, port)
    assert codes == (1, 1)
    for doc in (master, worker):
        row = rows(doc, "store_port")[0]
        assert row["status"] == "fail" and f"held by pid {pid}" in row["fact"]
        assert "parent gone" in row["fact"] and f"kill {pid}" in row["fix"]
        assert status_of(doc, "nodes") == ["pass"]  # met on port+1
        assert status_of(doc, "gloo_ports") == ["pass", "pass"]


# A program of uid 65534's that took the store port on the master's address first
# and plays master (the protocol without a secret): it logs what it hears and
# answers a hello with a roster that sends the worker's probes to `target`.
FAKE_MASTER = """
import json, socket, sys
port, log, target_addr, target_port = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", port)); s.listen(); print("listening", flush=True)
while True:
    conn, _ = s.accept()
    conn.settimeout(5)
    conn.sendall(b"DDPWATCH-PREFLIGHT 1\\n")
    try:
        heard = conn.recv(65536)
    except OSError:
        heard = b""
    with open(log, "ab") as f:
        f.write(heard + b"\\n--\\n")
    fake = {"role": "master", "seen_addr": target_addr, "probe_port": target_port}
    roster = {"kind": "roster", "you": 1, "nodes": [fake, {"role": "worker"}]}
    try:
        conn.sendall(json.dumps(roster).encode() + b"\\n")
    except OSError:
        pass
    conn.close()
"""


def test_a_fake_master_on_the_store_port_gets_nothing_from_a_worker_with_the_secret(
        start_job, tmp_path, netns, request):
    """Whoever binds the store port first played master: workers handed it their
    facts, probed the targets it named and printed its table. With the secret
    the worker sends it nothing and probes nothing it names; the real master,
    beside it on port+1, meets the worker as with any stale holder."""
    need(os.access("/usr/bin/python3", os.X_OK) and shutil.which("setpriv"),
         "needs /usr/bin/python3 and setpriv to run the fake master as uid 65534")
    port = next(p for p in iter(free_port, None) if _free(p + 1))
    place = tempfile.mkdtemp(prefix="ddpw-fake-master-", dir="/tmp")  # uid 65534 writes here
    os.chmod(place, 0o1777)
    request.addfinalizer(lambda: shutil.rmtree(place, ignore_errors=True))
    log = pathlib.Path(place) / "heard.log"
    target = socket.socket()  # counts what the fake's roster makes anyone send here
    target.bind((netns["host_addr"], 0))
    target.listen(8)
    target.settimeout(0.05)
    fake = start_job(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                      "/usr/bin/python3", "-I", "-c", FAKE_MASTER, str(port), str(log),
                      netns["host_addr"], str(target.getsockname()[1])], name="fake-master")
    wait_until(lambda: "listening" in fake.output(), 30, what="the fake master listening")
    secret = {SECRET_ENV: "the-same-on-both-nodes"}
    master, worker, codes = preflight_pair(start_job, tmp_path, netns, port, master_env=secret,
                                           worker_env=secret)
    heard = log.read_bytes() if log.exists() else b""
    assert heard.count(b"--") >= 1, ("the worker never reached the fake master", fake.output())
    assert b"hello" not in heard and b"facts" not in heard, heard[:2000]
    try:
        conn, _ = target.accept()
        conn.close()
        probed = True
    except OSError:
        probed = False
    target.close()
    assert not probed, "the worker probed the fake master's target"
    assert master["checks"] == worker["checks"]
    for doc in (master, worker):
        assert status_of(doc, "nodes") == ["pass"]  # the real master, on port+1
        assert status_of(doc, "exchange") == ["pass"]
        assert status_of(doc, "gloo_ports") == ["pass", "pass"]
        assert status_of(doc, "store_port") == ["fail"]  # the fake holds it: named
    assert codes == (1, 1)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def test_different_torch_versions(start_job, tmp_path, netns):
    """importlib.metadata on the worker finds a torch-9.9.9 distribution first
    on its PYTHONPATH: what a second venv with another torch reports."""
    fake = tmp_path / "faketorch" / "torch-9.9.9.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9\n")
    master, worker, codes = preflight_pair(
        start_job, tmp_path, netns, free_port(),
        worker_env={"PYTHONPATH": f"{fake.parent}{os.pathsep}{REPO}"})
    assert codes == (1, 1)
    for doc in (master, worker):
        row = rows(doc, "torch")[0]
        assert row["status"] == "fail" and "9.9.9 on worker 1" in row["fact"]
        assert "torch==" in row["fix"]
        assert status_of(doc, "python") == ["pass"]


def test_worker_that_cannot_reach_the_store_port(start_job, tmp_path, netns, request):
    """The store port itself dropped on the way: the worker says so and stops
    there; the master says the worker never came. Nothing unknown passes."""
    port = free_port()
    iptables_in(netns, request, "OUTPUT", "-p", "tcp", "--syn", "-d", netns["host_addr"],
                "--dport", f"{port}:{port + 1}", "-j", "DROP")
    out_w = tmp_path / "worker.json"
    args = ["--master", f"{netns['host_addr']}:{port}", "--json", "--wait", "5"]
    cmd = [sys.executable, "-m", "ddpwatch", "preflight", *args]
    m = start_job([c for c in cmd if c != "--json"], env={"GLOO_SOCKET_IFNAME": netns["host_if"]},
                  name="master")  # the text table, this once
    w = start_job([*netns["exec"], "sh", "-c", f'exec "$@" > {out_w}', "sh", *cmd],
                  env={"GLOO_SOCKET_IFNAME": netns["peer_if"]}, name="worker")
    assert (m.wait(TIMEOUT), w.wait(TIMEOUT)) == (1, 1)
    worker = json.loads(out_w.read_text())
    by = {r["check"]: r for r in worker["checks"]}
    assert by["store_reach"]["status"] == "fail" and "dropped silently" in by["store_reach"]["fact"]
    assert f"port {port}" in by["store_reach"]["fact"]
    assert by["store_port"]["status"] == "cannot" and by["nodes"]["status"] == "fail"
    assert "PASS" not in [r["status"] for r in worker["checks"] if r["check"] in
                          ("torch", "python", "gloo_ports")]
    lines = m.output().splitlines()
    assert any(line.startswith("FAIL") and "nodes" in line and "1 of 2 nodes took part" in line
               for line in lines), lines
    assert any(line.startswith("CANNOT-RUN") and "torch" in line for line in lines), lines
