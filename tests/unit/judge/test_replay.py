"""The classifier on saved histories of real jobs (tests/fixtures/snapshots, made by
its capture.py): no processes, fully deterministic. Plus the strictness of rule
files and of `diagnose --replay`."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, need
import overtime_fixtures
from overtime_fixtures import DERIVED
from replay_expected import EXPECTED, LAUNCHERS, SNAPSHOTS

from ddpwatch.judge import classify, signals
from ddpwatch.judge import rules as rules_mod
from ddpwatch.errors import ConfigError
from ddpwatch.observe.snapshot import load, load_over_time, load_remote

DEFAULT_RULES = os.path.join(REPO, "rules", "default.yaml")


@pytest.fixture(scope="module")
def default_rules():
    return rules_mod.load(DEFAULT_RULES)


def fixture_path(name: str) -> str:
    return os.path.join(SNAPSHOTS, f"{name}.json")


def judged(name: str, rules) -> classify.Judgement:
    """With the peers' signals it was judged with (diagnose --peer) and the job's
    past the daemon's watch gave its ranks (stage over-time), if any."""
    path = fixture_path(name)
    return classify.judge(load(path), rules, load_remote(path), load_over_time(path))


def test_every_fixture_has_an_expectation():
    on_disk = {os.path.basename(p)[:-5] for p in glob.glob(os.path.join(SNAPSHOTS, "*.json"))}
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_replay(name, default_rules):
    ranks, culprits, findings = EXPECTED[name]
    j = judged(name, default_rules)
    got = {v.rank: (v.verdict, v.role, v.rule) for v in j.ranks}
    assert got == ranks
    assert list(j.job.culprits) == culprits
    assert {v.rank: {f.id for f in v.findings} for v in j.ranks} == {
        r: set(findings.get(r, ())) for r in ranks}
    for v in j.ranks:  # evidence is rendered from measured facts, never a template
        assert v.evidence and "{" not in v.evidence and v.remedy


def test_bf16_follows_the_cpu_flags(default_rules):
    """Same history, two CPUs: bf16 computed where avx512_bf16 exists is no finding;
    the derived fixture differs only in the host's bf16 flags."""
    with open(fixture_path("trainer_bf16")) as f:
        real = json.load(f)
    with open(fixture_path("trainer_bf16_no_cpu_bf16")) as f:
        derived = json.load(f)
    for snap in real["history"]:
        assert {"avx512_bf16"} <= set(snap["host"]["cpu"]["flags"])
        cpu = snap["host"]["cpu"]
        cpu["flags"] = [x for x in cpu["flags"] if x not in ("avx512_bf16", "amx_bf16")]
        cpu["bf16_native"] = False
    assert real == derived
    for name, finding in (("trainer_bf16", False), ("trainer_bf16_no_cpu_bf16", True)):
        for v in judged(name, default_rules).ranks:
            assert v.signals["compute_dtype"] == "bfloat16" and v.signals["device_type"] == "cpu"
            assert ("bf16_on_cpu" in {f.id for f in v.findings}) is finding


def test_bf16_from_stacks_follows_the_cpu_flags(default_rules):
    """No heartbeats: bf16 from Lightning's mixed-precision frames, a finding only
    on the CPU without bf16 support; the derived fixture differs only in its flags."""
    with open(fixture_path("thirdparty_lightning_bf16_desync")) as f:
        real = json.load(f)
    with open(fixture_path("thirdparty_lightning_bf16_desync_no_cpu_bf16")) as f:
        derived = json.load(f)
    for snap in real["history"]:
        cpu = snap["host"]["cpu"]
        assert {"avx512_bf16"} <= set(cpu["flags"]) and snap["host"]["gpus"] == 0
        cpu["flags"] = [x for x in cpu["flags"] if x not in ("avx512_bf16", "amx_bf16", "bf16")]
        cpu["bf16_native"] = False
    assert real == derived
    for name, finding in (("thirdparty_lightning_bf16_desync", False),
                          ("thirdparty_lightning_bf16_desync_no_cpu_bf16", True)):
        for v in judged(name, default_rules).ranks:
            assert "hb_phase" not in v.signals and "mixed-precision" in v.signals["stack_bf16"]
            assert ("bf16_on_cpu" in {f.id for f in v.findings}) is finding
    accelerate = judged("thirdparty_accelerate_bf16", default_rules).ranks
    assert "accelerate's bf16 autocast" in accelerate[0].signals["stack_bf16"]
    # the autocast("cuda") job's samples caught autocast's frame: still no evidence
    history = load(fixture_path("thirdparty_spawn_autocast_cuda"))
    assert any(f.filename.endswith("torch/amp/autocast_mode.py") for snap in history
               for p in snap.stacks.pids for t in p.threads for f in t.frames)
    assert not any(v.signals.get("stack_bf16") for v in judged(
        "thirdparty_spawn_autocast_cuda", default_rules).ranks)


