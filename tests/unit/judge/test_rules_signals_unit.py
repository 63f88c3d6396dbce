"""`ddpwatch rules signals`: every signal a rule may name, listed from its
family's SIGNALS line (judge/signals/spec.py), with a unit wherever it is an
amount; errors are exit codes, never a traceback."""
import json

import pytest

from ddpwatch import cli
from ddpwatch.judge.signals import FAMILY, SIGNALS
from ddpwatch.judge.signals.spec import NUMBER, UNITS, Signal


def test_every_amount_has_a_unit_and_every_unit_is_known():
    assert [n for n, s in SIGNALS.items() if s.kind == NUMBER and not s.unit] == []
    assert {s.unit for s in SIGNALS.values()} - {""} <= set(UNITS)
    with pytest.raises(ValueError, match="unknown unit '%'"):
        Signal("cpu_percent", NUMBER, "CPU", "%")


def test_the_table_lists_every_signal_once(capsys):
    assert cli.main(["rules", "signals"]) == 0
    out = capsys.readouterr().out
    names = [line.split()[0] for line in out.split("\n\n")[0].splitlines()[1:]]
    assert names == list(SIGNALS)
    row = next(line for line in out.splitlines() if line.startswith("cpu_ratio "))
    assert row.split()[1:4] == ["process", "number", "cores"]
    assert "share  a fraction of a whole" in out


def test_json_says_family_type_unit_and_meaning(capsys):
    assert cli.main(["rules", "signals", "--json", "hb_stalled", "stopped_share"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["signals"] == [
        {"name": "hb_stalled", "family": "heartbeat", "type": "bool", "unit": None,
         "meaning": SIGNALS["hb_stalled"].doc, "values": None},
        {"name": "stopped_share", "family": "window", "type": "number", "unit": "share",
         "meaning": SIGNALS["stopped_share"].doc, "values": None}]
    assert got["units"] == UNITS
    assert cli.main(["rules", "signals", "--json", "loop_position"]) == 0
    assert json.loads(capsys.readouterr().out)["signals"][0]["values"] == ["in_epoch", "left_epoch"]


def test_a_family_alone(capsys):
    assert cli.main(["rules", "signals", "--family", "exits", "--json"]) == 0
    names = [s["name"] for s in json.loads(capsys.readouterr().out)["signals"]]
    assert names == [n for n in SIGNALS if FAMILY[n] == "exits"] and "died_first" in names


@pytest.mark.parametrize("argv, said", [
    (["cpu_rati"], "no signal 'cpu_rati' (did you mean cpu_ratio"),
    (["--family", "gpu"], "no signal family 'gpu' (one of exits, heartbeat"),
])
def test_an_unknown_name_is_a_usage_error(capsys, argv, said):
    assert cli.main(["rules", "signals", *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
