"""What the daemon shows, built in code with a fixed clock (no daemon, no
processes): a straggler's job, a paused job and a DaemonView around them for
/metrics (tests/unit/publish/test_metrics.py, tests/alerts/test_prometheus.py),
an Alert for the sinks (tests/alerts, tests/hostile/test_floods.py), and the
/status a daemon would publish of a saved window (`watched_status`)."""
from __future__ import annotations

from ddpwatch.heartbeat import Record, RingEntry
from ddpwatch.judge.classify import Finding, JobVerdict, Judgement, RankVerdict
from ddpwatch.watch.pauses import Pause
from ddpwatch.judge.signals.heartbeat import job_records
from ddpwatch.observe.probes.heartbeats import HeartbeatObs
from ddpwatch.observe.probes.process import Processes, ProcessObs
from ddpwatch.observe.snapshot import Job, ProbeStatus, Snapshot
from ddpwatch.publish.alerts import Alert
from ddpwatch.observe.peers import PeerView
from ddpwatch.publish.view import DaemonView, JobView
from ddpwatch.watch.job import OverTime

NOW = 1000.0          # monotonic seconds of the last snapshot
WALL = 1_700_000_000.0
STEP_S = 1.0          # the crafted jobs' step time
LATE_S = 0.3          # how late the straggler enters each collective


def ring(first_seq: int, last_seq: int, t0: float, late: float = 0.0,
         op: str = "ddp_bucket_all_reduce") -> tuple[RingEntry, ...]:
    """Completed collectives first..last, one per step, entered `late` s after t0+k."""
    return tuple(RingEntry(seq, op, 4096, t0 + k * STEP_S + late, t0 + k * STEP_S + LATE_S + 0.05)
                 for k, seq in enumerate(range(first_seq, last_seq + 1)))


def record(pid: int, rank: int, **fields) -> Record:
    base = dict(
        pid=pid, rank=rank, local_rank=rank, world_size=2, uid=0, started_at=NOW - 100,
        started_wall=WALL - 100, run_id="run-42", hostname="node-a", torch_version="2.13.0+cpu",
        backend="gloo", device_type="cpu", compute_dtype="float32", data_fingerprint="fp-abc",
        data_batches=100, data_shards=2, seq=2, step=40, collective_seq=400,
        op="ddp_bucket_all_reduce", phase="outside", outstanding=0, bytes=4096,
        entered_at=NOW - 0.5, updated_at=NOW - 0.2, step_started_at=NOW - 0.2,
        collectives_completed=400, collective_seconds=12.0, steps_completed=40,
        step_seconds=40.0, last_step_seconds=STEP_S, tokens=40 * 512, last_step_tokens=512,
        bytes_total=400 * 4096, ring=ring(391, 400, NOW - 10.5))
    base.update(fields)
    return Record(**base)


def verdict(pid: int, rank: int, verdict: str, role: str, findings=(), **signals) -> RankVerdict:
    sig = {"pid": pid, "rank": rank, "alive": True, "device_type": "cpu",
           "compute_dtype": "float32", **signals}
    return RankVerdict(pid=pid, rank=rank, local_rank=rank, host="node-a", verdict=verdict,
                       role=role, confidence=0.8, rule=verdict, evidence="e", remedy="r",
                       findings=tuple(Finding(f, "warning", "e", "r") for f in findings),
                       stack="", signals=sig)


def snapshot(pids, records, alive, cpu, run_id="run-42", taken_at=NOW) -> Snapshot:
    procs = tuple(ProcessObs(pid, state="R", cpu_seconds=c) for pid, c in zip(pids, cpu))
    return Snapshot(version=1, taken_at=taken_at, wall_time=WALL + taken_at - NOW,
                    job=Job(pids[0], -1, "none", tuple(pids), run_id),
                    processes=Processes(taken_at, 5000.0, 100, procs), sockets=None,
                    stacks=None, host=None,
                    heartbeats=HeartbeatObs(tuple(records), tuple(alive), ()), probes=())