@pytest.mark.parametrize("name", sorted(DERIVED))
def test_over_time_fixtures_are_their_job_and_what_the_watch_gives(name):
    """A fixture of stage over-time is its base fixture plus the signals over time
    a daemon's watch gives its ranks (tests/support/overtime_fixtures.py), nothing
    written by hand; a fixture without them has none."""
    with open(fixture_path(name)) as f:
        derived = json.load(f)
    with open(fixture_path(DERIVED[name][0])) as f:
        base = json.load(f)
    assert "over_time" not in base
    assert derived.pop("over_time") == overtime_fixtures.rows(overtime_fixtures.over_time(name))
    assert derived == base
    assert load_over_time(fixture_path(name))


def test_compiled_code_on_the_stack_is_not_warm_up(default_rules):
    """Regression: torch/_dynamo frames stay on the stack of every compiled step;
    only frames of the compiler itself (stackmatch.COMPILE_FILES) mean compiling."""
    j = judged("trainer_compiled", default_rules)
    assert all(v.signals["hb_step"] >= 50 for v in j.ranks)
    assert not any(v.signals["stack"] == "compile" for v in j.ranks)
    assert not any(v.verdict == "warming_up" for v in j.ranks)


def _with_dead_records(name: str, tmp_path, **changes) -> str:
    """The fixture plus, in every snapshot, dead copies of its records (other
    pids) with `changes` applied: what an earlier launch leaves in the directory."""
    with open(fixture_path(name)) as f:
        data = json.load(f)
    for snap in data["history"]:
        hb = snap["heartbeats"]
        ghosts = []
        for rec in hb["records"]:
            ghost = dict(rec, pid=rec["pid"] + 100_000, phase="inside")
            ghost.update({k: (v(rec) if callable(v) else v) for k, v in changes.items()})
            ghosts.append(ghost)
        hb["records"] += ghosts
        hb["alive"] += [False] * len(ghosts)
    path = tmp_path / f"{name}_with_ghosts.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_an_earlier_launch_with_the_same_run_id_is_not_this_jobs_dead(default_rules, tmp_path):
    """Regression: torchrun's run id is "none" without --rdzv-id, so a relaunch's
    live ranks share it with the records the last launch left: those held the same
    ranks and went quiet before the relaunch started. Judged with the job, a
    healthy relaunch was called dead."""
    quit_before = lambda rec: rec["started_at"] - 30  # noqa: E731
    earlier = _with_dead_records("trainer_healthy", tmp_path,
                                 started_at=lambda rec: rec["started_at"] - 60,
                                 updated_at=quit_before)
    j = classify.judge(load(earlier), default_rules)
    assert j.job.verdict == "healthy" and len(j.ranks) == 2
    # The same ranks dying during this launch (a rank number no live rank holds,
    # quiet only since after the start) are this job's dead: judged so.
    during = _with_dead_records("trainer_healthy", tmp_path, rank=lambda rec: rec["rank"] + 2,
                                world_size=2, updated_at=lambda rec: rec["updated_at"])
    j = classify.judge(load(during), default_rules)
    assert j.job.verdict == "dead" and len(j.ranks) == 4
    # Ranks started by hand share run id "": an earlier attempt's killed rank 2
    # and this attempt's are both dead and both recent; only the later one counts.
    with open(during) as f:
        data = json.load(f)
    for snap in data["history"]:
        hb = snap["heartbeats"]
        older = [dict(r, pid=r["pid"] + 1, started_at=r["started_at"] - 20)
                 for r, alive in zip(hb["records"], hb["alive"]) if not alive]
        hb["records"] += older
        hb["alive"] += [False] * len(older)
    retried = tmp_path / "retried.json"
    retried.write_text(json.dumps(data))
    j = classify.judge(load(str(retried)), default_rules)
    assert j.job.verdict == "dead" and sorted(v.rank for v in j.ranks) == [0, 1, 2, 3]


