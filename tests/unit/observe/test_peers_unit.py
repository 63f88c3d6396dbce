"""The peer view without processes. Judging: a 2-rank job split across two
"nodes" (replayed snapshots cut in two); alone, neither node can name the
culprit, with the other node's signals (as /peer serves them, through JSON)
both do. Polling: fresh answers are used, old ones dropped, bad ones named."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import REPO
from peer_views import node_view, over_the_wire

from ddpwatch.judge import classify, rules as rules_mod
from ddpwatch.observe.peers import PeerPoller
from ddpwatch.observe.jobs.discovery import job_key
from ddpwatch.observe.snapshot import load, save

SNAPSHOTS = os.path.join(REPO, "tests", "fixtures", "snapshots")


@pytest.fixture(scope="module")
def rules():
    return rules_mod.load(os.path.join(REPO, "rules", "default.yaml"))


@pytest.mark.parametrize("fixture, culprit_verdict", [
    ("trainer_hang", "hung_outside_collective"),
    ("trainer_stop", "stopped"),
])
def test_each_node_names_the_culprit_on_the_other_node(rules, fixture, culprit_verdict):
    history = load(os.path.join(SNAPSHOTS, f"{fixture}.json"))
    a, b = node_view(history, 0, "node-a"), node_view(history, 1, "node-b")
    alone_a, alone_b = classify.judge(a, rules), classify.judge(b, rules)
    assert alone_a.job.culprits == ()          # rank 0 waits, for someone it cannot see
    assert [r.rank for r in alone_a.ranks] == [0]
    assert "another node" in alone_a.job.summary
    with_b = classify.judge(a, rules, remote=over_the_wire(alone_b))
    with_a = classify.judge(b, rules, remote=over_the_wire(alone_a))
    for j in (with_b, with_a):
        assert j.job.culprits == (1,) and j.job.verdict == culprit_verdict
        by_rank = {r.rank: r for r in j.ranks}
        assert by_rank[1].role == "culprit" and by_rank[0].role == "victim"
        assert (by_rank[0].host, by_rank[1].host) == ("node-a", "node-b")
    assert [r.remote for r in with_b.ranks] == [False, True]
    assert [r.remote for r in with_a.ranks] == [True, False]
    assert "rank 1 (on node-b) is the culprit" in with_b.job.summary
    # what a node serves its peers is its own ranks only, as measured there
    assert [s["rank"] for s in with_b.local] == [0] and "peers_blocked" not in with_b.local[0]


def test_a_rank_held_here_is_not_taken_from_a_peer(rules):
    """A peer that also reports a rank this node holds (a misconfigured peer list,
    two daemons on one host) does not double it: the local observation wins."""
    history = load(os.path.join(SNAPSHOTS, "trainer_hang.json"))
    whole = classify.judge(history, rules)
    again = classify.judge(history, rules, remote=over_the_wire(whole))
    assert [(r.rank, r.verdict, r.remote) for r in again.ranks] == [
        (r.rank, r.verdict, False) for r in whole.ranks]


class _Peer:
    """A local HTTP server answering /peer with `doc` (or `code`)."""

    def __init__(self, doc, code=200):
        self.doc, self.code = doc, code
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps(peer.doc).encode() if peer.code == 200 else b"{}"
                self.send_response(peer.code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_poller_keeps_fresh_answers_and_drops_old_ones():
    now = [100.0]
    peer = _Peer({"node": "node-b", "tick": 3, "jobs": {"run-1": [
        {"pid": 7, "rank": 1, "alive": True},
        {"pid": 8, "rank": -1, "alive": True}]}})   # unidentified there: left out here
    try:
        poller = PeerPoller([peer.url], max_age_s=5.0, clock=lambda: now[0])
        assert poller.remote_signals("run-1") == ()          # nothing fetched yet
        poller.poll_once()
        assert poller.remote_signals("run-1") == ({"pid": 7, "rank": 1, "alive": True,
                                                   "node": "node-b"},)
        assert poller.remote_signals("other-job") == ()
        peer.close()
        now[0] += 2.0
        poller.poll_once()                                    # the peer stopped answering
        (state,) = poller.states()
        assert state.error.startswith("no answer") and state.node == "node-b"
        assert len(poller.remote_signals("run-1")) == 1       # still fresh enough
        now[0] += 4.0
        assert poller.remote_signals("run-1") == ()           # 6 s old: not judged from it
    finally:
        peer.close()


def test_a_peers_job_of_another_owner_is_neither_joined_nor_heard_claiming():
    """A label is any user's to pick: a look-alike job of another uid on a peer,
    under a real job's label, adds no ranks to it and its claim silences nothing
    (README, "Trust model")."""
    peer = _Peer({"node": "node-b", "tick": 3, "alerting": ["run-1", "run-2"],
                  "owners": {"run-1": 65534, "run-2": 1000},
                  "jobs": {"run-1": [{"pid": 7, "rank": 0, "alive": True}],
                           "run-2": [{"pid": 9, "rank": 0, "alive": True}]}})
    try:
        poller = PeerPoller([peer.url], max_age_s=5.0, clock=lambda: 100.0)
        poller.poll_once()
        assert poller.remote_signals("run-1", 1000) == ()         # another user's
        assert len(poller.remote_signals("run-1", 65534)) == 1    # its owner's
        assert len(poller.remote_signals("run-2", 1000)) == 1
        assert len(poller.remote_signals("run-1")) == 1           # diagnose: unfiltered
        assert poller.claims(1000) == {"node-b": frozenset({"run-2"})}
        assert poller.claims(65534) == {"node-b": frozenset({"run-1"})}
    finally:
        peer.close()


def test_two_owners_of_one_label_on_a_peer_stay_two_jobs():
    """Another user's look-alike under a real job's run id on the peer that holds
    the real job, started before it: the real job's ranks still join this node's
    under the run id, the look-alike's do not, and whichever of them the peer
    lists last, neither shadows the other (a label-keyed answer keeps one). An
    older peer sees neither under that run id."""
    from ddpwatch.publish.peers import document
    from ddpwatch.publish.view import DaemonView

    class View:  # the fields of publish/view.JobView that document reads
        def __init__(self, key, owner, pid, run_id=""):
            self.key, self.owner, self.run_id = key, owner, run_id
            self.judgement = type("J", (), {"local": ({"pid": pid, "rank": 1, "alive": True},)})

    # the look-alike started first: it holds the bare label on this node, the real
    # job's label has its owner added (observe/jobs/discovery.py labels)
    for order in ((0, 1), (1, 0)):
        jobs = [View("10.0.0.1:29500@u0.p7.s3", "u0.p7.s3", 7, "10.0.0.1:29500"),
                View("10.0.0.1:29500", "u65534.p9.s2", 9, "10.0.0.1:29500")]
        view = DaemonView(node="node-b", tick=3, wall_time=0.0, tick_duration_s=0.0,
                          jobs=tuple(jobs[i] for i in order), incidents=(), probes=(),
                          incidents_opened_total={}, ready=True,
                          alerting_jobs=(("10.0.0.1:29500", 65534),))
        doc = json.loads(json.dumps(document(view)))
        assert doc["jobs"] == {} and doc["owners"] == {} and doc["alerting"] == []
        peer = _Peer(doc)
        try:
            poller = PeerPoller([peer.url], max_age_s=5.0, clock=lambda: 100.0)
            poller.poll_once()
            assert [s["pid"] for s in poller.remote_signals("10.0.0.1:29500", 0)] == [7]
            assert [s["pid"] for s in poller.remote_signals("10.0.0.1:29500", 65534)] == [9]
            assert poller.claims(0) == {"node-b": frozenset()}     # the look-alike's claim
            assert poller.claims(65534) == {"node-b": frozenset({"10.0.0.1:29500"})}
        finally:
            peer.close()


@pytest.mark.parametrize("doc, code, error", [
    ({"jobs": {}}, 200, "bad answer: not a ddpwatch /peer document"),
    ({"node": "b", "jobs": {"j": [{"pid": 1, "rank": "1"}]}}, 200, "bad answer: jobs['j'][0] is not"),
    ({"node": "b", "jobs": {"j": [{"pid": 1, "rank": True}]}}, 200, "bad answer: jobs['j'][0] is not"),
    ({"node": "b", "jobs": {"j": [{"rank": 1}]}}, 200, "bad answer: jobs['j'][0] is not"),
    ({"node": "b", "jobs": {"j": [{"pid": 1, "rank": 1, "x": [1]}]}}, 200,
     "bad answer: jobs['j'][0] is not"),
    ({}, 302, "HTTP 302 (redirects are not followed)"),
    ({}, 401, "HTTP 401 (wrong or missing peer_token)"),
])
def test_poller_says_what_is_wrong_with_a_peer(doc, code, error):
    peer = _Peer(doc, code)
    try:
        poller = PeerPoller([peer.url])
        poller.poll_once()
        (state,) = poller.states()
        assert state.error.startswith(error) and state.fetched_at == 0.0
    finally:
        peer.close()


def test_a_peer_url_that_is_not_http_is_an_error_not_a_dead_poller():
    """A wrong port (here an SSH-like greeting): the poll says so, and polls again."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def greet():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
            conn.close()
    threading.Thread(target=greet, daemon=True).start()
    try:
        poller = PeerPoller([f"http://127.0.0.1:{server.getsockname()[1]}"])
        for _ in range(2):
            poller.poll_once()
            (state,) = poller.states()
            assert state.error.startswith("bad answer") or state.error.startswith("no answer")
    finally:
        server.close()


