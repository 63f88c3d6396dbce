"""`ddpwatch rules doc [--fixtures DIR]`: print docs/rules.md, the reference of
every rule and signal (judge/reference.py), with the replay fixtures each
shipped rule decides or finds in: each fixture judged with the shipped rules,
as tests/unit/judge/test_replay.py judges it."""
from __future__ import annotations

import glob
import os

from .. import errors
from ..judge import classify, reference, rules as rules_mod
from ..observe.snapshot import load, load_over_time, load_remote

# a source checkout's fixtures: ddpwatch/../tests/fixtures/snapshots
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(args) -> int:
    rules = rules_mod.load_default()
    fixtures = args.fixtures or os.path.join(CHECKOUT, "tests", "fixtures", "snapshots")
    paths = sorted(glob.glob(os.path.join(glob.escape(fixtures), "*.json")))
    if not paths:
        raise errors.NoInput(f"{fixtures}: no replay fixtures (*.json) there; a source "
                             f"checkout has them in tests/fixtures/snapshots (--fixtures DIR)")
    print(reference.markdown(rules, exercised(rules, paths)), end="")
    return errors.OK


def exercised(rules, paths) -> dict[str, list[tuple[str, int]]]:
    """rule id -> [(fixture, rank)] where it decides the rank's verdict or finds."""
    findings = [r for r in rules if r.finding]
    out: dict[str, list[tuple[str, int]]] = {}
    for path in paths:
        name = os.path.basename(path)[:-len(".json")]
        for v in classify.judge(load(path), rules, load_remote(path),
                                 load_over_time(path)).ranks:
            # v.signals holds every measured (non-None) signal: what the rules read
            decided = [v.rule] if v.rule else []  # "": no rule matched (unknown)
            for rule_id in decided + [r.id for r in findings if r.matches(v.signals)]:
                out.setdefault(rule_id, []).append((name, v.rank))
    return out
