"""Which node sends a cross-node job's webhooks (ddpwatch/publish/alerts/route.py), on
judgements of a replayed 2-rank hang split into two "nodes" as the peer view
joins them (tests/unit/observe/test_peers_unit.py), and the per-incident routing state machine."""
from __future__ import annotations

import os

import pytest
from conftest import REPO
from peer_views import node_view, over_the_wire

from ddpwatch.judge import classify, rules as rules_mod
from ddpwatch.publish.alerts.route import AlertRoute, owner_node
from ddpwatch.observe.peers import PeerDocumentError, parse
from ddpwatch.observe.snapshot import load

SNAPSHOTS = os.path.join(REPO, "tests", "fixtures", "snapshots")


@pytest.fixture(scope="module")
def split_hang():
    rules = rules_mod.load(os.path.join(REPO, "rules", "default.yaml"))
    history = load(os.path.join(SNAPSHOTS, "trainer_hang.json"))
    a, b = node_view(history, 0, "node-a"), node_view(history, 1, "node-b")
    alone_a, alone_b = classify.judge(a, rules), classify.judge(b, rules)
    return {"alone_a": alone_a, "alone_b": alone_b,
            "on_a": classify.judge(a, rules, remote=over_the_wire(alone_b)),
            "on_b": classify.judge(b, rules, remote=over_the_wire(alone_a))}


def test_both_nodes_agree_the_lowest_ranks_node_alerts(split_hang):
    on_a, on_b = split_hang["on_a"], split_hang["on_b"]
    assert on_a.job.culprits == on_b.job.culprits == (1,)  # the culprit is on node-b...
    assert owner_node(on_a.ranks, "node-a") == "node-a"   # ...the owner stays rank 0's node
    assert owner_node(on_b.ranks, "node-b") == "node-a"


def test_a_node_without_webhooks_is_passed_over(split_hang):
    """Rank 0's node has no webhooks: the next lowest rank's node alerts at once
    (with three nodes, only that one: the others still defer to it)."""
    on_b = split_hang["on_b"]
    assert owner_node(on_b.ranks, "node-b", mute=frozenset({"node-a"})) == "node-b"
    assert owner_node(on_b.ranks, "node-b", mute=frozenset({"node-c"})) == "node-a"
    route = AlertRoute(grace_s=5.0)
    assert route.route("i1", "job", owner_node(on_b.ranks, "node-b", frozenset({"node-a"})),
                       "node-b", {}, now=0.0)


def test_a_node_alone_alerts_itself(split_hang):
    alone_b = split_hang["alone_b"]
    assert [v.rank for v in alone_b.ranks] == [1]
    assert owner_node(alone_b.ranks, "node-b") == "node-b"
    assert owner_node((), "node-a") == "node-a"


def test_the_owner_alerts_at_once_and_tells_its_peers():
    route = AlertRoute(grace_s=5.0)
    assert route.route("i1", "job", "node-b", "node-b", {}, now=0.0)
    assert route.alerts_from("i1", "node-b") == "node-b"
    assert route.sent_from_here() == {"i1": "job"}
    assert route.forget("i1") is True          # it fired here: its resolved goes from here
    assert route.sent_from_here() == {}


def test_another_node_defers_to_a_claim_and_never_doubles_it():
    route = AlertRoute(grace_s=5.0)
    assert not route.route("i1", "job", "node-b", "node-a", {}, now=0.0)
    assert route.alerts_from("i1", "node-a") == ""               # waiting for node-b
    claims = {"node-b": frozenset({"job"})}
    for now in (1.0, 10.0, 100.0):                               # claimed: deferred for good
        assert not route.route("i1", "job", "node-b", "node-a", claims, now=now)
    assert route.alerts_from("i1", "node-a") == "node-b"
    assert route.sent_from_here() == {}
    assert route.forget("i1") is False         # never fired here: no resolved from here


def test_the_owner_never_defers_to_a_peers_claim():
    """A peer's claim is its word over a label any user picks: the owner (rank 0's
    node by its own judgement) pages whoever claims the job."""
    route = AlertRoute(grace_s=5.0)
    claims = {"node-b": frozenset({"job"})}
    assert route.route("i1", "job", "node-a", "node-a", claims, now=0.0)
    assert route.alerts_from("i1", "node-a") == "node-a"