def test_every_rule_decides_or_finds_in_some_fixture(default_rules):
    covered = set()
    finding_rules = [r for r in default_rules if r.finding]
    for name in EXPECTED:
        history = load(fixture_path(name))
        covered |= {v.rule for v in judged(name, default_rules).ranks}
        for s in signals.measure(history, load_remote(fixture_path(name))):
            covered |= {r.id for r in finding_rules if r.matches(s)}
    assert {r.id for r in default_rules} - covered == set()


def test_a_lone_view_names_where_the_culprit_is(default_rules):
    """Victims whose culprit no view here holds name it by address
    (docs/design.md "Ranks judged together")."""
    lone = judged("two_nodes_lone_node0", default_rules).job
    assert lone.culprits == () and lone.elsewhere.startswith("a rank on 10.233.")
    plain = judged("two_nodes_thirdparty_lone_node0", default_rules).job
    assert plain.culprits == () and plain.elsewhere.startswith("a rank on 10.233.")
    firewall = judged("two_nodes_firewall_lone_node0", default_rules).job
    assert firewall.culprits == () and firewall.elsewhere.startswith("the node at 10.233.")
    assert firewall.summary.startswith(f"The culprit is {firewall.elsewhere}: rank 0 waits")


def test_every_launcher_has_healthy_and_stopped_fixtures():
    """Replay covers every third-party launcher the tests run."""
    for launcher in LAUNCHERS:
        for state in ("healthy", "stopped"):
            assert f"thirdparty_{launcher}_{state}" in EXPECTED, (launcher, state)


