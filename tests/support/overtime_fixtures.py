"""Replay fixtures of the rules of stage over-time (rules/default.yaml): the saved
history of a real job with the signals over time that a daemon's per-job watch
gives its ranks (watch/overtime.py), saved beside it as an incident bundle's
snapshots.json keeps them (observe/snapshot.py `save`'s `over`).

The signals are worked out here, with a fixed clock and the daemon's default
config, by a WatchedJob fed the job's own window judgement tick after tick, as
the daemon feeds it: nothing in them is written by hand. Each derived fixture is
its base fixture plus the key "over_time", nothing else
(tests/unit/judge/test_replay.py checks both). Write them again with
`PYTHONPATH=. python tests/support/overtime_fixtures.py` (from the repository).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SNAPSHOTS = os.path.join(REPO, "tests", "fixtures", "snapshots")

# derived fixture -> (base fixture, what the watch saw before it: [(fixture whose
# window judgement it was, seconds of 1 s ticks)], the base's own window last)
DERIVED = {
    # trainer --fault=slow:rank=1:factor=10000:step=5: rank 1 computes outside the
    # collectives while rank 0 waits, for longer than the pause floor (300 s)
    "pause_past_bound": ("trainer_busy_hang", [("trainer_busy_hang", 301)]),
    # trainer --fault=slow:rank=1:factor=4, its first 3 s: not yet a straggler
    "slowing_briefly": ("trainer_slow", [("trainer_slow", 2)]),
    # a confirmed spell (trainer_slow's window for 31 s), then one window in which
    # both ranks looked healthy (trainer_healthy's: the same trainer, its ranks
    # given the pids of trainer_healthy's by rank number)
    "straggler_held": ("trainer_healthy", [("trainer_slow", 31)]),
}


def _path(name: str) -> str:
    return os.path.join(SNAPSHOTS, f"{name}.json")


def _window(name: str, rules, pids: dict[int, int]):
    """The fixture's window judgement (as diagnose gives it), its ranks' pids
    those of `pids` by rank number where given."""
    from ddpwatch.judge import classify
    from ddpwatch.observe.snapshot import load, load_remote
    judged = classify.judge(load(_path(name)), rules, load_remote(_path(name)))
    ranks = tuple(dataclasses.replace(r, pid=pids.get(r.rank, r.pid),
                                      signals={**r.signals, "pid": pids.get(r.rank, r.pid)})
                  for r in judged.ranks)
    return dataclasses.replace(judged, ranks=ranks)


def over_time(name: str) -> dict[tuple, dict]:
    """The signals over time the watch gives the ranks of derived fixture `name`
    (RankVerdict.key -> signals) on the tick that judges the base's window."""
    from ddpwatch.config import Config
    from ddpwatch.judge import rules as rules_mod
    from ddpwatch.watch.job import WatchedJob
    base, before = DERIVED[name]
    rules = rules_mod.load_default()
    pids = {r.rank: r.pid for r in _window(base, rules, {}).ranks}
    job, t = WatchedJob("fixture", 0.0), 0.0
    for seen, seconds in before:
        window = _window(seen, rules, pids)
        for _ in range(seconds):
            job.over_time(window, t, 1_800_000_000.0 + t, Config(), rules)
            t += 1.0
    _, over = job.over_time(_window(base, rules, pids), t, 1_800_000_000.0 + t, Config(), rules)
    return over.signals


def rows(over: dict[tuple, dict]) -> list[dict]:
    """As observe/snapshot.py `save` writes them."""
    return [{"remote": remote, "host": host, "pid": pid, "signals": dict(signals)}
            for (remote, host, pid), signals in over.items()]


def write(name: str) -> None:
    with open(_path(DERIVED[name][0])) as f:
        doc = json.load(f)
    doc["over_time"] = rows(over_time(name))
    with open(_path(name), "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    for fixture in sys.argv[1:] or DERIVED:
        write(fixture)
        print(_path(fixture))
