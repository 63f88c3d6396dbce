"""The fault benchmark's pure parts (benchmarks/faultbench): the catalogue read
strictly and expanded, the scorer on results built in code, the report."""
from __future__ import annotations

import os
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from faultbench import catalogue, report, score  # noqa: E402

from ddpwatch.errors import ConfigError  # noqa: E402

FRAMEWORKS = """
frameworks:
  torchrun: {argv: [x]}
  spawn: {argv: [y], needs: [lightning]}
"""


def _load(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return catalogue.load(str(path))


def test_the_shipped_catalogue_loads_and_quick_takes_about_one_run_per_class():
    frameworks, scenarios = catalogue.load()
    runs = catalogue.expand(frameworks, scenarios)
    quick = catalogue.expand(frameworks, scenarios, quick=True)
    assert len(quick) < len(runs)
    assert {r.klass for r in quick} >= {"stopped", "dead", "negative", "straggler"}
    assert len({r.name for r in runs}) == len(runs)
    assert all(r.where.startswith("benchmarks/faults.yaml:") for r in runs)


def test_unknown_key_is_an_error_naming_the_line(tmp_path):
    with pytest.raises(ConfigError, match=r"c.yaml:7: unknown key\(s\) cullprits"):
        _load(tmp_path, FRAMEWORKS + """scenarios:
  - {name: a, class: k, frameworks: [torchrun], fault: {kind: none}, expect: no page,
     cullprits: [1]}
""")


def test_unknown_framework_and_bad_expect_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="framework 'lightning' is not defined"):
        _load(tmp_path, FRAMEWORKS + """scenarios:
  - {name: a, class: k, frameworks: [lightning], fault: {kind: none}, expect: no page}
""")
    with pytest.raises(ConfigError, match="expect needs verdict and culprits"):
        _load(tmp_path, FRAMEWORKS + """scenarios:
  - {name: a, class: k, frameworks: [torchrun], fault: {kind: none}, expect: {verdict: dead}}
""")


def test_expand_by_framework_heartbeats_and_only(tmp_path):
    fw, sc = _load(tmp_path, FRAMEWORKS + """scenarios:
  - {name: a, class: stopped, frameworks: [torchrun, spawn], heartbeats: [false, true],
     quick: spawn, fault: {kind: none}, expect: {verdict: stopped, culprits: [1]}}
  - {name: b, class: negative, frameworks: [torchrun], fault: {kind: none}, expect: no page}
""")
    names = [r.name for r in catalogue.expand(fw, sc)]
    assert names == ["a/torchrun", "a/torchrun+hb", "a/spawn", "a/spawn+hb", "b/torchrun"]
    assert [r.name for r in catalogue.expand(fw, sc, quick=True)] == ["a/spawn"]
    assert [r.name for r in catalogue.expand(fw, sc, only="stopped/spawn")] == \
        ["a/spawn", "a/spawn+hb"]
    assert [r.name for r in catalogue.expand(fw, sc, only="negative,b")] == ["b/torchrun"]
    spawn = catalogue.expand(fw, sc, only="a/spawn")[0]
    assert spawn.needs == ("lightning",) and spawn.expect.culprits == (1,)


def test_a_two_node_framework_is_one_of_two_sizes_and_carries_to_its_runs(tmp_path):
    """`nodes: 2` runs the job on two namespace nodes (faultbench/nodes.py); any other
    size is refused naming the framework and its line."""
    with pytest.raises(ConfigError, match=r"c.yaml:3: framework 'pair': nodes is 1 or 2"):
        _load(tmp_path, """frameworks:
  torchrun: {argv: [x]}
  pair: {argv: [y], nodes: 3}
scenarios: []
""")
    fw, sc = _load(tmp_path, """frameworks:
  torchrun: {argv: [x]}
  pair: {argv: [y], nodes: 2}
scenarios:
  - {name: link, class: two_nodes, frameworks: [pair, torchrun], fault: {kind: link, node: 1},
     expect: {verdict: unreachable_peer, culprits: []}}
""")
    assert [(r.name, r.nodes) for r in catalogue.expand(fw, sc)] == [
        ("link/pair", 2), ("link/torchrun", 1)]
    frameworks, scenarios = catalogue.load()  # the shipped catalogue has two-node runs
    assert {r.klass for r in catalogue.expand(frameworks, scenarios) if r.nodes == 2} == {
        "two_nodes"}


def test_percentile_is_nearest_rank():
    assert score.percentile([], 50) is None
    assert score.percentile([3.0], 90) == 3.0
    assert score.percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 50) == 5
    assert score.percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90) == 9
    assert score.percentile([5, 1, 3], 100) == 5


FAULT = {"verdict": ["stopped"], "culprits": [1], "victims": [0]}


def _result(name, expected, daemon, diagnose, **more):
    return {"name": name, "class": more.pop("klass", "stopped"),
            "framework": more.pop("framework", "torchrun"), "expected": expected,
            "daemon": daemon, "diagnose": diagnose, **more}


