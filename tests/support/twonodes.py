"""Two namespace nodes on this host for cross-node tests: each node a
network namespace on a shared bridge, and inside it a PID, mount and UTS
namespace of its own (its hostname) holding its ranks and its `ddpwatch run`
with the other node as its peer. The host namespace reaches both over the
bridge, as a watcher outside the nodes would.

Node 0 (the master) gets the higher address: Gloo connects each pair from the
higher address to the lower, so node 0 dials node 1 as the master dialled its
worker in docs/design.md "A firewall that drops Gloo's data connections".

The tests in tests/nodes share the rest: the jobs started on the nodes (Starter,
TRAINER) and what each node says of them (seen, job_on, until_diagnosed)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import psutil

from conftest import REPO, TESTS, Job, free_port, is_torchrun_agent, need, runs_module, wait_until
from diag import diagnose, verdicts

# off loopback the daemons refuse a weak token (ddpwatch/signed/strength.py)
TOKEN = "5d0c2a7f9e31b84c6a1f07d9e2b35c48a96e0f1d7b2c84e53a0f69d1c7e28b4f"


def token_file() -> str:
    """A file holding TOKEN, for `--token-file`: never the token on argv
    (ddpwatch/commands/token.py)."""
    path = os.path.join(tempfile.gettempdir(), f"ddpwatch-twonodes-token-{os.getpid()}")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(TOKEN + "\n")
    return path


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


class Net:
    """A bridge in the host namespace with two node namespaces on it."""

    def __init__(self, prefix: str = "10.233"):
        """`prefix`: the nodes' first two octets (above 127 to have node 0's Gloo
        dial node 1's loopback address, as a 192.168 LAN's would)."""
        need(os.geteuid() == 0 and all(shutil.which(t) for t in ("ip", "iptables", "unshare",
                                                                 "nsenter")),
             "needs root, ip, iptables, unshare and nsenter for namespace nodes")
        tag = uuid.uuid4().hex[:6]
        net = 1 + int(tag, 16) % 250
        self.bridge = f"dwbr{tag}"
        self.host_addr = f"{prefix}.{net}.254"
        self.ns = [f"dwn0{tag}", f"dwn1{tag}"]
        self.addr = [f"{prefix}.{net}.2", f"{prefix}.{net}.1"]
        self.ifname = "eth0"
        self.hosts_dirs = [f"/etc/netns/{ns}" for ns in self.ns]
        self.links = [f"dwv{i}{tag}" for i in range(2)]
        steps = [("ip", "link", "add", self.bridge, "type", "bridge"),
                 ("ip", "addr", "add", f"{self.host_addr}/24", "dev", self.bridge),
                 ("ip", "link", "set", self.bridge, "up")]
        for i, ns in enumerate(self.ns):
            steps += [("ip", "netns", "add", ns),
                      ("ip", "link", "add", self.links[i], "type", "veth", "peer", "name",
                       f"dwp{i}{tag}"),
                      ("ip", "link", "set", f"dwp{i}{tag}", "netns", ns),
                      ("ip", "netns", "exec", ns, "ip", "link", "set", f"dwp{i}{tag}", "name",
                       self.ifname),
                      ("ip", "link", "set", self.links[i], "master", self.bridge),
                      ("ip", "link", "set", self.links[i], "up"),
                      ("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.addr[i]}/24",
                       "dev", self.ifname),
                      ("ip", "netns", "exec", ns, "ip", "link", "set", self.ifname, "up"),
                      ("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")]
        for cmd in steps:
            done = run(*cmd)
            if done.returncode != 0:
                self.close()
                need(False, f"cannot set up namespace nodes ({' '.join(cmd)}): {done.stderr}")
        for i, d in enumerate(self.hosts_dirs):
            # each node resolves its own hostname to its own address, as a LAN host would
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "hosts"), "w") as f:
                f.write(f"127.0.0.1 localhost\n{self.addr[i]} node{i}\n"
                        f"{self.addr[1 - i]} node{1 - i}\n")

    def exec(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns[i]]

    def iptables(self, i: int, *rule: str) -> None:
        done = run(*self.exec(i), "iptables", "-A", *rule)
        assert done.returncode == 0, done.stderr

    def close(self) -> None:
        for ns in self.ns:
            run("ip", "netns", "del", ns)
        for link in self.links:
            run("ip", "link", "del", link)
        run("ip", "link", "del", self.bridge)
        for d in self.hosts_dirs:
            shutil.rmtree(d, ignore_errors=True)


def get_json(url: str):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)
    except (urllib.error.URLError, OSError, ValueError):
        return None


class Node:
    """One node: `sh` as pid 1 of its PID namespace, running its daemon and its rank."""

    def __init__(self, start_job, root, net: Net, i: int, rank_argv: list[str],
                 rank_env: dict, port: int, peer_port: int):
        self.i, self.net, self.root = i, net, root
        self.name = f"node{i}"
        self.port = port
        self.url = f"http://{net.addr[i]}:{port}"
        os.makedirs(root / "hb", exist_ok=True)
        peer = f"http://{net.addr[1 - i]}:{peer_port}"
        config = root / "config.yaml"
        config.write_text(f"listen: {net.addr[i]}:{port}\ntoken: {TOKEN}\ntick_s: 0.5\n"
                          f"state_dir: {root / 'state'}\nheartbeat_dir: {root / 'hb'}\n"
                          f"peers: [{peer}]\n")
        rank = ["env", *(f"{k}={v}" for k, v in rank_env.items()), *rank_argv]
        daemon = [sys.executable, "-m", "ddpwatch", "run", "--config", str(config)]
        # `ip netns exec` mounts a sysfs of its own, without the cgroup mounts under
        # it: the node mounts its CPU hierarchy, as a host has it
        version, _ = _cgroup_dir()
        cgroup = ("mount -t cgroup2 none /sys/fs/cgroup; " if version == "v2" else
                  "mount -t tmpfs none /sys/fs/cgroup; mkdir /sys/fs/cgroup/cpu; "
                  "mount -t cgroup -o cpu none /sys/fs/cgroup/cpu; " if version == "v1" else "")
        script = (f"hostname {self.name}; {cgroup}sh -c '{' '.join(rank)} > {root / 'rank.log'} 2>&1 & "
                  f"{' '.join(daemon)} > {root / 'daemon.log'} 2>&1 & wait'; true")
        argv = [*net.exec(i), "unshare", "--pid", "--fork", "--mount-proc", "--uts",
                "sh", "-c", script]
        self.job = start_job(argv, env={"DDPWATCH_DIR": str(root / "hb")}, name=self.name)

    def status(self):
        return get_json(self.url + "/status")

    def rank_pids(self) -> list[int]:
        """Host pids of this node's rank processes (RANK in their environment)."""
        found = []
        for proc in self.job.processes():
            try:
                cmd = proc.cmdline()
                # the node's daemon and a torchrun agent are told by the module they
                # run (conftest.python_module), not by a word of their path
                if "RANK" in proc.environ() and not runs_module(cmd, "ddpwatch") and \
                        not is_torchrun_agent(cmd):
                    found.append(proc.pid)
            except psutil.Error:
                continue
        return [p for p in found if not any(q.pid in found for q in _parents(p))]

    def ns_pid(self, pid: int) -> int:
        """Host pid `pid` as its own PID namespace numbers it (NSpid's last)."""
        with open(f"/proc/{pid}/status") as f:
            return int(next(line for line in f if line.startswith("NSpid:")).split()[-1])

    def enter(self, pid: int) -> list[str]:
        """A prefix that runs a command in the namespaces of host pid `pid`."""
        return ["nsenter", "-t", str(pid), "--net", "--uts", "--pid", "--mount"]

    def logs(self) -> str:
        """The daemon's and the rank's logs, and the node's own output (`ip netns
        exec`, unshare, mount: where a node that never started its daemon says why)."""
        code = self.job.proc.poll()
        own = (f"--- {self.name} itself ({'runs' if code is None else f'exited {code}'}):\n"
               + (self.job.output()[-2500:] or "(nothing)"))
        return "\n".join([own] + [f"--- {self.name} {p.name}:\n" + (
            p.read_text()[-2500:] if p.exists() else "(none)")
            for p in (self.root / "daemon.log", self.root / "rank.log")])