def test_replay_cli_matches_in_process_judgement():
    out = subprocess.run([sys.executable, "-m", "ddpwatch", "diagnose", "--json", "--replay",
                          fixture_path("trainer_hang")], capture_output=True, text=True,
                         timeout=60, check=False, env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 1, out.stderr  # a problem was found
    report = json.loads(out.stdout)
    assert report["job"]["culprits"] == [1]
    assert {r["rank"]: r["verdict"] for r in report["ranks"]} == {
        0: "blocked_in_collective", 1: "hung_outside_collective"}


def test_replay_of_a_healthy_fixture_exits_0():
    out = subprocess.run([sys.executable, "-m", "ddpwatch", "diagnose", "--replay",
                          fixture_path("trainer_healthy")], capture_output=True, text=True,
                         timeout=60, check=False, env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("JOB: HEALTHY")


# --- strictness --------------------------------------------------------------------
GOOD_RULE = """\
version: 1
rules:
  - id: my-rule
    verdict: stopped
    role: culprit
    when: ["state == 'T'"]
    evidence: "state {state}"
"""


def test_unknown_key_names_file_line_and_rule(tmp_path):
    path = tmp_path / "extra.yaml"
    path.write_text(GOOD_RULE + "    colour: red\n")
    with pytest.raises(ConfigError) as err:
        rules_mod.load(str(path))
    msg = str(err.value)
    assert f"{path}:8:" in msg and "'my-rule'" in msg and "'colour'" in msg


def test_unknown_signal_is_an_error(tmp_path):
    path = tmp_path / "extra.yaml"
    path.write_text(GOOD_RULE.replace("state == 'T'", "gpu_temperature > 90"))
    with pytest.raises(ConfigError) as err:
        rules_mod.load(str(path))
    msg = str(err.value)
    assert f"{path}:3:" in msg and "'my-rule'" in msg and "'gpu_temperature'" in msg


@pytest.mark.parametrize("condition, said", [
    ("cpu_ratio >= 'busy'", "cpu_ratio is int or float, not str"),
    ("alive == 1", "alive is bool, not int"),
    ("state in ['T', 1]", "state is str, not int"),
    ("hb_seq == 0.5", "hb_seq is int, not float"),
])
def test_a_value_of_the_wrong_type_is_an_error(tmp_path, condition, said):
    """Signals are typed (judge/signals/*.py SIGNALS): a comparison that can never
    be what the author meant is refused at load, with file, line and rule."""
    path = tmp_path / "extra.yaml"
    path.write_text(GOOD_RULE.replace("state == 'T'", condition))
    with pytest.raises(ConfigError) as err:
        rules_mod.load(str(path))
    msg = str(err.value)
    assert f"{path}:3:" in msg and "'my-rule'" in msg and said in msg, msg


def test_good_rule_file_loads(tmp_path):
    path = tmp_path / "extra.yaml"
    path.write_text(GOOD_RULE)
    (rule,) = rules_mod.load(str(path))
    assert rule.id == "my-rule" and rule.source == f"{path}:3"


def _ddpwatch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddpwatch", *args], capture_output=True,
                          text=True, timeout=60, check=False,
                          env=dict(os.environ, PYTHONPATH=REPO))


def test_rules_check_exit_codes(tmp_path):
    shipped = _ddpwatch("rules", "check")
    assert shipped.returncode == 0, shipped.stderr
    assert "default.yaml: ok" in shipped.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD_RULE + "    colour: red\n")
    out = _ddpwatch("rules", "check", str(bad))
    assert out.returncode == 78
    assert f"{bad}:8:" in out.stderr and "'my-rule'" in out.stderr


@pytest.mark.parametrize("content", ["not json at all {", '{"ddpwatch_snapshots": 99}',
                                     '{"ddpwatch_snapshots": 1, "history": [{"version": 1}]}'])
def test_replay_of_garbage_exits_2_naming_the_file(tmp_path, content):
    path = tmp_path / "garbage.json"
    path.write_text(content)
    out = _ddpwatch("diagnose", "--replay", str(path))
    assert out.returncode == 2
    assert str(path) in out.stderr and "Traceback" not in out.stderr


def test_no_permission_names_the_missing_capability():
    from ddpwatch.commands.diagnose import missing_capability
    assert missing_capability(1000, 1000, 0) is None               # our own rank
    assert missing_capability(1000, 0, 0x1ffffffffff) is None      # root
    assert missing_capability(0, 1000, 0) == "CAP_SYS_PTRACE"     # another user's rank
    assert missing_capability(0, 1000, 1 << 19) is None            # granted the capability


def test_diagnose_of_another_users_rank_exits_77():
    """Real: a process of root's, diagnosed by an unprivileged user (nobody)."""
    import otheruser
    # a world-readable copy of the package and of its imports, and a python nobody
    # may run: the checkout and this interpreter may sit where only root can enter
    runtime = otheruser.runtime()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        out = subprocess.run(otheruser.as_user(otheruser.NOBODY, *runtime.argv(
                                 "-m", "ddpwatch", "diagnose", str(victim.pid))),
                             capture_output=True, text=True, timeout=60, cwd=runtime.place)
        assert out.returncode == 77, out.stderr
        assert "CAP_SYS_PTRACE" in out.stderr and "Traceback" not in out.stderr
    finally:
        victim.kill()
        victim.wait()


