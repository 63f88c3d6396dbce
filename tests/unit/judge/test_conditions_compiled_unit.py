"""A rule's conditions as one function (judge/conditions.py compiled) hold
exactly when the conditions do (Condition.holds, AnyOf.holds): every shipped
rule over every replay fixture's ranks, and the odd values a peer may send."""
from __future__ import annotations

import glob
import os

import pytest
from conftest import REPO

from ddpwatch.judge import rules as rules_mod
from ddpwatch.judge import signals
from ddpwatch.judge.conditions import compiled, parse_when
from ddpwatch.observe.snapshot import load, load_remote

SNAPSHOTS = sorted(glob.glob(os.path.join(REPO, "tests", "fixtures", "snapshots", "*.json")))


def slow(when, s) -> bool:
    return all(c.holds(s) for c in when)


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: os.path.basename(p)[:-5])
def test_every_shipped_rule_holds_as_its_conditions_do(path):
    shipped = rules_mod.load_default()
    held = 0
    for s in signals.measure(load(path), load_remote(path)):
        for r in shipped:
            assert r.matches(s) == slow(r.when, s), r.id
            held += r.matches(s)
    assert held  # some rule decides every fixture


WHEN = ["alive", "not stopped_share", "cpu_ratio < 0.05", "state in ['T', 't']",
        {"any": ["hb_age_s > 60", ["rank == 0", "not orphan"]]}]


@pytest.mark.parametrize("s", [
    {}, {"alive": True, "stopped_share": 0.0, "cpu_ratio": 0.01, "state": "T", "hb_age_s": 61},
    {"alive": True, "stopped_share": 0, "cpu_ratio": 0.01, "state": "t", "rank": 0,
     "orphan": False},
    {"alive": True, "stopped_share": 0, "cpu_ratio": 0.01, "state": "t", "rank": 0},
    {"alive": True, "stopped_share": None, "cpu_ratio": 0.01, "state": "T", "hb_age_s": 61},
    {"alive": True, "stopped_share": 0, "cpu_ratio": "high", "state": "T", "hb_age_s": 61},
    {"alive": 1, "stopped_share": False, "cpu_ratio": 0, "state": ["T"], "hb_age_s": "x"},
    {"alive": "", "stopped_share": 0, "cpu_ratio": 0, "state": "T", "hb_age_s": 99},
])
def test_odd_values_a_peer_may_send(s):
    when = parse_when(WHEN, "test")
    assert compiled(when)(s) == slow(when, s)
    for item in when:
        assert compiled((item,))(s) == item.holds(s)