def _parents(pid: int):
    try:
        return psutil.Process(pid).parents()
    except psutil.Error:
        return []


def start_pair(start_job, tmp_path, net: Net, rank_argv: list[str], extra_env=None,
               ports=None, torchrun: str = "", node_env=({}, {})):
    """Both nodes, one rank each of a 2-rank job whose master is node 0, started
    by hand (the rank's variables in its environment), or with `torchrun` the
    script that torchrun starts on each node (--nnodes=2). `ports`: the
    daemons' (picked here by default). `node_env`: each node's own additions
    to the ranks' environment (a None value unsets)."""
    master_port, ports = free_port(), ports or (free_port(), free_port())
    nodes = []
    for i in (0, 1):
        env = {"GLOO_SOCKET_IFNAME": net.ifname, **(extra_env or {}), **node_env[i]}
        env = {k: v for k, v in env.items() if v is not None}
        argv = rank_argv
        if torchrun:
            argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                    f"--node_rank={i}", "--nproc_per_node=1", f"--master_addr={net.addr[0]}",
                    f"--master_port={master_port}", torchrun]
        else:
            env.update({"MASTER_ADDR": net.addr[0], "MASTER_PORT": str(master_port),
                        "WORLD_SIZE": "2", "RANK": str(i), "LOCAL_RANK": "0",
                        "LOCAL_WORLD_SIZE": "1"})
        nodes.append(Node(start_job, tmp_path / f"node{i}", net, i, argv, env, ports[i],
                          ports[1 - i]))
    return nodes, f"{net.addr[0]}:{master_port}"


