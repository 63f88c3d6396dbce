"""Forgetting a job is one call (watch/job.py `WatchedJobs.forget`): after it, no
structure of the daemon holds the job's owner key, but the owners of what
outlives a job (publish/incidents.py IncidentBook: its incident;
observe/jobs/departures.py Departures: a post-mortem), which say so."""
from __future__ import annotations

import pytest

from ddpwatch.config import Config
from ddpwatch.daemon import Daemon
from ddpwatch.judge import rules as rules_mod
from ddpwatch.observe.jobs.job import Job

KEY = "u1000.p10.s5"
JOB = Job(11, 10, "torchrun", (11, 12), "run-a", (0, 1), 2)


def holders(root, key: str, path: str = "daemon", seen=None, depth: int = 6) -> list[str]:
    """Where under `root` the string `key` is held: as a dict's key or value, a
    member of a list, set or tuple, or an attribute of a ddpwatch object."""
    seen = set() if seen is None else seen
    if id(root) in seen or depth < 0:
        return []
    seen.add(id(root))
    found = []
    if isinstance(root, dict):
        for k, v in list(root.items()):
            if k == key or v == key:
                found.append(f"{path}[{k!r}]")
            found += holders(v, key, f"{path}[{k!r}]", seen, depth - 1)
    elif isinstance(root, (list, set, frozenset, tuple)):
        for i, v in enumerate(list(root)):
            if v == key:
                found.append(f"{path}[{i}]")
            found += holders(v, key, f"{path}[{i}]", seen, depth - 1)
    elif type(root).__module__.startswith("ddpwatch") or hasattr(root, "__dataclass_fields__"):
        attrs = getattr(root, "__dict__", None) or {
            n: getattr(root, n) for n in getattr(root, "__slots__", ()) if hasattr(root, n)}
        for name, v in attrs.items():
            if v == key:
                found.append(f"{path}.{name}")
            found += holders(v, key, f"{path}.{name}", seen, depth - 1)
    return found


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(Config(state_dir=str(tmp_path)), rules_mod.load_default(None))
    yield d
    d.close()


def watch(daemon: Daemon, verdict: str, ticks: int) -> None:
    """The job watched as a tick watches it: named, labelled, read between
    ticks, its departures followed, judged toward an incident."""
    w = daemon.watched.of(KEY)
    w.name("run-a", "run-a")
    daemon.label_budget.label(KEY, "run-a", 0.0, w.grant)
    w.readings.take(JOB.rank_pids)
    w.readings.watch(closely=True)
    daemon.between.read_due()
    for now in range(ticks):
        daemon.departures.update([(KEY, "run-a", JOB)], None, float(now), daemon.watched.ends)
        w.shown = True  # a record was seen (publish/limits.py shows_a_job)
        daemon.incidents.update({KEY: (verdict, (1,), "")}, float(now), {KEY: "run-a"},
                                daemon.watched.standings([KEY]))


def test_forgetting_a_job_is_one_call_and_leaves_nothing_of_it(daemon):
    watch(daemon, "blocked_in_collective", ticks=1)  # troubled, no incident yet
    readings = daemon.watched[KEY].readings
    assert readings in daemon.between.jobs and holders(daemon, KEY)
    daemon.watched.forget({KEY})
    assert holders(daemon, KEY) == []
    assert KEY not in daemon.watched and readings not in daemon.between.jobs
    assert readings.duty is None and daemon.departures.post_mortems == {}
    assert not daemon.incidents.holds(KEY)


def test_an_open_incident_outlives_its_job_in_the_incident_book_alone(daemon):
    watch(daemon, "stopped", ticks=3)
    assert daemon.incidents.holds(KEY)
    daemon.watched.forget({KEY})
    assert holders(daemon, KEY) and all(
        where.startswith(("daemon.incidents.", "daemon.evidence.incidents.",
                          "daemon.keeper.incidents.", "daemon.judging.gate"))
        and "._open[" in where for where in holders(daemon, KEY)), holders(daemon, KEY)
    assert daemon.incidents.holds(KEY)


def test_a_ranks_number_once_known_stays_with_its_pid():
    """A rank judged once more as it exits, its number unknown, keeps the number
    an earlier tick knew (watch/job.py rank_numbers): its death names it; a pid
    no longer judged is dropped."""
    from types import SimpleNamespace as R

    from ddpwatch.watch.job import rank_numbers
    before = rank_numbers({}, [R(pid=11, rank=0, remote=False), R(pid=12, rank=1, remote=False),
                               R(pid=99, rank=5, remote=True)])
    assert before == {11: 0, 12: 1}
    assert rank_numbers(before, [R(pid=11, rank=0, remote=False),
                                 R(pid=12, rank=-1, remote=False)]) == {11: 0, 12: 1}
    assert rank_numbers(before, [R(pid=13, rank=-1, remote=False)]) == {13: -1}
