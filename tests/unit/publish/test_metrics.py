"""/metrics over a DaemonView built in code with a fixed NOW (no daemon, no processes).

Golden file: tests/fixtures/metrics/golden.prom is what operators see for
`golden_view()`. After an intended change, regenerate it and review the diff:

    DDPWATCH_UPDATE_GOLDEN=1 python -m pytest tests/unit/publish/test_metrics.py -k golden
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess

import pytest
from conftest import REPO, need
from crafted import (ALERT_STATS, LATE_S, NOW, PEERS, STEP_S, WALL, daemon_view, paused_job,
                     record, ring, snapshot, straggler_job, verdict)
from prometheus_client.parser import text_string_to_metric_families

from ddpwatch.judge.classify import JobVerdict, Judgement, RankVerdict
from ddpwatch.judge.signals.heartbeat import arrival_lateness, job_records
from ddpwatch.publish.metrics import JOB, make_registry, render
from ddpwatch.heartbeat import RingEntry
from ddpwatch.judge.vocabulary import FINDINGS, NAMES as VERDICTS, ROLES
from ddpwatch.publish.view import DaemonView, Incident, JobView

GOLDEN = os.path.join(REPO, "tests", "fixtures", "metrics", "golden.prom")


# ------------------------------------------------------------------ building views

def dead_rank_job() -> JobView:
    """Rank 0 alive and blocked; rank 1's process is gone, its record remains."""
    r0 = record(300, 0, run_id="", phase="inside", entered_at=NOW - 30.0)
    r1 = record(301, 1, run_id="", updated_at=NOW - 31.5, collective_seq=399,
                collectives_completed=399, ring=ring(390, 399, NOW - 41.5))
    snap = snapshot((300,), (r0, r1), (True, False), (20.0,), run_id="")
    ranks = (verdict(300, 0, "blocked_in_collective", "victim"),
             verdict(301, 1, "dead", "culprit", alive=False))
    return JobView("pid300", Judgement(JobVerdict("dead", (1,), "rank 1 died"), ranks,
                                       records=tuple(job_records(snap))), snap)


def golden_view() -> DaemonView:
    incidents = (Incident("i1", "pid300", "open", "dead", (1,), "rank 1 died", WALL, WALL,
                          0.0, "/var/lib/ddpwatch/i1"),
                 Incident("i0", "run-42", "resolved", "straggler", (1,), "s", WALL - 60,
                          WALL - 30, WALL - 30, ""))
    return daemon_view((straggler_job(), dead_rank_job(), paused_job()), incidents=incidents,
                       opened={"dead": 1, "straggler": 2}, peers=PEERS, alert_stats=ALERT_STATS,
                       limits={"incidents_limited": {"young": 12, "uid_rate": 3},
                               "bundles_limited": 2, "bundles_pruned": {"size": 4}})


# ------------------------------------------------------------------ reading /metrics

