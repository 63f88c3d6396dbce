"""`any:` in a rule's `when` (judge/conditions.py): OR in the rule file, its
conditions checked like the others, with file, line and rule id."""
import pytest

from ddpwatch.errors import ConfigError
from ddpwatch.judge import rules as rules_mod, stages
from ddpwatch.judge.signals.interfaces import link

RULE = """\
rules:
  - id: my-rule
    verdict: stopped
    stage: stopped
    when: {when}
    evidence: "state {{state}}"
"""


def load(tmp_path, when: str):
    path = tmp_path / "extra.yaml"
    path.write_text(RULE.format(when=when))
    return rules_mod.load(str(path)), str(path)


def test_any_holds_when_one_branch_does(tmp_path):
    (rule,), _ = load(tmp_path, """["alive", any: ["state == 'T'", ["cpu_ratio < 0.05",
                                                     "peers_blocked >= 1"]]]""")
    assert rule.matches({"alive": True, "state": "T"})
    assert rule.matches({"alive": True, "state": "S", "cpu_ratio": 0.01, "peers_blocked": 1})
    # a list in `any` is all of it
    assert not rule.matches({"alive": True, "state": "S", "cpu_ratio": 0.01, "peers_blocked": 0})
    # and the rest of `when` still holds for all
    assert not rule.matches({"alive": False, "state": "T"})
    assert rule.when[1].text == ("any: [state == 'T', [cpu_ratio < 0.05, peers_blocked >= 1]]")
    assert rule.when[1].signals == ("state", "cpu_ratio", "peers_blocked")


def test_an_unmeasured_signal_holds_no_branch(tmp_path):
    (rule,), _ = load(tmp_path, """[any: ["not hb", "cpu_ratio < 0.05"]]""")
    assert not rule.matches({})  # None: neither `not hb` nor the comparison
    assert rule.matches({"hb": False})


def test_a_mapping_written_out_reads_the_same(tmp_path):
    (flow,), _ = load(tmp_path, """["alive", any: ["hb", "cpu_ratio > 0.5"]]""")
    (block,), _ = load(tmp_path, """\n      - alive\n      - any:\n          - hb\n"""
                                 """          - cpu_ratio > 0.5""")
    assert flow.when == block.when


@pytest.mark.parametrize("when, said", [
    ("""[any: ["gpu_temperature > 90", "hb"]]""", "unknown signal 'gpu_temperature'"),
    ("""[any: ["hb", ["alive", "cpu_ratio >= 'busy'"]]]""", "cpu_ratio is int or float, not str"),
    ("""[any: []]""", "'any' must be a non-empty list of conditions"),
    ("""[any: "hb"]""", "'any' must be a non-empty list of conditions"),
    ("""[any: ["hb", []]]""", "an empty list in 'any'"),
    ("""[all: ["hb", "alive"]]""", "a condition is a string or 'any: [...]', not {'all'"),
    ("""[{any: ["hb"], also: 1}]""", "a condition is a string or 'any: [...]'"),
    ("""[any: [any: ["hb", "alive"]]]""", "a condition is a string, not {'any'"),
])
def test_any_is_checked_like_when(tmp_path, when, said):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, when)
    msg = str(err.value)
    assert f"{tmp_path / 'extra.yaml'}:2: rule 'my-rule': " in msg and said in msg, msg


@pytest.mark.parametrize("peer, rule", [
    ({"gloo_off_route": True, "gloo_loopback": False}, "unreachable-peer-off-route"),
    ({"gloo_loopback": True}, "unreachable-peer-off-route"),
    ({"gloo_off_route": False, "gloo_loopback": False}, "unreachable-peer"),
])
def test_either_cause_of_an_unreachable_gloo_address_says_off_route(peer, rule):
    """The shipped rule's `any:` (rules/default.yaml unreachable-peer-off-route):
    the rank dialled listens off its route to the master, or on loopback
    (judge/signals/interfaces.py `link` says which)."""
    dialler = {"pid": 1, "rank": 0, "alive": True, "syn_sent": 1, "syn_sent_to": "10.0.0.2:41000"}
    listener = {"pid": 2, "rank": 1, "alive": True, "gloo_addr": "10.0.0.2", "gloo_port": 41000,
                "all_ranks_local": False, **peer}
    link([dialler, listener])
    tried = stages.order(rules_mod.load_default())
    assert next(r.id for r in tried if r.matches(dialler)) == rule
