"""Every shipped rule says in its `description` what state it names and why
(rules/default.yaml; docs/rules.md shows it); a user's rule may leave it out."""
import pytest

from ddpwatch.errors import ConfigError
from ddpwatch.judge import rules as rules_mod


def test_every_shipped_rule_has_a_description():
    undescribed = [r.id for r in rules_mod.load_default() if len(r.description) < 40
                   or not r.description.endswith(".") or r.description == r.evidence]
    assert undescribed == []


def test_descriptions_are_told_apart():
    descriptions = [r.description for r in rules_mod.load_default()]
    assert len(set(descriptions)) == len(descriptions)


def test_a_users_rule_needs_none(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("rules:\n  - id: mine\n    verdict: stopped\n    stage: stopped\n"
                    "    when: [\"state == 'T'\"]\n")
    (rule,) = rules_mod.load(str(path))
    assert rule.description == ""
    path.write_text(path.read_text() + "    description: [not, a, sentence]\n")
    with pytest.raises(ConfigError, match=f"{path}:2: rule 'mine': description: a string"):
        rules_mod.load(str(path))