def scrape(get_view) -> dict[str, list]:
    """{family name: [Sample]} of one rendered scrape (counters keep their _total)."""
    text = render(make_registry(get_view)).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def value(samples, name, **labels):
    found = [s.value for s in samples.get(name, ()) if all(
        s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_a_pause_and_where_the_time_went():
    m = scrape(golden_view)
    assert value(m, "ddpwatch_job_pause_seconds", ddp_job="run-eval", kind="evaluation") == 3.5
    assert value(m, "ddpwatch_job_pause_bound_seconds", ddp_job="run-eval",
                 kind="evaluation") == 300.0
    assert value(m, "ddpwatch_rank_time_seconds_total", ddp_job="run-eval", rank="1",
                 state="waiting", kind="") == 9.0
    assert value(m, "ddpwatch_rank_time_seconds_total", ddp_job="run-eval", rank="0",
                 state="paused", kind="evaluation") == 9.0
    assert "ddpwatch_job_pause_seconds" not in {
        s.name for s in scrape(lambda: daemon_view((straggler_job(),)))
        .get("ddpwatch_job_pause_seconds", ())}


def test_a_probe_stands_in_the_series_while_the_look_that_ran_it_is_kept():
    """A steady job's tick runs none of its job probes (docs/architecture.md
    "Steady jobs"): the runs of the look it kept stand for them, or the
    process probe's series would come and go with the ticks, and a failure of
    the look's would vanish from /metrics and /status for steady_s."""
    from ddpwatch.observe.snapshot import ProbeStatus
    from ddpwatch.publish.endpoints import status_document
    kept = dataclasses.replace(golden_view(), probes=(ProbeStatus("heartbeats", True, 0.001),),
                               kept_probes=(ProbeStatus("process", False, 0.004, "EACCES 13"),
                                            ProbeStatus("process", True, 0.003)))
    m = scrape(lambda: kept)
    assert value(m, "ddpwatch_probe_success", probe="process") == 0.0
    assert value(m, "ddpwatch_probe_duration_seconds", probe="process") == 0.007
    assert value(m, "ddpwatch_probe_error_info", probe="process", reason="EACCES N") == 1.0
    assert value(m, "ddpwatch_probe_success", probe="heartbeats") == 1.0
    assert status_document(kept)["probe_errors"] == {"process": "EACCES 13"}


def test_families_and_labels():
    m = scrape(golden_view)
    assert value(m, "ddpwatch_up") == 1 and value(m, "ddpwatch_ready") == 1
    assert m["ddpwatch_build_info"][0].labels["version"]
    info = value(m, "ddpwatch_rank_info", ddp_job="run-42", rank="1", local_rank="1",
                 host="node-a", backend="gloo", device_type="cpu", compute_dtype="float32",
                 torch_version="2.13.0+cpu", data_fingerprint="fp-abc")
    assert info == 1
    states = [s for s in m["ddpwatch_rank_state"] if s.labels == {**s.labels, JOB: "run-42",
                                                                   "rank": "1"}]
    assert [s.labels["verdict"] for s in states] == list(VERDICTS)
    assert {s.labels["verdict"] for s in states if s.value == 1} == {"straggler"}
    roles = {s.labels["role"]: s.value for s in m["ddpwatch_rank_role"]
             if s.labels[JOB] == "run-42" and s.labels["rank"] == "0"}
    assert roles == {r: float(r == "victim") for r in ROLES}
    finds = {s.labels["finding"]: s.value for s in m["ddpwatch_rank_finding"]
             if s.labels[JOB] == "run-42" and s.labels["rank"] == "1"}
    assert finds == {f: float(f == "oversubscribed") for f in FINDINGS}
    assert value(m, "ddpwatch_job_culprit", ddp_job="run-42", rank="1") == 1
    assert len(m["ddpwatch_job_culprit"]) == 2  # run-42 rank 1, pid300 rank 1
    assert value(m, "ddpwatch_job_state", ddp_job="pid300", verdict="dead") == 1
    assert value(m, "ddpwatch_rank_cpu_seconds_total", ddp_job="run-42", rank="1") == 90.0
    assert value(m, "ddpwatch_rank_step", ddp_job="run-42", rank="0") == 40
    assert value(m, "ddpwatch_rank_collective_seq", ddp_job="run-42", rank="1") == 401
    assert value(m, "ddpwatch_rank_heartbeat_age_seconds", ddp_job="run-42", rank="0") == 0.2
    assert value(m, "ddpwatch_rank_in_collective_seconds", ddp_job="run-42", rank="1") == 0.05
    assert value(m, "ddpwatch_rank_in_collective_seconds", ddp_job="run-42", rank="0") == 0
    assert value(m, "ddpwatch_rank_tokens_total", ddp_job="run-42", rank="0") == 40 * 512
    assert value(m, "ddpwatch_rank_collectives_total", ddp_job="run-42", rank="0") == 400
    assert value(m, "ddpwatch_rank_collective_seconds_total", ddp_job="run-42", rank="0") == 12
    assert value(m, "ddpwatch_rank_step_duration_seconds", ddp_job="run-42", rank="0") == STEP_S
    assert value(m, "ddpwatch_rank_arrival_lateness_seconds", ddp_job="run-42", rank="1") == LATE_S
    assert value(m, "ddpwatch_rank_arrival_lateness_seconds", ddp_job="run-42", rank="0") == 0
    assert value(m, "ddpwatch_incidents_open", ddp_job="pid300") == 1
    assert value(m, "ddpwatch_incidents_open", ddp_job="run-42") == 0
    assert value(m, "ddpwatch_incidents_opened_total", verdict="straggler") == 2
    assert value(m, "ddpwatch_incidents_opened_total", verdict="desync") == 0
    assert value(m, "ddpwatch_probe_success", probe="sockets") == 0
    assert value(m, "ddpwatch_probe_success", probe="process") == 1
    # why a probe failed, not only that it did
    assert value(m, "ddpwatch_probe_error_info", probe="sockets", reason="ss: boom") == 1
    assert "process" not in {s.labels["probe"] for s in m["ddpwatch_probe_error_info"]}
    assert value(m, "ddpwatch_probe_duration_seconds", probe="process") == 0.007
    assert value(m, "ddpwatch_ticks_total") == 7
    assert value(m, "ddpwatch_tick_duration_seconds") == 0.05
    assert value(m, "ddpwatch_collect_errors") == 0
    assert value(m, "ddpwatch_webhook_alerts_total", sink="generic-0", outcome="sent") == 3
    assert value(m, "ddpwatch_webhook_alerts_total", sink="generic-0", outcome="retried") == 4
    assert value(m, "ddpwatch_webhook_alerts_pending", sink="generic-0") == 2
    assert value(m, "ddpwatch_peer_up", peer="http://node-b:19500") == 1
    assert value(m, "ddpwatch_peer_up", peer="http://node-c:19500") == 0
    assert value(m, "ddpwatch_peer_answer_age_seconds", peer="http://node-b:19500") == 0.4
    assert len(m["ddpwatch_peer_answer_age_seconds"]) == 1  # node-c never answered
    # Bounded labels only: no pid, no socket peer, and never Prometheus's own `job`.
    allowed = {JOB, "rank", "local_rank", "host", "backend", "device_type", "compute_dtype",
               "torch_version", "data_fingerprint", "verdict", "role", "finding", "probe",
               "version", "sink", "outcome", "peer", "reason", "stage",
               "state", "kind"}  # bounded: watch/timebook.STATES, judge/pausekind.KINDS
    assert {k for samples in m.values() for s in samples for k in s.labels} <= allowed


def test_dead_rank_still_appears_while_the_view_has_it():
    m = scrape(lambda: daemon_view([dead_rank_job()]))
    assert value(m, "ddpwatch_rank_alive", ddp_job="pid300", rank="1") == 0
    assert value(m, "ddpwatch_rank_state", ddp_job="pid300", rank="1", verdict="dead") == 1
    assert value(m, "ddpwatch_rank_heartbeat_age_seconds", ddp_job="pid300", rank="1") == 31.5
    assert value(m, "ddpwatch_rank_in_collective_seconds", ddp_job="pid300", rank="1") == 0
    assert value(m, "ddpwatch_rank_in_collective_seconds", ddp_job="pid300", rank="0") == 30
    # No /proc for the dead rank: no CPU series rather than a 0. One live rank: no lateness.
    assert [s.labels["rank"] for s in m["ddpwatch_rank_cpu_seconds_total"]] == ["0"]
    assert "ddpwatch_rank_arrival_lateness_seconds" not in m


def test_vanished_ranks_and_jobs_vanish_between_scrapes():
    full = straggler_job()
    one_rank = JobView(full.key, Judgement(full.judgement.job, full.judgement.ranks[:1],
                                           records=full.judgement.records), full.last)
    current = {"view": daemon_view([full, dead_rank_job()])}
    registry = make_registry(lambda: current["view"])

    def series():
        return {(s.name, tuple(sorted(s.labels.items())))
                for fam in text_string_to_metric_families(render(registry).decode())
                for s in fam.samples}

    first = series()
    assert any(dict(lbl).get("rank") == "1" and dict(lbl).get(JOB) == "run-42"
               for _, lbl in first)
    current["view"] = daemon_view([one_rank])
    second = series()
    assert not any(dict(lbl).get(JOB) == "run-42" and dict(lbl).get("rank") == "1"
                   and name != "ddpwatch_job_culprit" for name, lbl in second)
    assert not any(dict(lbl).get(JOB) == "pid300" for _, lbl in second)
    assert any(dict(lbl).get(JOB) == "run-42" and dict(lbl).get("rank") == "0"
               for _, lbl in second)


def test_no_view_yet_and_broken_jobs_never_break_the_scrape():
    m = scrape(lambda: None)
    assert value(m, "ddpwatch_up") == 1 and value(m, "ddpwatch_ready") == 0
    assert "ddpwatch_rank_state" not in m

    def boom():
        raise RuntimeError("getter broke")
    m = scrape(boom)
    assert value(m, "ddpwatch_ready") == 0 and value(m, "ddpwatch_collect_errors") == 1
    broken = JobView("broken", None, straggler_job().last)  # judgement missing
    m = scrape(lambda: daemon_view([broken, dead_rank_job()]))
    assert value(m, "ddpwatch_collect_errors") == 1
    assert {s.labels[JOB] for s in m["ddpwatch_rank_state"]} == {"pid300"}


def test_unidentified_ranks_do_not_make_duplicate_series():
    job = straggler_job()
    ranks = tuple(RankVerdict(**{**v.__dict__, "rank": -1}) for v in job.judgement.ranks)
    job = JobView(job.key, Judgement(JobVerdict("unknown", (), ""), ranks,
                                     records=job.judgement.records), job.last)
    m = scrape(lambda: daemon_view([job]))
    assert value(m, "ddpwatch_rank_alive", ddp_job="run-42", rank="-1") == 1
    assert "ddpwatch_rank_arrival_lateness_seconds" not in m


def test_a_restarted_rank_speaks_for_its_rank_not_its_dead_predecessor():
    job = straggler_job()
    old = verdict(90, 1, "dead", "culprit", alive=False)  # lower pid, record gone: no series
    ranks = (job.judgement.ranks[0], old, job.judgement.ranks[1])
    job = JobView(job.key, Judgement(job.judgement.job, ranks, records=job.judgement.records),
                  job.last)
    m = scrape(lambda: daemon_view([job]))
    assert value(m, "ddpwatch_rank_alive", ddp_job="run-42", rank="1") == 1
    assert value(m, "ddpwatch_rank_state", ddp_job="run-42", rank="1", verdict="straggler") == 1


# ------------------------------------------------------------------ arrival lateness

def test_arrival_lateness_names_the_last_to_arrive():
    early = record(1, 0, ring=ring(10, 20, 100.0))
    late = record(2, 1, ring=ring(12, 20, 100.0 + 2 * STEP_S, late=0.4))
    also = record(3, 2, ring=ring(15, 21, 100.0 + 5 * STEP_S, late=0.1))
    got = arrival_lateness([early, late, also])
    assert got == {0: 0.0, 1: 0.4, 2: 0.1}   # matched at seq 20, the newest all completed


def test_arrival_lateness_skips_desync_and_needs_two_ranks():
    a = record(1, 0, ring=ring(10, 20, 100.0))
    b_ring = ring(10, 19, 100.0, late=0.2) + (RingEntry(20, "broadcast", 8, 110.5, 110.6),)
    b = record(2, 1, ring=b_ring)
    assert arrival_lateness([a, b]) == {0: 0.0, 1: 0.2}        # seq 20 differs: use seq 19
    assert arrival_lateness([a]) == {}
    assert arrival_lateness([a, record(2, 1, ring=ring(30, 40, 0.0))]) == {}  # nothing common
    open_slot = record(2, 1, ring=ring(10, 19, 100.0) + (RingEntry(20, "ddp_bucket_all_reduce",
                                                                   8, 110.0, 0.0),))
    assert arrival_lateness([a, open_slot]) == {0: 0.0, 1: 0.0}  # seq 20 not completed by 1


# ------------------------------------------------------------------ golden + promtool

def test_golden_metrics():
    text = render(make_registry(golden_view)).decode()
    if os.environ.get("DDPWATCH_UPDATE_GOLDEN") == "1":
        os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
        with open(GOLDEN, "w") as f:
            f.write(text)
    with open(GOLDEN) as f:
        assert text == f.read(), ("/metrics changed; if intended, regenerate with "
                                  "DDPWATCH_UPDATE_GOLDEN=1 and review the diff")


@pytest.mark.parametrize("which", ["golden", "no_view"])
def test_promtool_check_metrics(which):
    promtool = shutil.which("promtool")
    need(promtool is not None, "promtool is not installed (Debian: apt install prometheus)")
    if which == "golden":
        with open(GOLDEN, "rb") as f:
            text = f.read()
    else:
        text = render(make_registry(lambda: None))
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                         timeout=60, check=False)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), (
        out.stdout.decode() + out.stderr.decode())


