"""A slow link between two namespace nodes ("a slow link (comm share
vs bytes)"): the bundled trainer on two nodes, healthy first, then both
directions of node 1's link shaped to 8 Mbit/s with `tc qdisc tbf`. Every rank
then waits in its collectives nearly all of each step and none works longer
than the other: no rank is the culprit, the link is, with the bytes per second
the collectives moved."""
from __future__ import annotations

import shutil
import time

import pytest

from conftest import need, wait_until
from twonodes import (HEALTHY, TOKEN, token_file, TRAINER, Net, Starter, job_on, run, seen, start_pair,
                      until_diagnosed)

SLOW = {0: ("slow_collective", "none"), 1: ("slow_collective", "none")}
RATE = ("rate", "8mbit", "burst", "32kbit", "latency", "400ms")


@pytest.fixture(scope="module")
def shaped(tmp_path_factory):
    need(shutil.which("tc") is not None, "needs tc (iproute2)")
    net = Net()
    start = Starter(tmp_path_factory.mktemp("link"))
    try:
        nodes, key = start_pair(start, start.tmp, net, TRAINER)
        for node in nodes:
            wait_until(lambda: seen(node, key) == HEALTHY, 180,
                       what=lambda: f"both ranks healthy on {node.name}'s /status\n{node.logs()}")
        # the host's end of node 1's veth shapes what node 1 receives, node 1's
        # eth0 what it sends
        for cmd in (("tc", "qdisc", "add", "dev", net.links[1], "root", "tbf", *RATE),
                    (*net.exec(1), "tc", "qdisc", "add", "dev", net.ifname, "root", "tbf",
                     *RATE)):
            done = run(*cmd)
            need(done.returncode == 0, f"tc tbf: {done.stderr}")
        yield nodes, key
    finally:
        start.kill()
        net.close()


def test_a_slow_link_is_named_on_both_pages_and_no_rank_is_blamed(shaped):
    nodes, key = shaped
    def settled(node):
        """Both ranks slow_collective once a window holds only shaped collectives
        (8 Mbit/s each way: a ring all-reduce of two moves well under 2 MB/s; the
        first window after shaping still holds the fast ones)."""
        job = job_on(node, key)
        if seen(node, key) != SLOW or not all(
                0 < (r["signals"].get("hb_comm_mbps") or 0) < 2.0 for r in job["ranks"]):
            return None
        return job
    for node in nodes:
        job = wait_until(lambda: settled(node), 90, interval=0.5,
                         what=lambda: f"both ranks slow_collective at under 2 MB/s on "
                                      f"{node.name}'s /status\n{node.logs()}")
        assert job["job"]["culprits"] == [] and job["job"]["verdict"] == "slow_collective"
        for rank in job["ranks"]:
            assert rank["rule"] == "slow-link", rank
            assert f"{rank['signals']['hb_comm_mbps']} MB/s" in rank["evidence"], rank
        assert "no rank arrives late, the data is slow" in job["job"]["summary"]
    # Once the link is slow, no rank is the straggler: both wait on the bytes. (A
    # window with no step ended in it, 3 s steps against a 2 s window, is
    # `unknown`, which is calm.)
    for _ in range(10):
        for node in nodes:
            job = job_on(node, key)
            assert job is not None and job["job"]["culprits"] == [], job["job"]["summary"]
        time.sleep(0.5)
    # diagnose in node 0 with the peer view says the same (a window longer than a
    # 3 s step, so that one ends in it); its snapshot is the replay fixture
    report = until_diagnosed(nodes[0], nodes[0].rank_pids()[0], SLOW, "--peer", nodes[1].url,
                             "--token-file", token_file(), "--window", "4", save="two_nodes_slow_link_node0")
    assert report["job"]["culprits"] == []
