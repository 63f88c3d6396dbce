"""Two-node runs of the fault benchmark: one rank on each of two namespace nodes
(tests/support/netns.py: a network, PID, mount and UTS namespace each, on one
bridge), each node with its own `ddpwatch run` whose peer is the other node's,
as two machines on a LAN would have them. A framework with `nodes: 2` in the
catalogue runs this way.

What the runner reads from the benchmark's one host daemon (faultbench/watch.py
Watch) it reads here from the two nodes' daemons (`NodesWatch`: both /status
read every half second, both daemons' webhooks to one receiver on the bridge);
what it reads of a local job (faultbench/jobs.py Job) it reads of both nodes'
ranks (`PairJob`, host pids; the nodes number them their own way). `diagnose`
runs inside the node that holds the expected culprit (node 0 when none is
expected), as the person paged runs it there: the page names the node.

Faults of the network itself: `firewall` (node N drops the other node's new
connections, except its daemon's port, from before the job starts: Gloo's data
connections never come up) and `link` (every packet between the nodes dropped,
the daemons' included, from mid-run: a cable pulled, a switch port down)."""
from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
import urllib.error
import urllib.request

from common import Receiver

from .inject import Injection
from .jobs import HERE, TRAINS, Job, expand
from .waiting import NotReached, free_port, wait_for

sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "support"))
import netns  # noqa: E402  (tests/support/netns.py: pytest-free)

# network faults a pair knows; `firewall` is given before the job starts
NET_FAULTS = ("firewall", "link")


class Unavailable(RuntimeError):
    """This machine cannot make namespace nodes: the run is skipped with the reason."""


class PairJob:
    """Both nodes' processes as one job: each node's `sh` (its rank and daemon
    under it), the ranks found by RANK in their environment (host pids)."""

    def __init__(self, nodes: list[Job], rank_logs: list[str], announce: str):
        self.nodes, self.rank_logs, self.announce = nodes, rank_logs, announce
        self.started = min(n.started for n in nodes)

    @property
    def launcher_pid(self) -> int:
        return self.nodes[0].proc.pid

    def output(self) -> str:
        parts = []
        for i, path in enumerate(self.rank_logs):
            try:
                with open(path, "rb") as f:
                    parts.append(f"--- node{i} rank:\n" + f.read().decode("utf-8", "replace"))
            except OSError:
                parts.append(f"--- node{i} rank: (no output yet)")
        return "\n".join(parts + [f"--- node{i}:\n{n.output()}" for i, n in enumerate(self.nodes)])

    def pids(self) -> list[int]:
        return [p for n in self.nodes for p in n.pids()]

    def ranks(self) -> dict[int, int]:
        found = {}
        for n in self.nodes:
            found.update(n.ranks())  # Job.ranks: RANK in the environment (announce env)
        return found

    def trained(self, nranks: int) -> bool:
        seen = {int(r) for r in TRAINS[self.announce].findall(self.output())}
        return seen >= set(range(nranks))

    def close(self) -> None:
        for n in self.nodes:
            n.close()


