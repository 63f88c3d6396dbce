"""Pure pieces of the judgement across nodes: where a rank's peers on
other nodes are, how long each rank works per step next to its peers, and where
a culprit no view holds is named."""
from __future__ import annotations

import os

from conftest import REPO, TESTS

from ddpwatch.judge.signals import peers, window
from ddpwatch.judge.signals.sockets import remote_addrs
from ddpwatch.observe.system.netns import net_ns
from ddpwatch.observe.probes.sockets import TcpSocket


def sock(state, local, peer, lport=40000, pport=29500):
    return TcpSocket(inode=1, family="inet", state=state, local_addr=local, local_port=lport,
                     peer_addr=peer, peer_port=pport, recv_q=0, send_q=0, retries=0)


def test_remote_addrs_are_the_far_ends_on_other_hosts():
    socks = [sock("ESTABLISHED", "10.0.0.2", "10.0.0.1"),
             sock("ESTABLISHED", "::ffff:10.0.0.2", "::ffff:10.0.0.3"),
             sock("ESTABLISHED", "10.0.0.2", "10.0.0.2"),   # a rank of this node
             sock("ESTABLISHED", "127.0.0.1", "127.0.0.1"),
             sock("SYN-SENT", "10.0.0.2", "10.0.0.9"),      # not connected: not a peer
             sock("LISTEN", "0.0.0.0", "0.0.0.0")]
    assert remote_addrs(socks) == "10.0.0.1 10.0.0.3"
    assert remote_addrs([sock("ESTABLISHED", "127.0.0.1", "127.0.0.1")]) is None


def rank(r, share, remote=False, **more):
    return {"pid": 100 + r, "rank": r, "world_size": 2, "alive": True, "hb_step_s": 0.2,
            "hb_comm_share": share, "remote": remote, "node": f"node{r}", **more}


def linked(*ranks):
    ranks = [dict(r) for r in ranks]
    peers.link(ranks)
    window.link(ranks)
    peers.blame_elsewhere(ranks)
    return {s["rank"]: s for s in ranks}


def test_the_rank_that_works_longest_outworks_its_peers_on_other_nodes():
    # numbers of the real run: node 1's rank under a 0.15-core quota waits 45% of
    # each step, node 0's 90%
    got = linked(rank(0, 0.90), rank(1, 0.45, remote=True))
    assert got[1]["compute_ratio"] == 5.5 and got[1]["outworks_peers"]
    assert got[1]["peers_remote"] == 1 and got[0]["peers_remote"] == 1
    assert got[1]["straggles"] and got[0]["peer_straggles"] and not got[0]["straggles"]
    assert got[0]["compute_ratio"] == 0.18 and not got[0]["outworks_peers"]
    # a healthy pair on a busy host: 44% and 40% waiting
    healthy = linked(rank(0, 0.44), rank(1, 0.40, remote=True))
    assert not any(s["outworks_peers"] or s["straggles"] for s in healthy.values())
    # on one node, the old rules decide (no peer on another node)
    local = linked(rank(0, 0.90), rank(1, 0.45))
    assert local[1]["outworks_peers"] and not local[1]["straggles"]
    # peers that wait all the time: the ratio is floored, not infinite
    assert linked(rank(0, 1.0), rank(1, 0.45, remote=True))[1]["compute_ratio"] == 11.0


def test_a_lone_view_blames_a_rank_on_the_address_it_waits_for():
    got = linked(rank(0, 0.95, remote_addrs="10.0.0.1"))
    assert got[0]["ranks_unseen"] == 1
    assert got[0]["blamed_elsewhere"] == "a rank on 10.0.0.1"
    # the whole job in view: nobody is blamed elsewhere
    both = linked(rank(0, 0.9, remote_addrs="10.0.0.1"), rank(1, 0.45, remote=True))
    assert both[0]["ranks_unseen"] == 0 and "blamed_elsewhere" not in both[0]


