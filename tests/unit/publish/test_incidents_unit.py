"""The incident state machine (ddpwatch/publish/incidents.py) over per-tick job verdicts,
with the clock given: confirmation on a second tick, the rendezvous grace,
changes, resolution."""
from __future__ import annotations

from ddpwatch.judge.vocabulary import OPEN_AFTER_S
from ddpwatch.publish.incidents import IncidentBook

RENDEZVOUS_GRACE_S = OPEN_AFTER_S["rendezvous_wait"]

HUNG = ("hung_outside_collective", (1,), "rank 1 is the culprit")
RENDEZVOUS = ("rendezvous_wait", (), "waiting for peers")
HEALTHY = ("healthy", (), "")


def kinds(events):
    return [(e.kind, e.incident.verdict, e.incident.culprits) for e in events]


def test_a_problem_opens_on_its_second_tick_and_resolves_after_calm():
    book = IncidentBook(resolve_after_s=10.0)
    assert book.update({"job": HUNG}, now=0.0) == []
    (opened,) = book.update({"job": HUNG}, now=1.0)
    assert opened.kind == "opened" and opened.incident.culprits == (1,)
    assert book.update({"job": HUNG}, now=2.0) == []       # ongoing, unchanged: no event
    assert book.update({"job": HEALTHY}, now=3.0) == []
    assert book.update({"job": HEALTHY}, now=12.9) == []
    (resolved,) = book.update({"job": HEALTHY}, now=13.0)
    assert resolved.kind == "resolved" and resolved.incident.resolved_at == 13.0
    assert book.open() == () and book.opened_total == {"hung_outside_collective": 1}


def test_waiting_at_rendezvous_opens_only_after_the_grace():
    """A job waits at rendezvous while its last node is being started: no page for that."""
    book = IncidentBook(resolve_after_s=10.0)
    for t in range(int(RENDEZVOUS_GRACE_S)):
        assert book.update({"job": RENDEZVOUS}, now=float(t)) == [], t
    assert kinds(book.update({"job": RENDEZVOUS}, now=RENDEZVOUS_GRACE_S)) == [
        ("opened", "rendezvous_wait", ())]


def test_a_slow_collective_opens_once_it_has_lasted():
    """Collectives slowed for seconds (a burst of traffic) page nobody. (A
    straggler waits in the job's watch instead, watch/slow.py, so that /status
    says `slowing` meanwhile: tests/unit/watch/test_overtime_unit.py.)"""
    book = IncidentBook(resolve_after_s=10.0)
    slow = ("slow_collective", (), "collectives dominate")
    for t in range(5):
        assert book.update({"job": slow}, now=float(t)) == []
    book.update({"job": HEALTHY}, now=5.0)
    for t in range(6, 6 + int(OPEN_AFTER_S["slow_collective"])):
        assert book.update({"job": slow}, now=float(t)) == []
    assert kinds(book.update({"job": slow}, now=6.0 + OPEN_AFTER_S["slow_collective"])) == [
        ("opened", "slow_collective", ())]


def test_open_after_is_configurable_per_verdict():
    """A cluster whose nodes start minutes apart waits longer at rendezvous; one
    that wants to hear of a straggler at once says 0."""
    book = IncidentBook(resolve_after_s=10.0, open_after_s={"straggler": 0, "stopped": 20})
    straggler = ("straggler", (0,), "rank 0 arrives last")
    assert book.update({"a": straggler}, now=0.0) == []  # the second tick confirms
    assert kinds(book.update({"a": straggler}, now=1.0)) == [("opened", "straggler", (0,))]
    book = IncidentBook(resolve_after_s=10.0, open_after_s={"straggler": 0, "stopped": 20})
    stopped = ("stopped", (1,), "rank 1 is stopped")
    for t in range(20):
        assert book.update({"b": stopped}, now=float(t)) == []
    assert kinds(book.update({"b": stopped}, now=20.0)) == [("opened", "stopped", (1,))]
    assert book.open_after_s["rendezvous_wait"] == OPEN_AFTER_S["rendezvous_wait"]  # kept