def test_only_the_owners_claim_silences_a_node():
    """node-a judges rank 0 on node-b: node-c's claim of the label is ignored (it
    waits for node-b and pages after the grace), node-b's is taken."""
    route = AlertRoute(grace_s=5.0)
    hostile = {"node-c": frozenset({"job"}), "node-b": frozenset({"another-job"})}
    assert not route.route("i1", "job", "node-b", "node-a", hostile, now=0.0)
    assert route.alerts_from("i1", "node-a") == ""                 # waiting, not deferring
    assert route.route("i1", "job", "node-b", "node-a", hostile, now=5.0)
    owners = AlertRoute(grace_s=5.0)
    both = {"node-c": frozenset({"job"}), "node-b": frozenset({"job"})}
    assert not owners.route("i2", "job", "node-b", "node-a", both, now=0.0)
    assert owners.alerts_from("i2", "node-a") == "node-b"


def test_no_claim_within_the_grace_and_this_node_alerts():
    """The owner may not ask this node, may judge otherwise, or may have no webhooks."""
    route = AlertRoute(grace_s=5.0)
    other_job = {"node-b": frozenset({"another-job"})}
    assert not route.route("i1", "job", "node-b", "node-a", other_job, now=0.0)
    assert not route.route("i1", "job", "node-b", "node-a", other_job, now=4.9)
    assert route.route("i1", "job", "node-b", "node-a", other_job, now=5.0)
    assert route.alerts_from("i1", "node-a") == "node-a"
    # once it fired here it stays here, whoever claims later
    assert route.route("i1", "job", "node-b", "node-a", {"node-b": frozenset({"job"})}, now=6.0)


def test_a_lapsed_claim_restarts_the_wait():
    route = AlertRoute(grace_s=5.0)
    claims = {"node-b": frozenset({"job"})}
    assert not route.route("i1", "job", "node-b", "node-a", claims, now=0.0)
    assert not route.route("i1", "job", "node-b", "node-a", {}, now=10.0)
    assert route.alerts_from("i1", "node-a") == ""
    assert route.route("i1", "job", "node-b", "node-a", {}, now=15.0)


def test_peer_answers_carry_their_claims():
    doc = {"node": "node-b", "jobs": {}, "alerting": ["run-1"], "webhooks": False,
           "owners": {"run-1": 1000}}
    assert parse(doc) == ("node-b", {}, frozenset({("run-1", 1000)}), False)
    older = parse({"node": "node-b", "jobs": {}})  # a daemon older than routing
    assert older[2] == frozenset() and older[3] is True
    # an answer of an older daemon that says no owner: uid unknown (-1)
    assert parse({"node": "node-b", "jobs": {}, "alerting": ["run-1"]})[2] == frozenset(
        {("run-1", -1)})
    # `owned`: a claim names the job's owner; junk is named where it is
    owned = {"node": "node-b", "owned": [{"key": "run-1", "uid": 1000, "ranks": [],
                                          "alerting": True}]}
    assert parse(owned) == ("node-b", {("run-1", 1000): ()}, frozenset({("run-1", 1000)}), True)
    for junk in ({"key": "run-1", "uid": "1000", "ranks": []}, ["run-1"],
                 {"key": "run-1", "uid": 1000, "ranks": [], "alerting": "yes"}):
        with pytest.raises(PeerDocumentError, match=r"owned\[0\] is not a job"):
            parse({"node": "node-b", "owned": [junk]})
    with pytest.raises(PeerDocumentError, match=r"owned\[0\].ranks is not a list"):
        parse({"node": "node-b", "owned": [{"key": "run-1", "uid": 1, "ranks": {}}]})
    for owners in ([1000], {"run-1": "1000"}, {"run-1": True}):
        with pytest.raises(PeerDocumentError, match="'owners' is not a mapping"):
            parse({"node": "node-b", "jobs": {}, "owners": owners})
    with pytest.raises(PeerDocumentError, match="'webhooks' is not true or false"):
        parse({"node": "node-b", "jobs": {}, "webhooks": "no"})
    with pytest.raises(PeerDocumentError, match="'alerting' is not a list of job keys"):
        parse({"node": "node-b", "jobs": {}, "alerting": "run-1"})
