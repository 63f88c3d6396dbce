"""Two namespace nodes on this host, without pytest: a bridge in the host
namespace with two network namespaces on it, and the command that runs one
node (a PID, mount and UTS namespace of its own, its hostname, its CPU cgroup
mount) inside one. tests/support/twonodes.py (the suite's two-node tests) and
benchmarks/faultbench/nodes.py (the fault benchmark's two-node runs) build on it.

Node 0 (the master) gets the higher address: Gloo connects each pair from the
higher address to the lower, so node 0 dials node 1 as the master dialled its
worker in docs/design.md "A firewall that drops Gloo's data connections"."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import uuid

TOOLS = ("ip", "iptables", "unshare", "nsenter")


class Unavailable(Exception):
    """This machine cannot make namespace nodes (not root, a tool missing, ip failed)."""


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


class Net:
    """A bridge in the host namespace with two node namespaces on it."""

    def __init__(self, prefix: str = "10.233"):
        """`prefix`: the nodes' first two octets (above 127 to have node 0's Gloo
        dial node 1's loopback address, as a 192.168 LAN's would)."""
        if os.geteuid() != 0 or not all(shutil.which(t) for t in TOOLS):
            raise Unavailable(f"needs root and {', '.join(TOOLS)} for namespace nodes")
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
                raise Unavailable(f"cannot set up namespace nodes ({' '.join(cmd)}): "
                                  f"{done.stderr.strip()}")
        for i, d in enumerate(self.hosts_dirs):
            # each node resolves its own hostname to its own address, as a LAN host would
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "hosts"), "w") as f:
                f.write(f"127.0.0.1 localhost\n{self.addr[i]} node{i}\n"
                        f"{self.addr[1 - i]} node{1 - i}\n")

    def exec(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns[i]]

    def iptables(self, i: int, *rule: str) -> None:
        """Append `rule` in node i's namespace (-A CHAIN ...); RuntimeError if refused."""
        done = run(*self.exec(i), "iptables", "-A", *rule)
        if done.returncode != 0:
            raise RuntimeError(f"iptables -A {' '.join(rule)} in {self.ns[i]}: {done.stderr}")

    def close(self) -> None:
        for ns in self.ns:
            run("ip", "netns", "del", ns)
        for link in self.links:
            run("ip", "link", "del", link)
        run("ip", "link", "del", self.bridge)
        for d in self.hosts_dirs:
            shutil.rmtree(d, ignore_errors=True)


def node_argv(net: Net, i: int, rank: list[str], rank_log: str, daemon: list[str],
              daemon_log: str) -> list[str]:
    """The command that runs node i: `sh` as pid 1 of a PID namespace in node i's
    network namespace, its hostname node{i}, starting `rank` and `daemon` (argv
    lists; their output to the two logs) and waiting for both."""
    # `ip netns exec` mounts a sysfs of its own, without the cgroup mounts under
    # it: the node mounts its CPU hierarchy, as a host has it
    version, _ = cgroup_dir()
    cgroup = ("mount -t cgroup2 none /sys/fs/cgroup; " if version == "v2" else
              "mount -t tmpfs none /sys/fs/cgroup; mkdir /sys/fs/cgroup/cpu; "
              "mount -t cgroup -o cpu none /sys/fs/cgroup/cpu; " if version == "v1" else "")
    inner = (f"{shlex.join(rank)} > {shlex.quote(rank_log)} 2>&1 & "
             f"{shlex.join(daemon)} > {shlex.quote(daemon_log)} 2>&1 & wait")
    script = f"hostname node{i}; {cgroup}sh -c {shlex.quote(inner)}; true"
    return [*net.exec(i), "unshare", "--pid", "--fork", "--mount-proc", "--uts",
            "sh", "-c", script]


def enter(pid: int) -> list[str]:
    """A prefix that runs a command in the namespaces of host pid `pid`."""
    return ["nsenter", "-t", str(pid), "--net", "--uts", "--pid", "--mount"]


def ns_pid(pid: int) -> int:
    """Host pid `pid` as its own PID namespace numbers it (NSpid's last)."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("NSpid:")).split()[-1])


def cgroup_dir() -> tuple[str, str]:
    """The CPU cgroup hierarchy: ("v2", "/sys/fs/cgroup"), ("v1", its cpu
    directory) or ("", "") when there is none to write in."""
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        with open("/sys/fs/cgroup/cgroup.controllers") as f:
            if "cpu" in f.read().split():
                return "v2", "/sys/fs/cgroup"
    if os.access("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", os.R_OK) and os.access(
            "/sys/fs/cgroup/cpu", os.W_OK):
        return "v1", "/sys/fs/cgroup/cpu"
    return "", ""
