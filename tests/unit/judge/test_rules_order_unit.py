"""The order verdict rules are tried in (judge/stages.py): stages, file order
within a stage, `overrides` in front of what they name; `priority:` files of the
old format placed as their priorities placed them (judge/legacy.py). The
shipped rules are tried exactly as their priorities tried them before stages."""
import pytest

from ddpwatch.errors import ConfigError
from ddpwatch.judge import legacy, rules as rules_mod, stages

# rules/default.yaml's verdict rules as they stood before stages: (id, priority)
# in file order. The judgement order was descending priority, ties in file order.
BEFORE_STAGES = [
    ("oom-killed-first", 103), ("died-first", 102), ("ended-after-peer", 101), ("dead", 100),
    ("exited-at-start-loopback-peer", 100), ("exited-at-start", 99), ("exited-early", 98),
    ("missing-not-joined", 98), ("missing-rank", 97), ("straggler-part-stopped", 96),
    ("stopped", 95), ("starting-ddp-setup", 88), ("desync-deviant", 90),
    ("desync-left-loop", 93), ("desync-stack-deviant", 92), ("desync-stack", 91),
    ("desync", 89), ("waits-for-compiling-peer", 86), ("compiling-while-peers-wait", 86),
    ("paused-for-data", 87), ("paused-working", 87), ("waits-for-paused-peer", 80),
    ("hung-outside-idle", 85), ("dropped-inbound", 86), ("unreachable-peer-dropped-there", 86),
    ("unreachable-loopback-address", 84), ("unreachable-gloo-address", 83),
    ("unreachable-peer-off-route", 82), ("unreachable-peer-data", 81), ("unreachable-peer", 80),
    ("straggler-throttled", 87), ("straggler-across-nodes", 57), ("slow-link", 56),
    ("waiting-on-unseen-node", 50), ("waiting-on-unseen-node-window", 49),
    ("waiting-on-straggler", 78), ("blocked-on-dead-peer", 76),
    ("exiting-after-peer-death", 77), ("survivor-of-dead-peer", 74), ("blocked", 75),
    ("rendezvous-launcher", 71), ("rendezvous", 70), ("rendezvous-heartbeat", 69),
    ("warming-up", 60), ("starting", 59), ("starting-alone", 58), ("straggler-starved", 55),
    ("straggler-starved-across-nodes", 55), ("straggler", 54), ("straggler-cpu", 53),
    ("waiting-on-peer", 52), ("waiting-on-peer-cpu", 51), ("healthy-heartbeat", 20),
    ("healthy-cpu", 19), ("agent", 18),
]


# verdict rules shipped since the stages: no priority, placed by their stage alone
OVER_TIME = ["pause-past-bound", "waits-past-pause-bound", "slowing-briefly", "straggler-held",
             "waiting-on-straggler-held"]  # first: the job's past refines this window's
SINCE_STAGES = OVER_TIME + [
    "hung-waiting-for-data", "hung-in-pause",  # before the pauses: nobody works
    "link-silent",  # before blocked: the link, not a rank on the other node
    "collective-moving"]  # before healthy-cpu: in a collective, not computing


def old_order(rows):
    return [rule_id for rule_id, _ in sorted(rows, key=lambda row: -row[1])]  # stable


def tried_all(*extra_files) -> list[str]:
    return [r.id for r in stages.order(rules_mod.load_default(extra_files))]


def tried(*extra_files) -> list[str]:
    """The order, less the rules shipped since the stages (the old order never knew them)."""
    return [r for r in tried_all(*extra_files) if r not in SINCE_STAGES]


def test_the_stages_try_the_shipped_rules_as_their_priorities_did():
    shipped = rules_mod.load_default()
    assert all(r.stage and r.priority is None for r in shipped if r.verdict)
    assert tried() == old_order(BEFORE_STAGES)
    everything = tried_all()
    assert [r for r in everything if r in SINCE_STAGES] == SINCE_STAGES
    assert everything[:len(OVER_TIME)] == OVER_TIME
    at = everything.index("collective-moving")
    assert everything[at - 1:at + 2] == ["healthy-heartbeat", "collective-moving", "healthy-cpu"]
    at = everything.index("link-silent")
    assert everything[at - 1:at + 2] == ["blocked-on-dead-peer", "link-silent", "blocked"]
    at = everything.index("paused-for-data")
    assert everything[at - 2:at] == ["hung-waiting-for-data", "hung-in-pause"]
    assert not set(SINCE_STAGES) & set(legacy.PRIORITY)


def test_the_old_formats_table_is_those_priorities():
    assert legacy.PRIORITY == dict(BEFORE_STAGES)


def test_every_stage_holds_shipped_rules_and_says_what_it_is():
    shipped = rules_mod.load_default()
    for name, doc in stages.STAGES:
        assert any(r.stage == name for r in shipped) and len(doc) > 40, name


def write(tmp_path, text: str, name: str = "extra.yaml") -> str:
    path = tmp_path / name
    path.write_text("rules:\n" + text)
    return str(path)


def verdict_rule(rule_id: str, *lines: str) -> str:
    return (f"  - id: {rule_id}\n    verdict: stopped\n    role: culprit\n"
            + "".join(f"    {line}\n" for line in lines)
            + "    when: [\"state == 'T'\"]\n    evidence: \"state {state}\"\n")


def test_a_new_rule_is_tried_last_in_its_stage(tmp_path):
    order = tried(write(tmp_path, verdict_rule("mine", "stage: stopped")))
    assert order[order.index("stopped") + 1] == "mine"
    assert order[order.index("mine") + 1] == "desync-left-loop"  # the next stage's first