def test_a_rank_judged_from_a_peer_is_left_to_its_own_nodes_daemon():
    """The peer view: node A names rank 1 on node B as the culprit (job series), but
    rank 1's own series come only from node B's daemon (no duplicates across nodes)."""
    job = dead_rank_job()
    remote = dataclasses.replace(job.judgement.ranks[1], remote=True, host="node-b")
    judgement = dataclasses.replace(job.judgement, ranks=(job.judgement.ranks[0], remote))
    m = scrape(lambda: daemon_view([dataclasses.replace(job, judgement=judgement)]))
    assert value(m, "ddpwatch_job_culprit", ddp_job="pid300", rank="1") == 1
    assert value(m, "ddpwatch_job_ranks", ddp_job="pid300") == 1
    assert {s.labels["rank"] for s in m["ddpwatch_rank_state"]} == {"0"}


def test_left_out_help_names_the_limits_the_code_applies():
    # the help once said netns past 8 and threads past 512 while the code read 2
    # and 128: it is now made from observe/budget.py's constants
    from ddpwatch.observe import budget
    view = dataclasses.replace(golden_view(), left_out={"netns": 3})
    family = next(f for f in text_string_to_metric_families(
        render(make_registry(lambda: view)).decode()) if f.name == "ddpwatch_left_out")
    applied = {budget.PER_UID["netns"], budget.TOTAL["netns"], budget.PER_UID["helper_runs"],
               budget.TOTAL["helper_runs"], budget.MAX_FDS, budget.MAX_THREADS,
               budget.MAX_DUMP_THREADS, budget.MAX_JOBS_PER_UID, budget.MAX_LABELS_PER_UID,
               int(budget.LABEL_REFILL_S), budget.MAX_PYTHON_PER_UID}
    numbers = {int(n) for n in re.findall(r"\b\d+\b", family.documentation)}
    assert numbers == applied, family.documentation
    assert f"namespaces past {budget.PER_UID['netns']} a pass" in family.documentation
    assert f"threads past {budget.MAX_THREADS} a pass" in family.documentation
    assert {s.labels["what"] for s in family.samples} >= set(budget.left_out_kinds())


def test_jobs_sharing_an_overflow_label_make_one_set_of_series():
    # publish/label_budget.py: a user's jobs past the bound share uid<N>-overflow;
    # the first in the view's order speaks for it, the others add no duplicate
    a, b = straggler_job(), dead_rank_job()
    a, b = (dataclasses.replace(j, key="uid65534-overflow") for j in (a, b))
    text = render(make_registry(lambda: daemon_view((a, b)))).decode()
    series = [line for line in text.splitlines() if 'ddp_job="uid65534-overflow"' in line]
    assert series and len(series) == len(set(series))
    names = {(f.name, tuple(sorted(s.labels.items())))
             for f in text_string_to_metric_families(text) for s in f.samples}
    assert len(names) == sum(len(f.samples) for f in text_string_to_metric_families(text))