def test_a_culprit_found_during_rendezvous_opens_at_once():
    book = IncidentBook(resolve_after_s=10.0)
    assert book.update({"job": RENDEZVOUS}, now=0.0) == []
    unreachable = ("unreachable_peer", (1,), "rank 1 cannot connect")
    assert kinds(book.update({"job": unreachable}, now=1.0)) == [
        ("opened", "unreachable_peer", (1,))]


def test_a_job_that_starts_over_starts_its_grace_over():
    book = IncidentBook(resolve_after_s=10.0)
    book.update({"job": RENDEZVOUS}, now=0.0)
    book.update({"job": HEALTHY}, now=30.0)
    assert book.update({"job": RENDEZVOUS}, now=40.0) == []
    assert book.update({"job": RENDEZVOUS}, now=41.0 + RENDEZVOUS_GRACE_S / 2) == []


def test_a_changed_culprit_is_an_event_and_a_vanished_job_resolves():
    book = IncidentBook(resolve_after_s=0.0)
    book.update({"job": ("blocked_in_collective", (), "no local culprit")}, now=0.0)
    book.update({"job": ("blocked_in_collective", (), "no local culprit")}, now=1.0)
    assert kinds(book.update({"job": HUNG}, now=2.0)) == [
        ("changed", "hung_outside_collective", (1,))]
    assert kinds(book.update({}, now=3.0)) == [("resolved", "hung_outside_collective", (1,))]


def test_a_slowing_tick_opens_nothing_but_confirms_the_death_after_it():
    """`slowing` (a straggler in wait, watch/slow.py) pages nobody, however long;
    a rank killed while its job was slowing is paged on the death's first tick
    (the job may be gone the tick after: tests/thirdparty/test_thirdparty_killed.py)."""
    book = IncidentBook(resolve_after_s=10.0)
    slowing = ("slowing", (), "rank 1 falls behind")
    for t in range(100):
        assert book.update({"job": slowing}, now=float(t)) == []
    assert kinds(book.update({"job": ("dead", (1,), "rank 1 died")}, now=100.0)) == [
        ("opened", "dead", (1,))]
    # after a healthy tick the death needs its second tick, as always
    book = IncidentBook(resolve_after_s=10.0)
    book.update({"job": HEALTHY}, now=0.0)
    assert book.update({"job": ("dead", (1,), "rank 1 died")}, now=1.0) == []
    # a verdict naming no culprit is not confirmed by slowing: every rank waiting
    # in a collective for one tick on a busy node pages nobody (it did, in
    # tests/daemon/test_soak.py's DataLoader job); on its second tick it pages
    book = IncidentBook(resolve_after_s=10.0)
    book.update({"job": slowing}, now=0.0)
    blocked = ("blocked_in_collective", (), "ranks 0, 1 wait in a collective")
    assert book.update({"job": blocked}, now=1.0) == []
    assert book.update({"job": HEALTHY}, now=2.0) == []
    book.update({"job": slowing}, now=3.0)
    assert book.update({"job": blocked}, now=4.0) == []
    assert kinds(book.update({"job": blocked}, now=5.0)) == [
        ("opened", "blocked_in_collective", ())]


def test_a_job_keeps_the_label_its_run_id_gave_it_to_its_end(tmp_path):
    """torchrun's agent alone, the tick before it exits, has no rank whose run id
    can be read: its job must not page as "pid123" after /status showed it as its
    run id (tests/thirdparty/test_thirdparty_killed.py). A pid label gives way to the run id."""
    from ddpwatch.config import Config
    from ddpwatch.daemon import Daemon
    from ddpwatch.judge import rules as rules_mod
    daemon = Daemon(Config(state_dir=str(tmp_path)), rules_mod.load_default(None))
    try:
        name = lambda key, label: daemon.watched.of(key).name(label)  # noqa: E731
        assert name("u0.p5.s1", "pid5") == "pid5"  # its ranks not read yet
        assert name("u0.p5.s1", "127.0.0.1:29500") == "127.0.0.1:29500"
        assert name("u0.p5.s1", "pid5") == "127.0.0.1:29500"  # ranks gone
        assert name("u0.p9.s2", "run-b") == "run-b"
        daemon.watched.forget({"u0.p5.s1"})
        assert name("u0.p5.s1", "pid5") == "pid5"  # a new job with that key
    finally:
        daemon.close()
