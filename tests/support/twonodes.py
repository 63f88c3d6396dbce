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
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import netns
import psutil
from netns import run  # noqa: F401 (tests/nodes use it from here)

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


class Net(netns.Net):
    """netns.Net, skipped with the reason (failed under DDPWATCH_REQUIRE_ALL) where
    this machine cannot make namespace nodes."""

    def __init__(self, prefix: str = "10.233"):
        try:
            super().__init__(prefix)
        except netns.Unavailable as err:
            need(False, str(err))

    def iptables(self, i: int, *rule: str) -> None:
        try:
            super().iptables(i, *rule)
        except RuntimeError as err:
            raise AssertionError(str(err)) from None


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
        argv = netns.node_argv(net, i, rank, str(root / "rank.log"), daemon,
                               str(root / "daemon.log"))
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
        return netns.ns_pid(pid)

    def enter(self, pid: int) -> list[str]:
        return netns.enter(pid)

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
        self.version, self.root = netns.cgroup_dir()
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
