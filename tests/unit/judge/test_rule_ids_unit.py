"""Every verdict comes from a rule: no rule id is made outside rules/*.yaml. The
classifier gives a rank the id of the rule that decided it ("" when none did:
unknown), and the daemon's per-job watch gives the job's past as signals that
the same rules judge (watch/overtime.py, classify.again), never a verdict of
its own. Checked twice: in the source (no `rule="..."` that is no rule), and
on every replay fixture judged as diagnose judges it and then, tick after tick,
as the daemon's watch does (a pause past its bound, a spell of slowness, one
confirmed and held)."""
from __future__ import annotations

import ast
import dataclasses
import glob
import os
from types import SimpleNamespace

import pytest
from conftest import REPO
from replay_expected import EXPECTED, SNAPSHOTS

from ddpwatch.judge import classify, rules as rules_mod
from ddpwatch.observe.snapshot import load, load_over_time, load_remote
from ddpwatch.watch.job import WatchedJob

RULES = rules_mod.load_default()
# the repository's rule files: the shipped one (rules/prometheus/ holds alerting rules)
IDS = {r.id for path in glob.glob(os.path.join(REPO, "rules", "*.yaml"))
       for r in rules_mod.load(path)} | {""}
CONFIG = SimpleNamespace(pause_floor_s=20.0, pause_factor=3.0, collective_timeout_s=0.0,
                         straggler_after_s=30.0)


def _made_ids(path: str):
    """(line, id) of every string given as `rule=` in a call: RankVerdict(...),
    dataclasses.replace(..., rule=...)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "rule" and isinstance(kw.value, ast.Constant) \
                        and isinstance(kw.value.value, str):
                    yield kw.value.lineno, kw.value.value


def test_no_code_names_a_rule_that_is_not_in_the_rule_files():
    made = [(os.path.relpath(path, REPO), line, rule_id)
            for path in glob.glob(os.path.join(REPO, "ddpwatch", "**", "*.py"), recursive=True)
            for line, rule_id in _made_ids(path)]
    assert [m for m in made if m[2] not in IDS] == []


def test_the_check_sees_a_made_up_id(tmp_path):
    path = tmp_path / "engine.py"
    path.write_text("import dataclasses\nr = dataclasses.replace(v, verdict='paused',\n"
                    "                        rule='paused-compiling')\n")
    assert list(_made_ids(str(path))) == [(3, "paused-compiling")]


def _healthy(judgement):
    """`judgement` with every rank looking like its peers in this window."""
    ranks = tuple(dataclasses.replace(r, verdict="healthy", role="none",
                                      rule="healthy-heartbeat") for r in judgement.ranks)
    return dataclasses.replace(judgement, ranks=ranks, job=classify.job_verdict(ranks))


def _watched(window) -> set[str]:
    """The rules a watch's judgements name: `window` for 40 s (a spell confirmed, a
    pause past the 20 s floor), then one in which every rank looks healthy (a
    confirmed spell holds them)."""
    job, seen = WatchedJob("k", 0.0), set()
    for t, judged in [(t, window) for t in range(41)] + [(41, _healthy(window))]:
        judged, _ = job.over_time(judged, float(t), 1e6 + t, CONFIG, RULES)
        seen |= {r.rule for r in judged.ranks}
    return seen


def _window(name: str):
    path = os.path.join(SNAPSHOTS, f"{name}.json")
    return classify.judge(load(path), RULES, load_remote(path))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_what_the_classifier_and_the_watch_give_is_a_rule(name):
    path = os.path.join(SNAPSHOTS, f"{name}.json")
    window = _window(name)
    replayed = classify.judge(load(path), RULES, load_remote(path), load_over_time(path))
    seen = {r.rule for r in window.ranks + replayed.ranks} | _watched(window)
    assert seen <= IDS, seen - IDS


def test_the_watch_gives_every_rule_of_stage_over_time_from_a_real_window():
    """What the loop above walks through does reach the rules of stage over-time
    (the fixtures' pause and slow windows), so the check is not vacuous."""
    seen = set().union(*(_watched(_window(name)) for name in (
        "trainer_busy_hang", "trainer_slow", "trainer_compile_apart")))
    assert {r.id for r in RULES if r.stage == "over-time"} <= seen