class NodesWatch:
    """The two nodes' daemons, read as faultbench/watch.py Watch is: /status
    every half second (with the token: off loopback a daemon wants one), every
    webhook of both to one receiver."""

    def __init__(self, net: netns.Net, ports: list[int], token: str, hb_dirs: list[str]):
        self.urls = [f"http://{net.addr[i]}:{ports[i]}" for i in (0, 1)]
        self.token, self.hb_dirs = token, hb_dirs
        self.hb_dir = hb_dirs[0]
        self.receiver = Receiver(host=net.host_addr)
        self.readings: list[tuple[float, int, dict]] = []
        self._done = threading.Event()
        threading.Thread(target=self._poll, daemon=True).start()

    def get(self, i: int, path: str, parse=json.loads):
        """Node i's answer to `path`, parsed (JSON by default); None without one."""
        request = urllib.request.Request(self.urls[i] + path,
                                         headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as r:
                return parse(r.read())
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def _poll(self):
        while not self._done.wait(0.5):
            for i in (0, 1):
                status = self.get(i, "/status")
                if status:
                    self.readings.append((time.monotonic(), i, status))

    def job_of(self, pids, since: float = 0.0) -> tuple[float, dict] | None:
        """The last /status entry of the job on either node: a node runs one job, and
        its daemon numbers its pids its own way (the host's `pids` are not its)."""
        for t, _, status in reversed(self.readings):
            if t < since:
                break
            jobs = status.get("jobs", ())
            if jobs:
                return t, jobs[0]
        return None

    def entries(self, key: str, since: float) -> list[tuple[float, dict]]:
        return [(t, job) for t, _, status in self.readings if t >= since
                for job in status.get("jobs", ()) if job.get("key") == key]

    def close(self):
        self._done.set()
        self.receiver.close()


class Pair:
    """The two nodes of one run, their daemons and the job's two ranks; a
    `firewall` fault in place before the ranks start."""

    def __init__(self, spec, rundir: str, base_config: dict):
        try:
            self.net = netns.Net()
        except netns.Unavailable as err:
            raise Unavailable(str(err)) from None
        self.watch = None
        self.pre_fault = ""
        self.job = None
        try:
            self._start(spec, rundir, base_config)
        except BaseException:
            self.close()
            raise

    def _start(self, spec, rundir, base_config):
        net = self.net
        token = secrets.token_hex(32)
        ports = [free_port(), free_port()]
        roots = [os.path.join(rundir, f"node{i}") for i in (0, 1)]
        self.watch = NodesWatch(net, ports, token, [os.path.join(r, "hb") for r in roots])
        fault = spec.fault
        if fault["kind"] == "firewall":
            node = int(fault.get("node", 1))
            # new connections from the other node dropped, its daemon's port let in
            # (tests/nodes/test_two_nodes.py `firewalled` does the same)
            # refuse: answered with a reset (a port nobody listens on, a REJECT
            # rule) rather than dropped (tests/nodes/test_preflight.py tells them apart)
            refuse = bool(fault.get("refuse"))
            action = ("REJECT", "--reject-with", "tcp-reset") if refuse else ("DROP",)
            net.iptables(node, "INPUT", "-s", net.addr[1 - node], "-p", "tcp", "--syn", "!",
                         "--dport", str(ports[node]), "-j", *action)
            self.pre_fault = (f"node{node} {'refuses' if refuse else 'drops'} new connections "
                              f"from node{1 - node} (but its daemon's)")
        master_port = free_port()
        argv, env = expand(spec.argv, spec.env, master_port, rundir)
        nodes, logs = [], []
        for i in (0, 1):
            os.makedirs(os.path.join(roots[i], "hb"), exist_ok=True)
            config = {**base_config, "listen": f"{net.addr[i]}:{ports[i]}", "token": token,
                      "state_dir": os.path.join(roots[i], "state"),
                      "heartbeat_dir": os.path.join(roots[i], "hb"),
                      "peers": [f"http://{net.addr[1 - i]}:{ports[1 - i]}"],
                      "webhooks": [{"type": "generic", "url": self.watch.receiver.url}],
                      **spec.daemon}
            path = os.path.join(roots[i], "config.yaml")
            with open(path, "w") as f:
                json.dump(config, f)  # JSON is YAML
            rank_env = {**env, "MASTER_ADDR": net.addr[0], "MASTER_PORT": str(master_port),
                        "WORLD_SIZE": "2", "RANK": str(i), "LOCAL_RANK": "0",
                        "LOCAL_WORLD_SIZE": "1", "GLOO_SOCKET_IFNAME": net.ifname}
            rank = ["env", *(f"{k}={v}" for k, v in rank_env.items()), *argv]
            daemon = [sys.executable, "-m", "ddpwatch", "run", "--config", path]
            logs.append(os.path.join(roots[i], "rank.log"))
            node_argv = netns.node_argv(net, i, rank, logs[-1], daemon,
                                        os.path.join(roots[i], "daemon.log"))
            nodes.append(Job(node_argv, {}, os.path.join(roots[i], "node.log"), "env", False,
                             self.watch.hb_dirs[i]))
        self.job = PairJob(nodes, logs, spec.announce)
        for i in (0, 1):
            wait_for(lambda i=i: self.watch.get(i, "/readyz", bytes) is not None, 60,
                     f"node{i}'s daemon ready", self.job.output)

    def looker(self, ranks: dict[int, int], culprits) -> tuple[list[str], int, str]:
        """(prefix, pid as its node numbers it, heartbeat dir) for the diagnoser:
        inside the node of the first expected culprit, else of rank 0."""
        want = [r for r in culprits if r in ranks] + sorted(ranks)
        for rank in want:
            pid = ranks[rank]
            try:
                return netns.enter(pid), netns.ns_pid(pid), self.watch.hb_dirs[rank]
            except (OSError, StopIteration, ValueError):
                continue  # gone
        raise NotReached("no rank of the pair is left to diagnose")

    def close(self):
        if self.job is not None:
            self.job.close()
        if self.watch is not None:
            self.watch.close()
        self.net.close()


def link_down(fault, job, ranks, ctx) -> Injection:
    """Every packet between the nodes dropped on node N (both ways, the daemons'
    too); reached when neither rank prints a step for 3 s."""
    net = ctx.pair.net
    node = int(fault.get("node", 1))
    other = net.addr[1 - node]
    rules = [("INPUT", "-s", other, "-j", "DROP"), ("OUTPUT", "-d", other, "-j", "DROP")]
    for rule in rules:
        net.iptables(node, *rule)
        ctx.undo.append(lambda rule=rule: netns.run(*net.exec(node), "iptables", "-D", *rule))
    at = time.monotonic()
    inj = Injection(at, f"every packet between node{node} and node{1 - node} dropped")
    last = [job.output().count(" step "), time.monotonic()]

    def still():
        now = job.output().count(" step ")
        if now != last[0]:
            last[:] = [now, time.monotonic()]
        return time.monotonic() - last[1] >= 3.0
    wait_for(still, 30, "both ranks stopped stepping", job.output)
    return inj
