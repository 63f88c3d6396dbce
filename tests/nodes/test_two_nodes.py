"""Two nodes, one judgement: two namespace nodes on this host
(tests/support/twonodes.py: each its own network, PID, mount and UTS namespace; one
daemon per node with the other as its peer), one rank of a 2-rank Gloo job on
each, node 0 the master.

* Node 1's rank held to 0.15 cores by a cgroup CPU quota is the straggler on
  both nodes' /status, node 0's rank its victim, with the measured ratio of the
  time each works per step; `diagnose` inside node 1 names the quota.
* A lone view (a daemon without peers, `diagnose` without --peer) of node 0's
  waiting rank: a victim of "a rank on <node 1's address>", never itself.
* Node 1's firewall drops the master's new connections: node 1 is the culprit on
  both pages and node 0's rank its victim; node 0's lone view blames the node at
  node 1's address.

One job per scenario, shared by its assertions. `DDPWATCH_SAVE_FIXTURES=1`
copies the snapshots judged into tests/fixtures/snapshots (two_nodes_*.json).
"""
from __future__ import annotations

import os
import sys
import time

import pytest
from conftest import TESTS, free_port, need, wait_until
from diag import by_rank, until_verdict
from twonodes import (HEALTHY, TOKEN, token_file, TRAINER, CpuQuota, Net, Node, Starter, get_json, job_on,
                      seen, start_pair, until_diagnosed)

from ddpwatch.observe.snapshot import load_remote

STRAGGLER = {0: ("waiting_on_peer", "victim"), 1: ("straggler", "culprit")}


# The straggler on node 1 by what each view sees: its own durations or run-queue
# wait against its peers on other nodes, or, where node 1's window is seen (its
# daemon, its diagnose, the peer view), the cgroup quota itself
ACROSS = ("straggler-across-nodes", "straggler-throttled")
STARVED_ACROSS = ("straggler-starved-across-nodes", "straggler-throttled")


def lone_daemon(start: Starter, node: Node, pid: int) -> str:
    """A second daemon in node 0's namespaces with no peers: what a node without
    the peer view shows. Its URL."""
    port = free_port()
    config = node.root / "lone.yaml"
    config.write_text(f"listen: {node.net.addr[node.i]}:{port}\ntoken: {TOKEN}\ntick_s: 0.5\n"
                      f"state_dir: {node.root / 'lone-state'}\n"
                      f"heartbeat_dir: {node.root / 'hb'}\n")
    start([*node.enter(pid), sys.executable, "-m", "ddpwatch", "run", "--config", str(config)],
          env={"DDPWATCH_DIR": str(node.root / "hb")}, name="lone")
    return f"http://{node.net.addr[node.i]}:{port}"


@pytest.fixture(scope="module")
def throttled(tmp_path_factory):
    """The bundled trainer on two nodes, healthy first, then node 1's rank under a
    0.15-core CPU quota: (net, nodes, job key, {rank: host pid}, starter)."""
    net = Net()
    start = Starter(tmp_path_factory.mktemp("throttled"))
    quota = None
    try:
        nodes, key = start_pair(start, start.tmp, net, TRAINER)
        logs = lambda: nodes[0].logs() + nodes[1].logs()  # noqa: E731
        for node in nodes:
            wait_until(lambda: seen(node, key) == HEALTHY, 180,
                       what=lambda: f"both ranks healthy on {node.name}'s /status\n{logs()}")
        pids = {0: nodes[0].rank_pids()[0], 1: nodes[1].rank_pids()[0]}
        quota = CpuQuota(0.15)
        quota.add(pids[1])
        yield net, nodes, key, pids, start
    finally:
        start.kill()
        if quota:
            quota.close()
        net.close()


def test_quota_throttled_rank_on_node1_is_the_straggler_on_both_pages(throttled):
    net, nodes, key, pids, _ = throttled
    # within 90 s of the quota (60 s to be judged one, then slow over most of
    # straggler_after_s: watch/slow.py), and still so a few ticks later (no flip-flop)
    for node in nodes:
        wait_until(lambda: seen(node, key) == STRAGGLER, 90,
                   what=lambda: f"rank 1 the straggler on {node.name}'s /status\n{node.logs()}")
    for node in nodes:
        ticks = set()
        while len(ticks) < 6:  # six ticks in a row, about 3 s: no flip-flop
            doc = get_json(node.url + "/status")
            ticks.add(doc["tick"])
            assert seen(node, key) == STRAGGLER, node.name
            time.sleep(0.2)
        job = job_on(node, key)
        assert job["job"]["culprits"] == [1]
        ranks = {r["rank"]: r for r in job["ranks"]}
        assert ranks[1]["host"] == "node1" and ranks[0]["host"] == "node0"
        # the page states the measured ratio of the time each rank works per step
        ratio = ranks[1]["signals"]["compute_ratio"]
        assert ratio >= 2.5 and f"{ratio}x" in ranks[1]["evidence"]
        assert "rank 1 (on node1) is the culprit (straggler)" in job["job"]["summary"] or (
            node.i == 1 and "rank 1 is the culprit (straggler)" in job["job"]["summary"])


