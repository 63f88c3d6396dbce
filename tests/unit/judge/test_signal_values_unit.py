"""A string signal that names one of a few things declares them in its SIGNALS
row (judge/signals/spec.py `one_of`); a rule comparing it with anything else is
refused where it is loaded, naming the file, line, rule and the values, and
`rules check` exits 65 (errors.DataError), apart from other rule errors' 78; to
the daemon and diagnose it is a bad rule file like any other (78)."""
import pytest

from ddpwatch import cli, errors
from ddpwatch.judge import rules as rules_mod
from ddpwatch.judge.pausekind import KINDS
from ddpwatch.judge.signals import SIGNALS
from ddpwatch.judge.signals.spec import declare, one_of

RULE = """\
rules:
  - id: sync-wait
    verdict: stopped
    stage: stopped
    description: "Waits in a CUDA synchronise."
    when: ["alive", {cond}]
    evidence: "stack {{stack}}"
"""


def test_a_rule_naming_a_stack_kind_no_stack_has_is_refused_with_the_kinds(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text(RULE.format(cond="\"stack == 'cuda_synch'\""))
    assert cli.main(["rules", "check", str(path)]) == errors.DATA == 65
    err = capsys.readouterr().err
    assert f"{path}:2: rule 'sync-wait': stack is never 'cuda_synch'" in err
    assert "one of: collective, ddp_backward, rendezvous, compile" in err
    with pytest.raises(errors.UndeclaredValue) as err:  # loading refuses it too
        rules_mod.load(str(path))
    assert err.value.exit_code == errors.CONFIG  # the daemon's unit restarts on no 78


@pytest.mark.parametrize("cond", ["\"stack == 'compile'\"", "\"pause_kind in ['data', 'compile']\"",
                                  "\"state != 'T'\"", "\"stack_site != 'train.py:3'\""])
def test_declared_values_and_free_text_load(tmp_path, cond):
    path = tmp_path / "mine.yaml"
    path.write_text(RULE.format(cond=cond))
    assert [r.id for r in rules_mod.load(str(path))] == ["sync-wait"]


def test_one_undeclared_value_in_a_list_is_enough(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(RULE.format(cond="\"pause_kind in ['data', 'dataloader']\""))
    with pytest.raises(errors.UndeclaredValue, match="pause_kind is never 'dataloader'"):
        rules_mod.load(str(path))


def test_the_values_are_in_the_row_and_what_lists_signals_shows_them():
    assert SIGNALS["pause_kind"].values == KINDS
    assert SIGNALS["stack"].kind is str and "cuda_synch" not in SIGNALS["stack"].values
    assert "one of: in_epoch, left_epoch" in SIGNALS["loop_position"].meaning
    assert SIGNALS["stack_site"].values == ()  # free text: any value
    (row,) = declare(("colour", one_of("red", "blue"), "its colour"))
    assert (row.kind, row.values, row.declares("red"), row.declares("green")) == \
        (str, ("red", "blue"), True, False)
