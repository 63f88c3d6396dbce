"""Pure parts of the defences against other users: run ids as labels (never paths), jobs told
apart by owner, incidents kept across restarts, bundles only under the state
directory."""
from __future__ import annotations

import json
import os
import types

import pytest

from ddpwatch.observe.jobs import discovery
from ddpwatch.observe.jobs.discovery import ProcInfo
from ddpwatch.observe.snapshot import Job
from ddpwatch.publish import incident_store
from ddpwatch.publish.bundle import SAFE_NAME, write_bundle
from ddpwatch.publish.incidents import IncidentBook, safe_name

STOPPED = ("stopped", (1,), "rank 1 is stopped")


@pytest.mark.parametrize("label", ["../../../../tmp/x/L/pwn", "..", ".", "", "/etc/passwd",
                                   "a" * 500, "x\x1b[31m\n", "127.0.0.1:29500", "ünï/cødé", "run-1"])
def test_safe_name_is_a_bounded_plain_file_name(label):
    name = safe_name(label)
    assert SAFE_NAME.match(name) and "/" not in name and not name.startswith(".")
    assert len(name) <= 48
    assert (name == label) == (label in ("run-1",))  # changed unless already plain


def test_distinct_labels_never_make_one_name():
    assert safe_name("a/b") != safe_name("a_b") and safe_name("a" * 60) != safe_name("a" * 61)
    assert safe_name("run-1") == "run-1"


def test_incident_ids_from_hostile_run_ids_are_safe_names():
    book = IncidentBook(resolve_after_s=5)
    key, label = "u1000.p42.s99", "../../../../tmp/x/L/pwn"
    for t in (0.0, 1.0):
        events = book.update({key: STOPPED}, t, {key: label})
    (incident,) = (e.incident for e in events)
    assert incident.job == label and incident.owner == key
    assert SAFE_NAME.match(incident.id) and ".." not in incident.id.split("-")[0]


def table(*procs):
    return {p.pid: p for p in procs}


def test_two_users_with_one_run_id_are_two_jobs_and_two_labels():
    env = {"TORCHELASTIC_RUN_ID": "shared", "RANK": "0"}
    victim = ProcInfo(100, 1, ("python", "train.py"), env, uid=1000, start=500)
    other = ProcInfo(200, 1, ("python", "x.py"), env, uid=65534, start=900)
    t = table(victim, other)
    jobs = discovery.all_jobs(t)
    owners = {discovery.owner_key(j, t) for j in jobs}
    assert owners == {"u1000.p100.s500", "u65534.p200.s900"}
    labels = discovery.labels(jobs, t)
    # the older job keeps the bare run id; the other is told apart, deterministically
    assert labels["u1000.p100.s500"] == "shared"
    assert labels["u65534.p200.s900"] == "shared@u65534.p200.s900"


def test_bare_env_ranks_of_another_user_never_join_a_job():
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "2", "RANK": "0"}
    mine = ProcInfo(100, 1, ("python", "a.py"), env, uid=1000, start=1)
    theirs = ProcInfo(101, 1, ("python", "b.py"), dict(env, RANK="1"), uid=65534, start=2)
    job = discovery.find_job(100, table(mine, theirs))
    assert job.rank_pids == (100,)


def test_labels_are_bounded_and_printable():
    job = Job(1, -1, "none", (1,), "x" * 1000 + "\x1b")
    assert len(discovery.job_key(job)) == discovery.MAX_LABEL
    assert discovery.job_key(Job(1, -1, "none", (1,), "a\x1bb")) == "a?b"


# ------------------------------------------------------------------ incident store

def test_incidents_survive_a_restart_under_the_same_id(tmp_path):
    book = IncidentBook(resolve_after_s=5)
    key = "u0.p7.s1"
    book.update({key: STOPPED}, 0.0, {key: "run"})
    (opened,) = [e for e in book.update({key: STOPPED}, 1.0, {key: "run"})]
    incident_store.save(str(tmp_path), book.state(), {opened.incident.id: "run"})
    counter, open_, resolved, sending = incident_store.load(str(tmp_path))
    again = IncidentBook(resolve_after_s=5)
    again.restore(counter, open_, resolved)
    # the problem goes on: no new incident; then it ends: the same id resolves
    assert again.update({key: STOPPED}, 2.0, {key: "run"}) == []
    events = again.update({}, 3.0) + again.update({}, 9.0)
    assert [(e.kind, e.incident.id) for e in events] == [("resolved", opened.incident.id)]
    assert sending == {opened.incident.id: "run"}
    # a later incident never reuses an id
    again.update({key: STOPPED}, 10.0, {key: "run"})
    (new,) = again.update({key: STOPPED}, 11.0, {key: "run"})
    assert new.incident.id != opened.incident.id


@pytest.mark.parametrize("content", [b"", b"{", b"\xff\xfe", b"[]", b'{"ddpwatch_incidents": 9}',
                                     b'{"ddpwatch_incidents": 1, "open": {"k": {"id": 3}}}',
                                     b'{"ddpwatch_incidents": 1, "counter": "x"}'])
def test_a_corrupt_incidents_file_is_ignored_with_a_warning(tmp_path, content, caplog):
    (tmp_path / incident_store.FILE).write_bytes(content)
    assert incident_store.load(str(tmp_path)) == (0, {}, [], {})
    assert incident_store.FILE in caplog.text


def test_a_foreign_or_linked_incidents_file_is_not_read(tmp_path, caplog):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"ddpwatch_incidents": 1, "counter": 5}))
    os.symlink(target, tmp_path / incident_store.FILE)
    assert incident_store.load(str(tmp_path)) == (0, {}, [], {})
    if os.geteuid() == 0:
        os.unlink(tmp_path / incident_store.FILE)
        (tmp_path / incident_store.FILE).write_text(target.read_text())
        os.chown(tmp_path / incident_store.FILE, 65534, 65534)
        assert incident_store.load(str(tmp_path)) == (0, {}, [], {})


def test_save_replaces_the_file_whole_and_never_follows_a_planted_link(tmp_path):
    incident_store.save(str(tmp_path), {"counter": 1, "open": {}, "resolved": []}, {})
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, tmp_path / f"{incident_store.FILE}.tmp-{os.getpid()}")
    incident_store.save(str(tmp_path), {"counter": 2, "open": {}, "resolved": []}, {})
    assert victim.read_text() == "keep"
    assert incident_store.load(str(tmp_path))[0] == 2


def test_bundle_refuses_an_unsafe_id_and_a_linked_incidents_directory(tmp_path):
    view = types.SimpleNamespace()
    with pytest.raises(ValueError):
        write_bundle(str(tmp_path), types.SimpleNamespace(id="../x"), view, [], ())
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "incidents")
    with pytest.raises(NotADirectoryError):
        write_bundle(str(tmp_path), types.SimpleNamespace(id="ok-1-1"), view, [], ())
    assert os.listdir(tmp_path / "elsewhere") == []
