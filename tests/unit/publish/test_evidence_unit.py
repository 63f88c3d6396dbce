"""publish/evidence.py Evidence: an incident's bundle held back past its owner's
budget, retried after a failed write while the job is here, pruned no more often
than PRUNE_EVERY_S. The bundle writer itself is replaced (publish/bundle.py has
its own tests); the incidents are a minimal book."""
from __future__ import annotations

import collections
import dataclasses

from ddpwatch.config import Config
from ddpwatch.publish import evidence


@dataclasses.dataclass(frozen=True)
class Incident:
    id: str
    owner: str
    bundle: str = ""
    bundle_error: str = ""


class Book:
    def __init__(self, *incidents):
        self._open = {i.id: i for i in incidents}

    def attach_bundle(self, incident_id, path, error=""):
        self._open[incident_id] = dataclasses.replace(self._open[incident_id], bundle=path,
                                                      bundle_error=error)

    def open(self):
        return tuple(self._open.values())

    def get(self, incident_id):
        return self._open[incident_id]


class Clock:
    now = 100.0

    def __call__(self):
        return self.now


def make(book, monkeypatch, tmp_path, fail=(), **config):
    """Evidence over `book`; bundle writes fail while their incident id is in `fail`."""
    written = []

    def write(state_dir, incident, view, history, dirs):
        if incident.id in fail:
            raise OSError(28, "No space left on device")
        written.append(incident.id)
        return f"{state_dir}/{incident.id}"
    monkeypatch.setattr(evidence, "write_bundle", write)
    clock = Clock()
    cfg = Config(state_dir=str(tmp_path), **config)
    return evidence.Evidence(book, cfg, clock, collections.Counter()), written, clock


def test_past_its_owners_budget_a_bundle_is_held_back_and_counted_once(monkeypatch, tmp_path):
    book = Book(Incident("a", "u1000.p10.s1"), Incident("b", "u1000.p20.s2"),
                Incident("c", "u1001.p30.s3"))
    ev, written, clock = make(book, monkeypatch, tmp_path, uid_bundles=1, uid_refill_s=60.0)
    assert ev.write(book.get("a"), "view", (), ())
    assert not ev.write(book.get("b"), "view", (), ())          # uid 1000's second
    assert not ev.write(book.get("b"), "view", (), ())          # tried again: counted once
    assert ev.write(book.get("c"), "view", (), ())              # another user's own budget
    assert written == ["a", "c"] and ev.limited == 1
    assert book.get("b").bundle == "" and book.get("b").bundle_error == evidence.HELD_BUNDLE
    clock.now += 60.0  # the bucket refilled: the retry writes it while the job is here
    ev.retry(lambda owner: ("view", ()), ())
    assert written == ["a", "c", "b"] and book.get("b").bundle.endswith("/b")


def test_a_failed_write_is_said_and_retried_only_while_the_job_is_here(monkeypatch, tmp_path):
    book = Book(Incident("a", "u1000.p10.s1"))
    fail = {"a"}
    ev, written, _ = make(book, monkeypatch, tmp_path, fail=fail)
    assert not ev.write(book.get("a"), "view", (), ())
    assert "No space left" in book.get("a").bundle_error and ev.failures["bundle"] == 1
    fail.clear()
    ev.retry(lambda owner: None, ())  # the job is gone: nothing to write about
    assert written == []
    ev.retry(lambda owner: ("view", ()), ())
    assert written == ["a"] and book.get("a").bundle and not book.get("a").bundle_error


def test_pruning_runs_at_most_every_prune_every_s(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(evidence, "prune_bundles",
                        lambda *a: calls.append(a) or {"age": 1, "size": 0})
    ev, _, clock = make(Book(), monkeypatch, tmp_path)
    ev.prune()
    ev.prune()
    clock.now += evidence.PRUNE_EVERY_S
    ev.prune()
    assert len(calls) == 2 and ev.pruned == {"age": 2, "size": 0}