def straggler_job(elapsed: float = 0.0, key: str = "run-42") -> JobView:
    """Two local ranks; rank 1 enters every collective LATE_S after rank 0 (straggler,
    culprit; oversubscribed), rank 0 waits on it. `elapsed` seconds of progress later."""
    steps = int(elapsed / STEP_S)
    last = 400 + steps
    t0 = NOW - 10.5 + elapsed

    def progress(rank, late):
        return dict(step=40 + steps, collective_seq=last, collectives_completed=last,
                    steps_completed=40 + steps, step_seconds=40.0 + elapsed,
                    collective_seconds=(12.0 if rank == 0 else 3.0) + elapsed * (0.3 - late),
                    tokens=(40 + steps) * 512, bytes_total=last * 4096,
                    ring=ring(last - 9, last, t0, late), updated_at=NOW + elapsed - 0.2)
    r0 = record(101, 0, **progress(0, 0.0))
    r1 = record(102, 1, **dict(progress(1, LATE_S), collective_seq=last + 1, phase="inside",
                               entered_at=NOW + elapsed - 0.05))
    snap = snapshot((101, 102), (r0, r1), (True, True), (50.0 + elapsed, 90.0 + elapsed),
                    run_id=key, taken_at=NOW + elapsed)
    ranks = (verdict(101, 0, "waiting_on_peer", "victim"),
             verdict(102, 1, "straggler", "culprit", findings=("oversubscribed",)))
    return JobView(key, Judgement(JobVerdict("straggler", (1,), "rank 1 is the culprit"), ranks,
                                  records=tuple(job_records(snap))), snap)


def daemon_view(jobs, tick: int = 7, incidents=(), opened=None, peers=(),
                alert_stats=None, limits=None) -> DaemonView:
    probes = (ProbeStatus("heartbeats", True, 0.001), ProbeStatus("process", True, 0.004),
              ProbeStatus("process", True, 0.003), ProbeStatus("sockets", False, 0.02, "ss: boom"))
    return DaemonView(node="node-a", tick=tick, wall_time=WALL + tick, tick_duration_s=0.05,
                      jobs=tuple(jobs), incidents=tuple(incidents), probes=probes,
                      incidents_opened_total=dict(opened or {}), ready=True,
                      peers=tuple(peers), alert_stats=alert_stats, limits=limits)


PEERS = (PeerView("http://node-b:19500", "node-b", "", 0.4, True),
         PeerView("http://node-c:19500", "", "no answer (timed out)", None, False))
ALERT_STATS = {"generic-0": {"sent": 3, "failed": 1, "retried": 4, "dropped": 0, "pending": 2}}


def paused_job() -> JobView:
    """Rank 0 evaluates alone (a pause) while rank 1 waits, after earlier ones."""
    base = straggler_job()
    ranks = (verdict(101, 0, "paused", "none"), verdict(102, 1, "paused", "none"))
    pause = Pause(rank=0, pid=101, kind="evaluation", site="estimate_loss <- train.py:260",
                  elapsed_s=3.5, earlier=(4.2, 4.6), floor_s=300.0, factor=3.0,
                  timeout_s=1800.0, backend="gloo")
    over = OverTime(pause, {}, {}, (), (), "", {
        (0, "computing", ""): 80.0, (0, "collective", ""): 20.0, (0, "paused", "evaluation"): 9.0,
        (1, "computing", ""): 70.0, (1, "collective", ""): 30.0, (1, "waiting", ""): 9.0})
    return JobView("run-eval", Judgement(JobVerdict("paused", (), "rank 0 evaluates"), ranks,
                                         records=base.judgement.records), base.last, over)


def alert(status="firing", iid="inc-1", **kw) -> Alert:
    fields = dict(node="node-a", job="run-42", verdict="hung_outside_collective",
                  culprits=(3,), summary="rank 3 sleeps outside all_reduce #17; ranks 0-2 wait",
                  started_at=1_700_000_000.0, ended_at=0.0 if status == "firing" else 1_700_000_090.0,
                  status_url="http://node-a:19500/status")
    fields.update(kw)
    return Alert(status=status, incident_id=iid, **fields)


def watched_status(path: str, ticks: int = 1) -> dict:
    """/status of a daemon whose per-job watch judged the window saved at `path`
    (diagnose --save-snapshot) `ticks` ticks 1 s apart, with the shipped rules
    and the default config (a 300 s pause floor): what the daemon publishes of
    that window, as /status serves it (JSON)."""
    import json

    from ddpwatch.config import Config
    from ddpwatch.judge import classify, rules as rules_mod
    from ddpwatch.observe.snapshot import load
    from ddpwatch.publish.endpoints import status_document
    from ddpwatch.watch.job import WatchedJob

    rules = rules_mod.load_default()
    history = load(path)
    window = classify.judge(history, rules)
    job = WatchedJob("k", 0.0)
    for t in range(ticks):
        judged, over = job.over_time(window, float(t), WALL + t, Config(), rules)
    view = JobView("run", judged, history[-1], over)
    return json.loads(json.dumps(status_document(daemon_view([view]))))
