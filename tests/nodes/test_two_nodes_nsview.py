"""A rank judged with its own namespace's view: node 1 of two
namespace nodes (tests/support/twonodes.py: its own network, PID, mount and UTS
namespaces) resolves its hostname to 127.0.1.1, as Debian's /etc/hosts does
(/etc/netns/<ns>/hosts, which `ip netns exec` mounts as its /etc/hosts). Its
rank, without GLOO_SOCKET_IFNAME, has Gloo listen there, and node 0's rank is
sent to its own loopback. `diagnose` from the host namespace (hostname "vm",
resolving to 127.0.0.1 here) says what `diagnose` inside node 1 says: node1
resolves to 127.0.1.1 (probes/nshost.py), not the watcher's hostname; and so
does a daemon in the host namespace."""
from __future__ import annotations

import os
import shutil
import socket
import sys

import pytest
from conftest import free_port, wait_until
from diag import by_rank, until_verdict
from twonodes import (SNAPSHOTS, TOKEN, TRAINER, Net, Starter, get_json, start_pair,
                      until_diagnosed)

from ddpwatch.observe.probes.nshost import hosts_sources

CULPRIT = {1: ("unreachable_peer", "culprit")}


@pytest.fixture
def loopback_node1(tmp_path):
    net = Net("198.18")  # node 0's address above node 1's 127.0.1.1: node 0 dials it
    start = Starter(tmp_path)
    try:
        with open(f"{net.hosts_dirs[1]}/hosts", "w") as f:
            f.write(f"127.0.0.1 localhost\n127.0.1.1 node1\n{net.addr[0]} node0\n")
        nodes, _ = start_pair(start, tmp_path, net, TRAINER,
                              node_env=({}, {"GLOO_SOCKET_IFNAME": None}))
        yield net, nodes, start
    finally:
        start.kill()
        net.close()


def wrong_interface(rank: dict) -> dict:
    (finding,) = [f for f in rank["findings"] if f["id"] == "wrong_interface"]
    return finding


def test_host_watcher_sees_the_nodes_hostname_resolution(loopback_node1, tmp_path):
    net, nodes, start = loopback_node1
    pid1 = _rank_pid(nodes[1])
    # inside node 1: its own hostname and /etc/hosts, as the host probe reads them
    inside = by_rank(until_diagnosed(nodes[1], pid1, CULPRIT, timeout=120))[1]
    # from the host namespace, whose hostname is not node1
    saved = str(nodes[1].root / "two_nodes_nsview_outside.json")
    outside = by_rank(until_verdict(pid1, CULPRIT, timeout=60, hb_dir=str(nodes[1].root / "hb"),
                                    extra=("--save-snapshot", saved)))[1]
    if os.environ.get("DDPWATCH_SAVE_FIXTURES") == "1":
        shutil.copy(saved, os.path.join(SNAPSHOTS, "two_nodes_nsview_outside.json"))
    assert socket.gethostname() != "node1"
    for rank in (inside, outside):
        assert rank["rule"] == "unreachable-loopback-address", rank
        assert rank["signals"]["gloo_addr"] == "127.0.1.1"
        assert rank["signals"]["node"] == "node1"
        assert "node1 resolves to 127.0.1.1" in wrong_interface(rank)["evidence"]
        assert rank["signals"]["master_route_iface"] == net.ifname  # its eth0, not ours
    if files_first():  # the whole answer was seen there, the same words as inside
        assert outside["signals"]["ns_unseen"] == ""
        assert wrong_interface(outside)["evidence"] == wrong_interface(inside)["evidence"]
    else:  # what its nsswitch asks before its hosts file was not looked up: said so
        assert "before /etc/hosts" in outside["signals"]["ns_unseen"]
    # a daemon in the host namespace judges node 1's rank with node 1's view too
    daemon = host_daemon(start, tmp_path, nodes[1])
    rank = wait_until(lambda: rank_on(daemon, pid1, "unreachable-loopback-address"), 60,
                      what=lambda: f"the host's daemon judging node 1's rank\n{nodes[1].logs()}")
    assert rank["role"] == "culprit" and rank["signals"]["node"] == "node1"
    assert "node1 resolves to 127.0.1.1" in wrong_interface(rank)["evidence"]


def host_daemon(start, tmp_path, node) -> str:
    """`ddpwatch run` in the host namespace, with node's heartbeat directory; its URL."""
    port = free_port()
    config = tmp_path / "host-daemon.yaml"
    config.write_text(f"listen: 127.0.0.1:{port}\ntoken: {TOKEN}\ntick_s: 0.5\n"
                      f"state_dir: {tmp_path / 'host-state'}\n"
                      f"heartbeat_dir: {node.root / 'hb'}\n")
    start([sys.executable, "-m", "ddpwatch", "run", "--config", str(config)], name="host-daemon")
    return f"http://127.0.0.1:{port}"


def rank_on(url: str, pid: int, rule: str):
    """Rank `pid` (host pid) on the daemon's /status once judged by `rule`."""
    for job in (get_json(url + "/status") or {}).get("jobs", []):
        for r in job["ranks"]:
            if r["pid"] == pid and r["rule"] == rule:
                return r
    return None


def files_first() -> bool:
    """The node's nsswitch.conf (its mount namespace's copy of ours) asks
    /etc/hosts before anything else."""
    try:
        with open("/etc/nsswitch.conf") as f:
            return (hosts_sources(f.read()) or ("dns",))[0] == "files"
    except OSError:
        return False


def _rank_pid(node):
    return wait_until(lambda: (node.rank_pids() or [None])[0], 120,
                      what=lambda: f"{node.name}'s rank started\n{node.logs()}")