def test_overrides_put_a_rule_just_before_the_first_it_names(tmp_path):
    path = write(tmp_path, verdict_rule("mine", "stage: wait",
                                        "overrides: [blocked, hung-outside-idle]")
                 + verdict_rule("also-mine", "stage: wait", "overrides: [hung-outside-idle]")
                 + verdict_rule("before-mine", "stage: wait", "overrides: [also-mine]"))
    order = tried(path)
    at = order.index("hung-outside-idle")
    assert order[at - 4:at] == ["unreachable-peer-dropped-there", "mine", "before-mine",
                                "also-mine"]
    assert order.count("blocked") == 1 and len(order) == len(BEFORE_STAGES) + 3


def test_a_rule_replaced_by_id_keeps_its_place_or_moves_with_its_stage(tmp_path):
    same = write(tmp_path, verdict_rule("blocked", "stage: wait"))
    assert tried(same) == old_order(BEFORE_STAGES)
    (mine,) = [r for r in rules_mod.load_default([same]) if r.id == "blocked"]
    assert mine.source == f"{same}:2" and mine.verdict == "stopped"
    moved = write(tmp_path, verdict_rule("blocked", "stage: healthy"), "moved.yaml")
    assert tried(moved)[-1] == "blocked"


@pytest.mark.parametrize("priority, after", [
    (100, "exited-at-start-loopback-peer"),  # a tie: after the shipped rules of 100
    (86, "unreachable-peer-dropped-there"),
    (0, "agent"),
])
def test_a_priority_of_the_old_format_is_placed_as_before(tmp_path, priority, after):
    path = write(tmp_path, verdict_rule("mine", f"priority: {priority}"))
    order = tried(path)
    assert order == old_order(BEFORE_STAGES + [("mine", priority)])
    assert order[order.index("mine") - 1] == after


def test_a_copied_shipped_rule_with_its_priority_keeps_its_place(tmp_path):
    """A user's copy of `dead` (priority 100, as it was shipped) went before
    exited-at-start-loopback-peer (100 too) by file order: it still does."""
    path = write(tmp_path, verdict_rule("dead", "priority: 100"))
    assert tried(path) == old_order(BEFORE_STAGES)


def test_the_old_format_is_said_with_what_replaces_it(tmp_path):
    path = write(tmp_path, verdict_rule("mine", "priority: 86")
                 + verdict_rule("bare") + "  - id: finding\n    finding: orphan\n"
                 "    priority: 3\n    when: [orphan]\n")
    notes = stages.deprecations(rules_mod.load_default([path]))
    assert notes == [
        f"{path}:13: rule 'finding': 'priority' means nothing on a finding rule (every "
        f"finding rule applies): leave it out",
        f"{path}:2: rule 'mine': 'priority: 86' is the old way to order verdict rules; tried "
        f"before 'hung-outside-idle': write 'stage: wait' and 'overrides: "
        f"[hung-outside-idle]' instead (docs/rules.md)",
        f"{path}:8: rule 'bare': no 'stage' is the old way to order verdict rules; tried after "
        f"every other rule: write 'stage: healthy' instead (docs/rules.md)"]
    # and doing as told tries them in the same order
    staged = write(tmp_path, verdict_rule("mine", "stage: wait",
                                          "overrides: [hung-outside-idle]")
                   + verdict_rule("bare", "stage: healthy"), "staged.yaml")
    assert tried(staged) == tried(path)
    assert stages.deprecations(rules_mod.load_default([staged])) == []


@pytest.mark.parametrize("lines, line, said", [
    (["stage: hang"], 2, "unknown stage 'hang' (one of over-time, gone, stopped, desync, wait, "
                         "start-up, pace, healthy, tried in that order)"),
    (["stage: wait", "overrides: [nope]"], 2, "overrides 'nope', which is no verdict rule"),
    (["stage: wait", "overrides: [bf16-on-cpu]"], 2, "overrides 'bf16-on-cpu', which is no "
                                                     "verdict rule"),
    (["stage: pace", "overrides: [blocked]"], 2, "overrides 'blocked' of stage 'wait', not of "
                                                 "its own stage 'pace'"),
    (["stage: wait", "overrides: [mine]"], 2, "overrides go round in a circle: mine -> mine"),
    (["stage: wait", "priority: 80"], 2, "'stage' and 'priority' both order it"),
    (["overrides: [blocked]"], 2, "'overrides' needs a 'stage'"),
    (["stage: wait", "overrides: blocked"], 2, "'overrides' must be a list of rule ids"),
    (["priority: 1.5"], 2, "priority must be a whole number"),
])
def test_what_cannot_be_ordered_is_refused_naming_file_line_and_rule(tmp_path, lines, line,
                                                                     said):
    path = write(tmp_path, verdict_rule("mine", *lines))
    with pytest.raises(ConfigError) as err:
        rules_mod.load_default([path])
    assert str(err.value).startswith(f"{path}:{line}: rule 'mine': ") and said in str(err.value)


def test_a_circle_of_overrides_is_named(tmp_path):
    path = write(tmp_path, verdict_rule("a", "stage: wait", "overrides: [b]")
                 + verdict_rule("b", "stage: wait", "overrides: [c]")
                 + verdict_rule("c", "stage: wait", "overrides: [a, blocked]"))
    with pytest.raises(ConfigError) as err:
        rules_mod.load_default([path])
    assert str(err.value) == (f"{path}:2: rule 'a': overrides go round in a circle: "
                              f"a -> b -> c -> a")


def test_a_finding_rule_has_no_stage(tmp_path):
    path = write(tmp_path, "  - id: mine\n    finding: orphan\n    stage: wait\n"
                           "    when: [orphan]\n")
    with pytest.raises(ConfigError, match=r"extra.yaml:2: rule 'mine': 'stage' and "
                                          r"'overrides' order verdict rules"):
        rules_mod.load(path)