def test_a_fault_paged_with_its_culprit_is_right_and_a_wrong_rank_is_not():
    right = score.score_run(_result("a", FAULT, {"pages": 1, "verdict": "stopped",
                                                 "culprits": [1], "time_to_page_s": 2.0},
                                    {"exit": 1, "verdict": "stopped", "culprits": [1]}))
    assert (right["daemon_ok"], right["diagnose_ok"], right["ok"]) == (True, True, True)
    wrong = score.score_run(_result("b", FAULT, {"pages": 1, "verdict": "stopped",
                                                 "culprits": [0]},
                                    {"exit": 1, "verdict": "stopped", "culprits": [1]}))
    assert wrong["ok"] is False
    missed = score.score_run(_result("c", FAULT, {"pages": 0}, {"exit": 0,
                                                                "verdict": "healthy",
                                                                "culprits": []}))
    assert missed["ok"] is False
    s = score.summarize([right, wrong, missed])
    assert s["wrong_culprits"] == ["b"]          # a miss names nobody: no wrong name
    assert (s["precision"], s["recall"]) == (0.5, 0.333)
    assert s["accuracy"] == 0.333


def test_a_gone_job_leaves_diagnose_unscored_and_a_negative_page_counts_per_hour():
    gone = score.score_run(_result("d", FAULT, {"pages": 1, "verdict": "stopped",
                                                "culprits": [1], "time_to_page_s": 4.0,
                                                "pages_first_incident": 1},
                                   {"exit": score.GONE_EXIT}))
    assert (gone["diagnose_ok"], gone["ok"]) == (None, True)
    quiet = score.score_run(_result("e", "no page", {"pages": 0},
                                    {"exit": 0, "verdict": "healthy", "culprits": []},
                                    klass="negative", watched_s=1800))
    paged = score.score_run(_result("f", "no page", {"pages": 2, "culprits": [0]},
                                    {"exit": 0, "verdict": "healthy", "culprits": []},
                                    klass="negative", watched_s=1800))
    assert quiet["ok"] is True and paged["ok"] is False
    s = score.summarize([gone, quiet, paged])
    assert s["false_pages_per_hour"] == 2.0 and s["negatives_paged"] == ["f"]
    assert s["time_to_page_p50_s"] == 4.0 and s["pages_per_incident"] == 1.0
    assert s["diagnose_accuracy"] == 1.0  # the gone job is not counted


def test_skipped_and_broken_runs_are_not_scored_and_broken_ones_are_listed():
    skipped = score.score_run({"name": "s", "expected": FAULT, "skipped": "no lightning"})
    broken = score.score_run({"name": "x", "expected": FAULT, "error": "f.yaml:3: timed out"})
    s = score.summarize([skipped, broken])
    assert (s["scored"], s["skipped"], s["broken"], s["accuracy"]) == (0, 1, ["x"], None)


def test_report_is_self_contained_html_with_svg_charts():
    results = [score.score_run(_result("a/torchrun", FAULT, {"pages": 1, "verdict": "stopped",
                                                             "culprits": [1],
                                                             "time_to_page_s": 2.0},
                                       {"exit": 1, "verdict": "stopped", "culprits": [1]})),
               score.score_run({"name": "b/spawn", "class": "dead", "framework": "spawn",
                                "expected": FAULT, "error": "x:1: <not reached>"})]
    doc = {"started": "2026-01-01T00:00:00Z", "command": "python benchmarks/faults.py",
           "host": "h", "wall_s": 1.0, "scenarios": results,
           "summary": score.summarize(results)}
    page = report.html_page(doc)
    assert page.count("<svg") == 2 and "&lt;not reached&gt;" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "<script" not in page
    md = report.markdown(doc)
    assert "| a/torchrun | stopped | stopped [1] | stopped [1] after 2.0 s |" in md
    assert "BROKEN" in md


def test_a_finding_is_expected_from_the_cpus_flags(tmp_path, monkeypatch):
    text = FRAMEWORKS + """scenarios:
  - {name: a, class: bf16, frameworks: [torchrun], fault: {kind: none},
     expect: {page: false, finding: bf16_on_cpu, unless_cpu: [amx_bf16]}}
"""
    monkeypatch.setattr(catalogue, "cpu_flags", lambda: {"avx2"})
    [run] = catalogue.expand(*_load(tmp_path, text))
    assert run.expect.as_json() == {"page": False, "finding": "bf16_on_cpu", "present": True}
    monkeypatch.setattr(catalogue, "cpu_flags", lambda: {"avx2", "amx_bf16"})
    [run] = catalogue.expand(*_load(tmp_path, text))
    assert run.expect.present is False
    expected = {"page": False, "finding": "bf16_on_cpu", "present": True}
    found = score.score_run(_result("a", expected, {"pages": 0, "findings": ["bf16_on_cpu"]},
                                    {"exit": 1, "verdict": "healthy", "culprits": [],
                                     "findings": ["bf16_on_cpu"]}))
    missed = score.score_run(_result("b", expected, {"pages": 0, "findings": []},
                                     {"exit": 0, "verdict": "healthy", "culprits": []}))
    assert found["ok"] is True and (missed["daemon_ok"], missed["diagnose_ok"]) == (False, False)


def test_a_one_shot_judge_is_scored_against_its_own_ground_truth_where_given():
    paused = {"verdict": ["paused"], "culprits": [], "victims": []}
    hung = {"verdict": ["hung_outside_collective"], "culprits": [1], "victims": [0]}
    r = score.score_run(_result("busy", hung, {"pages": 1, "verdict": "hung_outside_collective",
                                               "culprits": [1]},
                                {"exit": 1, "verdict": "paused", "culprits": []},
                                expected_diagnose=paused))
    assert (r["daemon_ok"], r["diagnose_ok"], r["ok"]) == (True, True, True)
    s = score.summarize([r])
    assert (s["diagnose_precision"], s["diagnose_recall"], s["recall"]) == (None, None, 1.0)
