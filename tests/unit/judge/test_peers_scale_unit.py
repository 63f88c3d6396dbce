"""Signals of a rank next to its peers stay linear in the job's size
(judge/signals/peers.py): the median of the peers' values read around the
rank's own, the pausing peers named once. Pure."""
from __future__ import annotations

import random
import statistics

from ddpwatch.judge.signals import peers


def test_the_median_of_a_ranks_peers_is_the_median_of_the_others_values():
    rng = random.Random(7)
    for n in list(range(1, 9)) + [31, 256]:
        ranks = [{"alive": rng.random() > 0.1, "x": rng.choice([None, rng.randint(0, 5),
                                                                 rng.random()])}
                 for _ in range(n)]
        median = peers._PeerMedian(ranks, "x")
        for s in ranks:
            others = [p["x"] for p in ranks if p is not s and p["alive"] and p["x"] is not None]
            expected = statistics.median(others) if others else None
            assert median.of_peers(s) == expected


def _pausing(n: int, working: bool = True) -> list[dict]:
    # each waits for its DataLoader while its workers work (judge/signals/work.py)
    return [{"alive": True, "rank": r, "state": "S", "pause_kind": "data", "working": working,
             "pause_site": f"__next__ <- train.py:{r}"} for r in range(n)]


def test_ranks_waiting_for_idle_workers_are_not_pausing():
    """Where the stack stands names the pause; only measured work makes one."""
    ranks = _pausing(3, working=False)
    peers.link_pauses(ranks)
    assert [s["pausing"] for s in ranks] == [False] * 3
    assert [s["peers_paused"] for s in ranks] == [0] * 3


def test_every_pausing_peer_is_counted_and_the_first_three_named():
    ranks = _pausing(6)
    peers.link_pauses(ranks)
    assert [s["peers_paused"] for s in ranks] == [5] * 6
    assert ranks[0]["paused_peer"] == ("rank 1 (data at __next__ <- train.py:1); rank 2 (data at "
                                       "__next__ <- train.py:2); rank 3 (data at __next__ <- "
                                       "train.py:3) and 2 more")
    assert ranks[5]["paused_peer"].startswith("rank 0 (data") and ranks[5]["paused_peer"].endswith(
        "and 2 more")
    two = _pausing(2)
    peers.link_pauses(two)
    assert two[0]["paused_peer"] == "rank 1 (data at __next__ <- train.py:1)"
    assert two[1]["peers_paused"] == 1
