"""`ddpwatch rules explain ID` (commands/rules_explain.py, as ruff's `ruff rule`):
one rule as it is tried, its stage, description, conditions, the fixtures it
decides in and where it is overridden; an unknown id is exit 67."""
from __future__ import annotations

import json
import os
import shutil

from conftest import REPO

from ddpwatch import cli, errors

SNAPSHOTS = os.path.join(REPO, "tests", "fixtures", "snapshots")


def explain(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["rules", "explain", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def fixtures(tmp_path, *names: str) -> str:
    """A fixtures directory holding only these (the default replays them all)."""
    for name in names:
        shutil.copy(os.path.join(SNAPSHOTS, f"{name}.json"), tmp_path / f"{name}.json")
    return str(tmp_path)


def test_a_shipped_rule_with_its_stage_conditions_and_fixtures(capsys):
    code, out, _ = explain(capsys, "hung-in-pause")
    assert code == errors.OK
    first, written, stage, tried, overridden = out.splitlines()[:5]
    assert first == "hung-in-pause: verdict hung_outside_collective, role culprit, confidence 0.85"
    assert written.endswith(os.path.join("rules", "default.yaml") + ":" + written.split(":")[-1])
    assert stage.split() == ["stage", "wait", "(5", "of", "8)"]
    assert tried.startswith("  tried        ") and ", after hung-waiting-for-data" in tried
    assert "by no rule" in overridden
    assert "A rank idle at a pause site" in out  # its description
    assert "    not working\n" in out and "    peers_blocked >= 1\n" in out
    assert "working (work, bool): " in out  # what each signal it reads means
    for name in ("pause_eval_hung", "pause_ckpt_hung", "pause_log_hung"):
        assert f"{name} (rank 0)" in out


def test_where_it_is_overridden_and_replaced(capsys, tmp_path):
    extra = tmp_path / "mine.yaml"
    extra.write_text(
        "rules:\n"
        "  - id: mine\n    verdict: paused\n    stage: wait\n    overrides: [paused-working]\n"
        "    when: [\"alive\", \"pausing\", \"cpu_ratio > 0.5\"]\n"
        "  - id: stopped\n    verdict: stopped\n    role: culprit\n    stage: stopped\n"
        "    when: [\"alive\", \"state == 'T'\"]\n")
    os.makedirs(tmp_path / "f")
    where = fixtures(tmp_path / "f", "pause_ckpt_slow")
    code, out, _ = explain(capsys, "paused-working", "--rules", str(extra), "--fixtures", where)
    assert code == errors.OK
    assert f"  overridden   mine ({extra}:2)" in out
    assert "pause_ckpt_slow (rank 0)" in out
    code, out, _ = explain(capsys, "stopped", "--rules", str(extra), "--fixtures", where)
    assert f"written at   {extra}:7" in out and "replaces     the shipped rule of that id (" in out
    assert "fixtures: none decides or finds by it" in out


def test_a_finding_rule_and_json(capsys, tmp_path):
    where = fixtures(tmp_path, "trainer_oversubscribed")
    code, out, _ = explain(capsys, "oversubscribed", "--fixtures", where, "--json")
    doc = json.loads(out)
    assert code == errors.OK and doc["kind"] == "finding" and doc["severity"]
    assert {"fixture": "trainer_oversubscribed", "rank": 1} in doc["fixtures"]
    code, out, _ = explain(capsys, "pause-past-bound", "--fixtures", where, "--json")
    doc = json.loads(out)
    assert (doc["stage"], doc["stage_number"], doc["position"]) == ("over-time", 1, 1)
    assert doc["when"] == ["pause_works", "pause_over"] and doc["fixtures"] == []
    assert [s["family"] for s in doc["signals"]] == ["overtime", "overtime"]


def test_an_unknown_id_is_exit_67_naming_the_closest(capsys):
    code, out, err = explain(capsys, "paused-compiling")
    assert code == errors.UNKNOWN == 67 and out == ""
    assert err.startswith("ddpwatch rules: no rule 'paused-compiling' (did you mean ")
    assert "paused-working" in err


def test_fixtures_that_are_not_there(capsys, tmp_path):
    code, _, err = explain(capsys, "stopped", "--fixtures", str(tmp_path))
    assert code == errors.NO_INPUT and "no replay fixtures" in err