def test_diagnose_in_node1_names_the_quota_and_in_node0_the_straggler(throttled):
    net, nodes, key, pids, _ = throttled
    # node 1's own diagnose, with the peer view: the quota is seen there
    report = until_diagnosed(nodes[1], pids[1], STRAGGLER, "--peer", nodes[0].url,
                             "--token-file", token_file(), save="two_nodes_throttled_node1")
    rank1 = by_rank(report)[1]
    assert rank1["rule"] == "straggler-throttled"
    assert "limit 0.15 cores" in rank1["evidence"] and "as long per step" in rank1["evidence"]
    # node 0's, with the peer view: rank 1 across nodes, by each rank's own durations
    report = until_diagnosed(nodes[0], pids[0], STRAGGLER, "--peer", nodes[1].url,
                             "--token-file", token_file(), save="two_nodes_throttled_node0")
    # by its own durations, or, with node 1's window in the peer view, by the quota
    assert by_rank(report)[1]["rule"] in ACROSS
    assert report["job"]["culprits"] == [1]
    saved = os.path.join(nodes[0].root, "two_nodes_throttled_node0.json")
    assert [s["rank"] for s in load_remote(saved)] == [1]  # a replay judges what was judged
    # a watcher in the host namespace, judging node 1's rank, says the same
    report = until_verdict(pids[1], STRAGGLER, timeout=60, hb_dir=str(nodes[1].root / "hb"))
    assert by_rank(report)[1]["rule"] == "straggler-throttled"


def test_lone_views_of_node0_blame_a_rank_on_node1(throttled):
    net, nodes, key, pids, start = throttled
    expected = {0: ("waiting_on_peer", "victim")}
    report = until_diagnosed(nodes[0], pids[0], expected, save="two_nodes_lone_node0")
    assert [r["rank"] for r in report["ranks"]] == [0]
    assert by_rank(report)[0]["rule"] == "waiting-on-unseen-node"
    assert report["job"]["culprits"] == []
    assert report["job"]["culprit_elsewhere"] == f"a rank on {net.addr[1]}"
    assert report["job"]["summary"].startswith(f"The culprit is a rank on {net.addr[1]}")
    lone = lone_daemon(start, nodes[0], pids[0])
    wait_until(lambda: {r["rank"]: (r["verdict"], r["role"]) for j in (
        get_json(lone + "/status") or {}).get("jobs", []) if j["key"] == key
        for r in j["ranks"]} == expected, 60, what="the lone daemon judging rank 0 a victim")
    job = next(j for j in get_json(lone + "/status")["jobs"] if j["key"] == key)
    assert job["job"]["culprits"] == [] and f"a rank on {net.addr[1]}" in job["job"]["summary"]
    assert job["job"]["culprit_elsewhere"] == f"a rank on {net.addr[1]}"


