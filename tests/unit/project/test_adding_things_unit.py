"""docs/architecture.md "Adding things" holds: a verdict, a launcher and a
string signal's value, each added as that table says (its rows, in a copy of the
package), are taken by everything else: a rule using them loads, a snapshot is
judged with it, a launcher's argv is recognised. Before the rows, the same rule
is refused and the argv is nobody's."""
import os
import shutil
import subprocess
import sys

from conftest import REPO

# docs/architecture.md: "a verdict: its row in judge/vocabulary.py VERDICTS ... and
# its name in SEVERITY; its rules in rules/default.yaml"
VERDICT_ROW = ('    Verdict("paging", False, False, 0.0, "its process pages (state W)", "orange",\n'
               '            "stalled"),\n)\n# Most severe first')
# "a signal ... its line in its family's SIGNALS": a value is part of that line
STATE_ROW = ('one_of("R", "S", "D", "T", "t", "Z", "X", "I")',
             'one_of("R", "S", "D", "T", "t", "Z", "X", "I", "W")')
# "a launcher ... its entry in launchers.py TABLE"
LAUNCHER_ROW = ('    Launcher("env", "peers",',
                '    Launcher("mylaunch", "workers", Argv(programs=("mylaunch",)), env=(TORCH,)),\n'
                '    Launcher("env", "peers",')
RULE = """\
  - id: paging
    verdict: paging
    role: culprit
    stage: stopped
    description: "A rank whose process pages (state W): its peers wait for it."
    when: ["alive", "state == 'W'"]
    evidence: "process state {state}"
    remedy: "Give it memory."
"""
SCRIPT = """
import dataclasses, sys
import crafted
from ddpwatch.errors import ConfigError
from ddpwatch.judge import classify, rules
from ddpwatch.observe.jobs import discovery, launchers
try:
    loaded = rules.load_default()
except ConfigError as err:
    sys.exit(f"refused: {err}")
snap = crafted.snapshot((101, 102), (crafted.record(101, 0), crafted.record(102, 1)),
                        (True, True), (30.0, 30.0))
procs = tuple(dataclasses.replace(p, state="W") if p.pid == 102 else p
              for p in snap.processes.procs)
snap = dataclasses.replace(snap, processes=dataclasses.replace(snap.processes, procs=procs))
got = {r.rank: (r.verdict, r.rule) for r in classify.judge((snap,), loaded).ranks}
print(got[1], launchers.launcher_kind(("mylaunch", "train.py")), "mylaunch" in discovery.KINDS)
"""


def run(root):
    path = os.pathsep.join([root, os.path.join(REPO, "tests", "support")])
    env = dict(os.environ, PYTHONPATH=path)
    return subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)


def edit(path, old, new):
    with open(path) as f:
        text = f.read()
    assert text.count(old) == 1, (path, old)
    with open(path, "w") as f:
        f.write(text.replace(old, new))


def copy_with_the_rule(tmp_path) -> str:
    """The package and its rules, the rule added to rules/default.yaml."""
    root = str(tmp_path)
    shutil.copytree(os.path.join(REPO, "ddpwatch"), os.path.join(root, "ddpwatch"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(os.path.join(REPO, "rules"), os.path.join(root, "rules"))
    with open(os.path.join(root, "rules", "default.yaml"), "a") as f:
        f.write("\n" + RULE)
    return root


def add_the_verdict(pkg):
    edit(os.path.join(pkg, "judge", "vocabulary.py"), ")\n# Most severe first", VERDICT_ROW)
    edit(os.path.join(pkg, "judge", "vocabulary.py"), 'SEVERITY = ("dead", "stopped", ',
         'SEVERITY = ("dead", "stopped", "paging", ')


def test_a_verdict_a_launcher_and_a_signal_value_are_a_row_each(tmp_path):
    root = copy_with_the_rule(tmp_path)
    before = run(root)
    assert before.returncode == 1 and "refused:" in before.stderr, before.stderr
    assert "unknown verdict 'paging'" in before.stderr

    pkg = os.path.join(root, "ddpwatch")
    add_the_verdict(pkg)
    edit(os.path.join(pkg, "judge", "signals", "process.py"), *STATE_ROW)
    edit(os.path.join(pkg, "launchers.py"), *LAUNCHER_ROW)
    after = run(root)
    assert after.returncode == 0, after.stderr
    assert after.stdout.split("\n")[0] == "('paging', 'paging') mylaunch True"


def test_without_the_value_the_rule_is_refused_for_it(tmp_path):
    """The verdict alone is not enough: `state == 'W'` names a value the state
    signal does not declare."""
    root = copy_with_the_rule(tmp_path)
    add_the_verdict(os.path.join(root, "ddpwatch"))
    got = run(root)
    assert "state is never 'W'" in got.stderr and "one of: R, S, D, T, t, Z, X, I" in got.stderr
