"""A steady job's ticks keep its last look (watch/job.py WatchedJob.steady,
observe/window/between.py calm; docs/architecture.md "Steady jobs"): only while
every rank's record moves on, the readings saw every rank and none stopped, the
job is the one looked at, healthy, and its look younger than steady_s."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from ddpwatch.observe.jobs.job import Job
from ddpwatch.observe.window.between import BetweenTicks
from ddpwatch.watch.job import Looked, WatchedJob

JOB = Job(target_pid=10, launcher_pid=10, launcher_kind="torchrun", rank_pids=(11, 12),
          run_id="r", ranks=(0, 1), world_size=2)
BEFORE = {11: (40, 3), 12: (40, 3)}
MOVED = {11: (42, 3), 12: (41, 3)}


def judged(verdict: str = "healthy", starting: bool = False):
    rank = SimpleNamespace(signals={"slow_while_starting": starting})
    return SimpleNamespace(job=SimpleNamespace(verdict=verdict), ranks=(rank,))


def watched(verdict: str = "healthy", looked_verdict: str = "healthy", at: float = 100.0,
            job: Job = JOB, starting: bool = False, pause=None, slow=None,
            published: bool = True) -> WatchedJob:
    w = WatchedJob("u0.p10.s1", 90.0)
    w.looked = Looked(judged(looked_verdict, starting), object(), at, job)
    # the last tick's view, judged over time (watch/job.py OverTime)
    w.view = SimpleNamespace(over_time=SimpleNamespace(pause=pause, slow=slow)) \
        if published else None
    w.verdict = verdict
    w.progress = dict(BEFORE)
    return w


def test_a_healthy_job_whose_every_rank_moved_on_keeps_its_look():
    assert watched().steady(JOB, MOVED, calm=True, now=102.0, steady_s=3.0)


@pytest.mark.parametrize("why, change", [
    ("a rank's record did not move (a hang stops it)",
     dict(progress={11: (42, 3), 12: (40, 3)})),
    ("a record gone back is another writer's, not progress",
     dict(progress={11: (42, 3), 12: (2, 4)})),
    ("a rank has no live record (its writer died, or it never wrote one)",
     dict(progress={11: (42, 3)})),
    ("the readings saw a rank stopped, or none were taken", dict(calm=False)),
    ("the look is steady_s old: a look at least that often", dict(now=103.0)),
    ("steady_s 0: every tick looks", dict(steady_s=0.0)),
    ("judged over time as something else (a pause)", dict(w=dict(verdict="paused"))),
    ("the look's own verdict was not healthy", dict(w=dict(looked_verdict="slowing"))),
    ("a young job's rank starved as a straggler would be: its stacks are wanted",
     dict(w=dict(starting=True))),
    ("a pause in progress (in its end grace the job is healthy again)",
     dict(w=dict(pause=object()))),
    ("a spell of slowness open: a straggler slow in half its windows must count each",
     dict(w=dict(slow=object()))),
    ("nothing published of the job yet", dict(w=dict(published=False))),
    ("the job changed: a departed rank",
     dict(job=dataclasses.replace(JOB, departed_pids=(13,), departed_ranks=(2,)))),
    ("the job changed: another rank", dict(job=dataclasses.replace(JOB, rank_pids=(11, 14)))),
    ("a job with no ranks (a launcher alone)",
     dict(job=dataclasses.replace(JOB, rank_pids=(), ranks=()),
          w=dict(job=dataclasses.replace(JOB, rank_pids=(), ranks=())))),
])
def test_anything_a_look_may_see_differently_makes_the_tick_look(why, change):
    w = watched(**change.get("w", {}))
    assert not w.steady(change.get("job", JOB), change.get("progress", MOVED),
                        calm=change.get("calm", True), now=change.get("now", 102.0),
                        steady_s=change.get("steady_s", 3.0)), why


def test_no_look_yet_or_no_progress_known_before_makes_the_tick_look():
    fresh = WatchedJob("k", 0.0)
    assert not fresh.steady(JOB, MOVED, calm=True, now=1.0, steady_s=3.0)
    w = watched()
    w.progress = {}  # the first tick that read the records
    assert not w.steady(JOB, MOVED, calm=True, now=102.0, steady_s=3.0)


def write_stat(proc, pid: int, state: str) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "stat").write_text(f"{pid} (py) {state} 1")


def test_calm_needs_a_reading_of_every_rank_and_none_stopped(tmp_path):
    proc = tmp_path / "proc"
    for pid in (11, 12):
        write_stat(proc, pid, "S")
    clock = SimpleNamespace(now=100.0)
    between = BetweenTicks(lambda: clock.now, str(proc), str(tmp_path / "cg"))
    job, pids = between.open(), (11, 12)
    assert not job.calm(pids)  # not watched yet
    job.take(pids)
    assert not job.calm(pids)  # nothing read since: no evidence
    between.read_due()
    assert job.calm(pids)
    assert not job.calm((11, 12, 13))  # another job than the one read
    write_stat(proc, 12, "T")
    clock.now += 1.0
    between.read_due()
    assert not job.calm(pids)  # stopped once since the look
    write_stat(proc, 12, "R")
    clock.now += 1.0
    between.read_due()
    assert not job.calm(pids)  # ... is remembered until the next look takes it
    job.take(pids)
    clock.now += 1.0
    between.read_due()
    assert job.calm(pids)


def test_new_rules_make_every_job_looked_at_again(tmp_path):
    """A look kept across a SIGHUP would show the old rules' verdicts for up to
    steady_s: a reload forgets every job's last look (Daemon.reload)."""
    from ddpwatch.config import Config
    from ddpwatch.daemon import Daemon
    from ddpwatch.judge import rules as rules_mod
    config = Config(state_dir=str(tmp_path))
    daemon = Daemon(config, rules_mod.load_default(None))
    try:
        w = daemon.watched.of("u0.p10.s1")
        w.looked, w.verdict, w.progress = Looked(judged(), object(), 100.0, JOB), "healthy", BEFORE
        w.view = SimpleNamespace(over_time=SimpleNamespace(pause=None, slow=None))
        assert w.steady(JOB, MOVED, calm=True, now=101.0, steady_s=3.0)
        daemon.reload(config, rules_mod.load_default(None))
        assert w.looked is None and not w.steady(JOB, MOVED, calm=True, now=101.0, steady_s=3.0)
    finally:
        daemon.close()
