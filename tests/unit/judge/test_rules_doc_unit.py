"""docs/rules.md is what `ddpwatch rules doc` draws now (judge/reference.py):
every rule with its stage, description, conditions and the replay fixtures it
decides or finds in, every signal with its family, type and unit."""
import os
import re

from conftest import REPO
from replay_expected import EXPECTED

from ddpwatch import cli
from ddpwatch.judge import rules as rules_mod, stages
from ddpwatch.judge.signals import SIGNALS

PAGE = os.path.join(REPO, "docs", "rules.md")


def drawn(capsys) -> str:
    assert cli.main(["rules", "doc"]) == 0
    return capsys.readouterr().out


def test_the_page_is_what_the_generator_draws_now(capsys):
    with open(PAGE) as f:
        page = f.read()
    assert page == drawn(capsys), (
        "docs/rules.md is stale: regenerate it with `python -m ddpwatch rules doc > "
        "docs/rules.md` and commit it")


def sections(page: str) -> dict[str, str]:
    """rule id -> its section of the page."""
    parts = re.split(r"^#### (\S+)\n", page, flags=re.M)
    return {parts[i]: parts[i + 1].split("\n### ")[0].split("\n## ")[0]
            for i in range(1, len(parts), 2)}


def test_every_rule_and_signal_is_on_it(capsys):
    page = drawn(capsys)
    by_id = sections(page)
    shipped = rules_mod.load_default()
    # in the order they are tried, then the findings
    assert list(by_id) == [r.id for r in stages.order(shipped)] + [
        r.id for r in shipped if r.finding]
    for rule in shipped:
        section = by_id[rule.id]
        assert rule.description in section
        assert all(f"- `{c.text}`" in section for c in rule.when)
        assert f"`{rule.verdict}`" in section if rule.verdict else f"`{rule.finding}`" in section
    for name, signal in SIGNALS.items():
        assert f"| `{name}` | {signal.type_name} | {signal.unit} | " in page


def test_a_rules_fixtures_are_those_test_replay_expects_it_to_decide_in(capsys):
    by_id = sections(drawn(capsys))
    for fixture, (ranks, _, _) in EXPECTED.items():
        for rank, (_, _, rule_id) in ranks.items():
            named = "unnumbered" if rank < 0 else str(rank)
            listed = re.search(rf"`{fixture}` \(ranks? ([^)]*)\)", by_id[rule_id])
            assert listed and named in listed.group(1).split(", "), (rule_id, fixture, rank)


def test_no_fixtures_is_an_error_not_a_traceback(tmp_path, capsys):
    assert cli.main(["rules", "doc", "--fixtures", str(tmp_path)]) == 66
    err = capsys.readouterr().err
    assert f"{tmp_path}: no replay fixtures" in err and "Traceback" not in err