def test_an_unanswered_data_connect_blames_the_node_it_dials():
    dialler = rank(0, None, syn_sent=1, syn_sent_data=True, syn_sent_to="10.0.0.1:41234")
    assert linked(dialler)[0]["blamed_elsewhere"] == "the node at 10.0.0.1"
    # that node's capture in view (its daemon a peer): the rank there is named instead
    tied = dict(dialler, syn_sent_dropped_by=1)
    assert "blamed_elsewhere" not in linked(tied)[0]


def test_net_ns_of_a_process():
    assert net_ns("/proc", os.getpid()).startswith("net:[")
    assert net_ns("/proc", 0) == ""


def test_the_incident_page_names_a_culprit_elsewhere():
    """A replayed lone view (node 0 alone): its page says where the
    culprit is instead of "no culprit named on this node"."""
    from ddpwatch.judge import classify, rules
    from ddpwatch.observe.snapshot import load
    from ddpwatch.publish import page, report
    path = os.path.join(TESTS, "fixtures", "snapshots",
                        "two_nodes_lone_node0.json")
    history = load(path)
    judged = classify.judge(history, rules.load(os.path.join(
        REPO, "rules", "default.yaml")))
    doc = report.as_json(judged, history[-1])
    html = page.render(doc, history)
    assert "culprit: a rank on 10.233." in html and "(not watched from this node)" in html
    assert "no culprit named on this node" not in html


def test_a_straggler_on_a_slower_cpu_names_both_cpu_models():
    """Node 1's rank (a remote straggler in node 0's view, tests/nodes/test_two_nodes.py)
    on another CPU model than its peer: the page states both models beside the
    measured ratio. One host has one CPU, so node 1's model is set in its saved
    signals; with the same model (as measured) nothing is said."""
    import os

    from ddpwatch.judge import classify, rules as rules_mod
    from ddpwatch.observe.snapshot import load, load_remote
    path = os.path.join(TESTS, "fixtures", "snapshots",
                        "two_nodes_throttled_node0.json")
    history, remote = load(path), load_remote(path)
    rules = rules_mod.load_default(None)
    same = {v.rank: v for v in classify.judge(history, rules, remote).ranks}
    assert same[1].rule == "straggler-across-nodes" and "its CPU:" not in same[1].evidence
    laptop = "Intel(R) Core(TM) i5-8250U CPU @ 1.60GHz"
    slower = tuple(dict(r, cpu_model=laptop) if r.get("rank") == 1 else r for r in remote)
    ranks = {v.rank: v for v in classify.judge(history, rules, slower).ranks}
    here = history[-1].host.cpu.model_name
    assert ranks[1].rule == "straggler-across-nodes", ranks[1]
    assert f"its CPU: {laptop}, its peers': {here}" in ranks[1].evidence, ranks[1].evidence
    assert ranks[0].signals["peer_cpu_model"] == laptop  # node 0's rank knows its peer's
    assert f"{ranks[1].signals['compute_ratio']}x" in ranks[1].evidence


def test_a_rank_idle_outside_collectives_on_a_slow_link_does_not_outwork_its_peer():
    """The shares of a 2.4 s step on a link shaped to 8 Mbit/s (seen in a full run):
    rank 0 outside the collectives' accounting 32% of the step at 3% CPU, its peer
    inside 100%. By the shares alone it works 6x as long; it uses no CPU for it, so
    it is no straggler. The same shares with the CPU busy, or held back by a quota,
    are one."""
    from ddpwatch.judge.signals import peers

    def pair(**mine):
        me = {"rank": 0, "alive": True, "hb_comm_share": 0.68, "hb_step_s": 2.375,
              "cpu_ratio": 0.03, "runqueue_wait_ratio": 0.0, **mine}
        other = {"rank": 1, "alive": True, "remote": True, "hb_comm_share": 1.0,
                 "hb_step_s": 2.37, "cpu_ratio": 0.02, "runqueue_wait_ratio": 0.0}
        ranks = [me, other]
        peers.link(ranks)
        return me
    idle = pair()
    assert idle["compute_ratio"] >= 2.5 and not idle["outworks_peers"]
    assert pair(cpu_ratio=0.4)["outworks_peers"]
    assert pair(cpu_ratio=0.05, throttled_share=0.6)["outworks_peers"]