def test_a_peer_answer_that_breaks_judging_is_dropped_not_the_job(rules):
    """Signals of another ddpwatch version (a type changed) must not hide this
    node's own ranks: the job is judged without them, and the failure counted."""
    from ddpwatch.config import Config
    from ddpwatch.daemon import Daemon
    history = load(os.path.join(SNAPSHOTS, "trainer_hang.json"))
    a, b = node_view(history, 0, "node-a"), node_view(history, 1, "node-b")
    remote = [dict(s, hb_step_s="slow") for s in over_the_wire(classify.judge(b, rules))]
    daemon = Daemon(Config(), rules)
    judgement, used = daemon.judging.judge("job", a, rules, tuple(remote))
    assert used == () and [r.rank for r in judgement.ranks] == [0]
    assert daemon.stage_failures["peer_signals"] == 1


def test_two_peers_reporting_one_rank_give_it_once(rules):
    history = load(os.path.join(SNAPSHOTS, "trainer_hang.json"))
    a, b = node_view(history, 0, "node-a"), node_view(history, 1, "node-b")
    from_b = over_the_wire(classify.judge(b, rules))
    j = classify.judge(a, rules, remote=from_b + from_b)
    assert [(r.rank, r.remote) for r in j.ranks] == [(0, False), (1, True)]


