"""`ddpwatch rules check FILE...`: a file is checked as diagnose --rules and the
daemon load it, on top of the shipped rules and the files before it; the old
format loads with a warning that says what replaces it."""
import os

from conftest import REPO

from ddpwatch import cli
from ddpwatch.judge import rules as rules_mod, stages

MINE = """\
rules:
  - id: mine
    verdict: stopped
    role: culprit
    {order}
    description: "Stopped, as I see it."
    when: ["alive", any: ["state == 'T'", "state == 't'"]]
    evidence: "state {{state}}"
"""


def check(capsys, *paths) -> tuple[int, str, str]:
    code = cli.main(["rules", "check", *map(str, paths)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_new_keys_and_overrides_of_shipped_rules_check(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text(MINE.format(order="stage: stopped\n    overrides: [stopped]"))
    assert check(capsys, path) == (0, f"{path}: ok (1 verdict rules, 0 finding rules)\n", "")


def test_a_later_file_may_override_an_earlier_ones_rule(tmp_path, capsys):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(MINE.format(order="stage: stopped"))
    second.write_text(MINE.format(order="stage: stopped\n    overrides: [mine]")
                      .replace("id: mine", "id: yours"))
    code, out, err = check(capsys, first, second)
    assert code == 0 and err == "" and out.count(": ok (1 verdict rules") == 2
    code, _, err = check(capsys, second)  # alone: `mine` is nowhere
    assert code == 78 and f"{second}:2: rule 'yours': overrides 'mine', which is no " in err


def test_the_old_format_checks_with_a_warning(tmp_path, capsys):
    path = tmp_path / "old.yaml"
    path.write_text(MINE.format(order="priority: 96"))
    code, out, err = check(capsys, path)
    assert code == 0 and out == f"{path}: ok (1 verdict rules, 0 finding rules)\n"
    # 96: after straggler-part-stopped's 96 (a tie: the shipped rule first), before
    # stopped's 95
    assert err == (f"ddpwatch rules check: warning: {path}:2: rule 'mine': 'priority: 96' is "
                   f"the old way to order verdict rules; tried before 'stopped': write 'stage: "
                   f"stopped' and 'overrides: [stopped]' instead (docs/rules.md)\n")


def test_what_it_refused_before_it_still_refuses(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(MINE.format(order="stage: stopped").replace("state == 't'", "gpu_temp > 9"))
    code, out, err = check(capsys, path)
    assert code == 78 and out == "" and "Traceback" not in err
    assert f"{path}:2: rule 'mine': unknown signal 'gpu_temp'" in err


def test_the_example_in_writing_a_rule_checks(tmp_path, capsys):
    """docs/architecture.md "Writing a rule": its example loads as it says it is
    tried (just before paused-working)."""
    with open(os.path.join(REPO, "docs", "architecture.md")) as f:
        doc = f.read()
    section = doc.split("## Writing a rule", 1)[1]
    example = tmp_path / "example.yaml"
    example.write_text(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert check(capsys, example) == (0, f"{example}: ok (1 verdict rules, 0 finding rules)\n",
                                      "")
    tried = [r.id for r in stages.order(rules_mod.load_default([str(example)]))]
    assert tried[tried.index("hung-in-io") + 1] == "paused-working"


def test_the_daemon_says_what_replaces_an_old_rule_file(tmp_path, caplog):
    """`ddpwatch run` with an old-format file in `rules:` loads it, and its journal
    says what to write instead, as `rules check` does."""
    import logging

    from ddpwatch.config import Config
    from ddpwatch.daemon import load_rules
    path = tmp_path / "old.yaml"
    path.write_text(MINE.format(order="priority: 95"))
    with caplog.at_level(logging.WARNING, logger="ddpwatch"):
        loaded = load_rules(Config(rules=[str(path)]))
    assert "mine" in {r.id for r in loaded}
    assert any(f"{path}:" in m and "'priority: 95' is the old way" in m and "stage:" in m
               for m in caplog.messages), caplog.messages