def test_third_party_trainer_without_heartbeats(tmp_path):
    """The same quota on a plain torchrun script (tests/jobs/thirdparty), no
    heartbeats: both pages compare the ranks by their run-queue wait, each node's
    own clock's ratio."""
    script = os.path.join(TESTS, "jobs", "thirdparty", "torchrun_ddp.py")
    net = Net()
    start = Starter(tmp_path)
    quota = None
    try:
        nodes, _ = start_pair(start, tmp_path, net, [], torchrun=script,
                              extra_env={"DDPWATCH_AUTO": "0"})
        for node in nodes:
            wait_until(lambda: seen(node, None) == HEALTHY, 180,
                       what=lambda: f"both ranks healthy on {node.name}\n{node.logs()}")
        # node 0's lone view (no --peer, no heartbeats) of the healthy job: no alarm
        pid0 = nodes[0].rank_pids()[0]
        report = until_diagnosed(nodes[0], pid0, {0: ("healthy", "none")}, timeout=30,
                                 save="two_nodes_thirdparty_lone_healthy_node0")
        assert report["job"]["culprits"] == [] and not report["job"]["culprit_elsewhere"]
        quota = CpuQuota(0.15)
        quota.add(nodes[1].rank_pids()[0])
        for node in nodes:  # judged, then slow over straggler_after_s (watch/slow.py)
            wait_until(lambda: seen(node, None) == STRAGGLER, 90,
                       what=lambda: f"rank 1 the straggler on {node.name}\n{node.logs()}")
            job = job_on(node, None)
            ranks = {r["rank"]: r for r in job["ranks"]}
            assert not ranks[1]["signals"].get("hb") and job["job"]["culprits"] == [1]
            assert ranks[1]["rule"] in STARVED_ACROSS
            assert ("x its peers on other nodes" in ranks[1]["evidence"]
                    or "throttled" in ranks[1]["evidence"])
        # node 0's diagnose with the peer view judges the same
        report = until_diagnosed(nodes[0], pid0, STRAGGLER, "--peer", nodes[1].url, "--token-file",
                                 token_file(), save="two_nodes_thirdparty_node0")
        assert by_rank(report)[1]["rule"] in STARVED_ACROSS
        # node 0's lone view (no --peer, no heartbeats): its rank waits on a rank on
        # node 1's address, never itself the culprit
        report = until_diagnosed(nodes[0], pid0, {0: ("waiting_on_peer", "victim")},
                                 save="two_nodes_thirdparty_lone_node0")
        assert [r["rank"] for r in report["ranks"]] == [0]
        assert by_rank(report)[0]["rule"] == "waiting-on-unseen-node-window"
        assert report["job"]["culprits"] == []
        assert report["job"]["culprit_elsewhere"] == f"a rank on {net.addr[1]}"
        assert report["job"]["summary"].startswith(f"The culprit is a rank on {net.addr[1]}")
    finally:
        start.kill()
        if quota:
            quota.close()
        net.close()


@pytest.fixture
def firewalled(tmp_path):
    """Two nodes whose node 1 drops the new connections node 0 makes (its daemon's
    port excepted), a job started on both."""
    net = Net()
    start = Starter(tmp_path)
    try:
        nodes, key = None, None
        # the daemons' ports are known once the pair is made; the rule goes in first
        # so that the job never connects: drop every SYN from node 0 but to node 1's
        # daemon, whose port is picked here and handed to start_pair
        port1 = free_port()
        net.iptables(1, "INPUT", "-s", net.addr[0], "-p", "tcp", "--syn", "!", "--dport",
                     str(port1), "-j", "DROP")
        nodes, key = start_pair(start, tmp_path, net, TRAINER, ports=(free_port(), port1))
        yield net, nodes, key, start
    finally:
        start.kill()
        net.close()


def test_a_firewall_on_node1_makes_node1_the_culprit_on_both_pages(firewalled):
    net, nodes, key, start = firewalled
    expected = {0: ("unreachable_peer", "victim"), 1: ("unreachable_peer", "culprit")}
    for node in nodes:
        wait_until(lambda: seen(node, key) == expected, 90,
                   what=lambda: f"node 1's firewall named on {node.name} (it shows "
                                f"{seen(node, key)})\n{node.logs()}")
    for node in nodes:
        job = job_on(node, key)
        ranks = {r["rank"]: r for r in job["ranks"]}
        assert job["job"]["culprits"] == [1]
        assert ranks[1]["rule"] == "dropped-inbound" and ranks[1]["host"] == "node1"
        assert ranks[1]["signals"]["syn_in_from"] == net.addr[0]
        assert ranks[0]["rule"] == "unreachable-peer-dropped-there"
    # a watcher in the host namespace judging node 1's rank captures node 1's wire
    # (observe/system/netns.py), not the host's, and says what node 1's daemon says
    pid1 = nodes[1].rank_pids()[0]
    report = until_verdict(pid1, {1: ("unreachable_peer", "culprit")}, timeout=60,
                           hb_dir=str(nodes[1].root / "hb"), extra=("--syn-wait", "10"))
    assert by_rank(report)[1]["rule"] == "dropped-inbound"
    assert by_rank(report)[1]["signals"]["syn_in_from"] == net.addr[0]
    # node 0 alone (no peer view): its rank is a victim of the node it dials
    pid0 = nodes[0].rank_pids()[0]
    report = until_diagnosed(nodes[0], pid0, {0: ("unreachable_peer", "victim")},
                             "--syn-wait", "0", save="two_nodes_firewall_lone_node0")
    assert by_rank(report)[0]["rule"] == "unreachable-peer-data"
    assert report["job"]["culprits"] == []
    assert report["job"]["culprit_elsewhere"] == f"the node at {net.addr[1]}"