def test_diagnose_asks_peers_once(rules, tmp_path):
    """`ddpwatch diagnose --peer URL`: a saved view of node A (rank 0 only) judged
    with node B's daemon's /peer answer names rank 1 on node-b."""
    history = load(os.path.join(SNAPSHOTS, "trainer_hang.json"))
    a, b = node_view(history, 0, "node-a"), node_view(history, 1, "node-b")
    save(list(a), str(tmp_path / "a.json"))
    key = job_key(a[-1].job)
    peer = _Peer({"node": "node-b", "jobs": {key: list(over_the_wire(classify.judge(b, rules)))}})
    try:
        out = subprocess.run([sys.executable, "-m", "ddpwatch", "diagnose", "--json", "--replay",
                              str(tmp_path / "a.json"), "--peer", peer.url,
                              "--peer", "http://127.0.0.1:9"],  # nobody answers there
                             capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, PYTHONPATH=REPO))
    finally:
        peer.close()
    assert out.returncode == 1, out.stderr        # a problem was found
    doc = json.loads(out.stdout)
    assert doc["job"]["culprits"] == [1]
    assert [(r["rank"], r["host"]) for r in doc["ranks"]] == [(0, "node-a"), (1, "node-b")]
    assert "peer http://127.0.0.1:9: no answer" in out.stderr and "judged without it" in out.stderr
    bad = subprocess.run([sys.executable, "-m", "ddpwatch", "diagnose", "--replay",
                          str(tmp_path / "a.json"), "--peer", "node2:19500"],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert bad.returncode == 2 and "is not a daemon's base URL" in bad.stderr
    assert "Traceback" not in bad.stderr