def test_process_table_cache_sees_an_exec(tmp_path):
    """A launch script that execs another program keeps its pid and start time: the
    cached command line must not outlive the exec (real processes, real /proc)."""
    from ddpwatch.observe.jobs.discovery import CACHE_AFTER_S, read_table
    marker = tmp_path / "go"
    proc = subprocess.Popen(["sh", "-c", f'while [ ! -e "{marker}" ]; do sleep 0.1; done; '
                                         f'exec "{sys.executable}" -c "import time; time.sleep(30)"'])
    try:
        cache = {}
        wait_until = __import__("conftest").wait_until
        wait_until(lambda: read_table("/proc", cache).get(proc.pid) and any(
            k[0] == proc.pid for k in cache), CACHE_AFTER_S + 30, what="the shell cached")
        assert read_table("/proc", cache)[proc.pid].cmdline[0] == "sh"
        marker.write_text("")
        wait_until(lambda: "python" in read_table("/proc", cache)[proc.pid].cmdline[0], 30,
                   what="the exec'd python seen through the cache")
    finally:
        proc.kill()
        proc.wait()


def _with_old_record_under_pid(history: dict, pid: int, rank: int) -> dict:
    """`history` with a record left by an earlier process that had `pid`: written
    an hour before the process now holding that pid started, then exited (pids come
    back; records stay as evidence in the directory)."""
    for snap in history["history"]:
        proc = next(p for p in snap["processes"]["procs"] if p["pid"] == pid)
        old_start = proc["start_time_s"] - 3600.0
        template = json.load(open(fixture_path("trainer_healthy")))["history"][0]
        old = dict(template["heartbeats"]["records"][0], pid=pid, rank=rank, run_id="old",
                   phase="exited", started_at=old_start, entered_at=old_start + 60,
                   updated_at=old_start + 60, step=300, collective_seq=900, in_collective=False)
        hb = snap["heartbeats"]
        hb["records"].insert(0, old)  # listed first: the old code took the first match
        hb["alive"].insert(0, False)
    return history


@pytest.mark.parametrize("name", ["plain_healthy", "trainer_healthy"])
def test_an_old_record_under_a_reused_pid_is_not_the_ranks(name, default_rules, tmp_path):
    """Regression (CI): a plain job's rank got the pid of a rank of a job that ran
    hours before on the host; its record, left in /dev/shm/ddpwatch, made the live
    rank 'dead: exited at step 300'."""
    with open(fixture_path(name)) as f:
        history = json.load(f)
    pid = history["history"][-1]["job"]["rank_pids"][0]
    rank = 1 if name == "trainer_healthy" else 0
    path = tmp_path / "reused.json"
    path.write_text(json.dumps(_with_old_record_under_pid(history, pid, rank)))
    got = classify.judge(load(str(path)), default_rules)
    want = judged(name, default_rules)
    assert [(v.pid, v.rank, v.verdict, v.rule) for v in got.ranks] == [
        (v.pid, v.rank, v.verdict, v.rule) for v in want.ranks]
    assert got.job.verdict == "healthy"


@pytest.mark.parametrize("name", ["dead_rank_loud", "thirdparty_lightning_killed",
                                  "plain_healthy", "exited_early_silent"])
def test_each_ranks_signals_are_what_the_rules_saw_in_name_order(name, default_rules):
    """classify.judge sorts the signal names once for ranks that hold the same
    ones: a rank holding others (a dead rank beside live ones) still gets its
    own, all of them, sorted; and the first verdict rule that matches decides,
    as Rule.matches says."""
    judgement = judged(name, default_rules)
    measured = signals.measure(load(fixture_path(name)), load_remote(fixture_path(name)))
    by_pid = {s["pid"]: s for s in measured}
    ordered, findings = classify._ordered(default_rules)
    for v in judgement.ranks:
        s = by_pid[v.pid]
        assert list(v.signals) == sorted(v.signals)
        assert v.signals == {k: x for k, x in s.items() if type(x) in classify._SCALARS}
        first = next((r for r, _ in ordered if r.matches(s)), None)
        assert v.rule == (first.id if first else "")
        assert [f.id for f in v.findings] == [r.finding for r, _ in findings if r.matches(s)]
    assert len(judgement.ranks) >= 2