class CpuQuota:
    """A cgroup with a CPU limit (v2 cpu.max, else v1's cpu controller)."""

    def __init__(self, cores: float):
        self.version, self.root = _cgroup_dir()
        need(bool(self.version), "needs a writable CPU cgroup hierarchy")
        self.path = os.path.join(self.root, f"ddpwatch-2n-{uuid.uuid4().hex[:6]}")
        os.mkdir(self.path)
        period = 100000
        if self.version == "v2":
            with open(os.path.join(self.root, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu")
            self._write("cpu.max", f"{int(cores * period)} {period}")
        else:
            self._write("cpu.cfs_period_us", str(period))
            self._write("cpu.cfs_quota_us", str(int(cores * period)))
        self.pids: list[int] = []

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def add(self, pid: int) -> None:
        self._write("cgroup.procs", str(pid))
        self.pids.append(pid)

    def close(self) -> None:
        for pid in self.pids:
            try:
                with open(os.path.join(self.root, "cgroup.procs"), "w") as f:
                    f.write(str(pid))
            except OSError:
                pass  # gone
        # a rank killed a moment ago may still be leaving the group (EBUSY)
        deadline = time.monotonic() + 30
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def _cgroup_dir() -> tuple[str, str]:
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        with open("/sys/fs/cgroup/cgroup.controllers") as f:
            if "cpu" in f.read().split():
                return "v2", "/sys/fs/cgroup"
    if os.access("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", os.R_OK) and os.access(
            "/sys/fs/cgroup/cpu", os.W_OK):
        return "v1", "/sys/fs/cgroup/cpu"
    return "", ""


SNAPSHOTS = os.path.join(TESTS, "fixtures", "snapshots")
TRAINER = [sys.executable, "-m", "trainer", "--device-type=cpu", "--steps=0"]
HEALTHY = {0: ("healthy", "none"), 1: ("healthy", "none")}


class Starter:
    """start_job for a module: Jobs killed when the module's scenario ends."""

    def __init__(self, tmp):
        self.tmp, self.jobs = tmp, []

    def __call__(self, argv, env=None, name="job"):
        full = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                    PYTHONPATH=REPO)
        full.update(env or {})
        self.jobs.append(Job(argv, full, str(self.tmp / f"{name}-{len(self.jobs)}.log")))
        return self.jobs[-1]

    def kill(self):
        for job in self.jobs:
            job.kill()


def seen(node: Node, key: str | None) -> dict:
    """{rank: (verdict, role)} of job `key` on the node's /status (None: the job
    holding rank 1, whatever its key: torchrun's depends on its rendezvous)."""
    job = job_on(node, key)
    return {r["rank"]: (r["verdict"], r["role"]) for r in job["ranks"]} if job else {}


def job_on(node: Node, key: str | None):
    return next((j for j in (node.status() or {}).get("jobs", []) if j["key"] == key or (
        key is None and 1 in {r["rank"] for r in j["ranks"]})), None)


def diagnose_in(node: Node, pid: int, *extra: str, save: str = "") -> dict:
    """`ddpwatch diagnose` run inside the node's namespaces, on its rank `pid` (host pid)."""
    path = os.path.join(node.root, f"{save or 'diag'}.json")
    _, report = diagnose(node.ns_pid(pid), "--save-snapshot", path, *extra,
                         hb_dir=str(node.root / "hb"), prefix=node.enter(pid))
    if save and os.environ.get("DDPWATCH_SAVE_FIXTURES") == "1":
        shutil.copy(path, os.path.join(SNAPSHOTS, f"{save}.json"))
    return report


def until_diagnosed(node: Node, pid: int, expected: dict, *extra: str, save: str = "",
                    timeout: float = 60) -> dict:
    last = {}

    def check():
        nonlocal last
        last = diagnose_in(node, pid, *extra, save=save)
        return last if all(verdicts(last).get(r) == v for r, v in expected.items()) else None
    try:
        return wait_until(check, timeout, interval=0.5, what=f"diagnose on {node.name}: {expected}")
    except BaseException:
        print({r["rank"]: (r["verdict"], r["rule"], r["evidence"]) for r in last.get("ranks", [])})
        raise
