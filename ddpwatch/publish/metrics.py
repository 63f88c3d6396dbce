"""/metrics: a Prometheus custom collector over the daemon's latest DaemonView.

Built at scrape time from one frozen view, in a registry of its own (not the
global one), so a rank or job that leaves the view leaves /metrics with it.
One job that cannot be exported never breaks the scrape: it is left out,
logged, and counted in `ddpwatch_collect_errors`
(tests/unit/publish/test_metrics.py test_no_view_yet_and_broken_jobs_never_break_the_scrape).

Labels stay bounded: no pid, no socket peer (`peer` is a configured daemon
URL, `sink` a configured webhook). A DDP job is labelled `ddp_job`
(JobView.key), never `job`: Prometheus owns `job` and `instance` as target
labels and renames a scraped `job` to `exported_job` (honor_labels: false, its
default), which would silently merge every run into the scrape job in the
alert rules' `by (...)` aggregations.

Values a probe could not measure are left out, never written as 0 (a blind
watcher must not look idle): a rank without a heartbeat record has no step,
seq or collective series; a rank whose /proc was unreadable has no CPU series.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..judge.signals.heartbeat import arrival_lateness
from ..observe import budget
from ..heartbeat import Record
from ..judge.vocabulary import FINDINGS, NAMES as VERDICTS, ROLES
from .view import DaemonView, IncidentState, JobView

log = logging.getLogger(__name__)

JOB = "ddp_job"
LEFT_OUT = tuple(sorted(budget.left_out_kinds()))
# the tick's guarded stages (daemon.py `_guard`, `stage_failures`), each a series from the start
STAGES = ("discovery", "departures", "judge", "incidents", "bundle", "persist", "alerts",
          "peer_signals", "between")
_R = (JOB, "rank")
LIMITED = ("claims_only", "uid_rate", "young")  # why an incident was held back (limits.Gate)
RANK_INFO_LABELS = (JOB, "rank", "local_rank", "host", "backend", "device_type",
                    "compute_dtype", "torch_version", "data_fingerprint")

# name -> (type, label names, help). Order here is the order on /metrics.
SPECS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "ddpwatch_up": ("gauge", (), "1: the ddpwatch daemon answered this scrape."),
    "ddpwatch_ready": ("gauge", (), (
        "1 once the daemon completed a first tick; 0 before (no job, rank or probe series "
        "then).")),
    "ddpwatch_build_info": ("gauge", ("version",), "ddpwatch version; the value is always 1."),
    "ddpwatch_collect_errors": ("gauge", (), (
        "Jobs (or the whole view) left out of this scrape because exporting them failed (see "
        "the daemon log).")),
    "ddpwatch_ticks_total": ("counter", (), "Ticks the daemon completed since it started."),
    "ddpwatch_tick_duration_seconds": ("gauge", (), "Duration of the last tick."),
    "ddpwatch_last_tick_timestamp_seconds": ("gauge", (), "Unix time of the last tick."),
    "ddpwatch_probe_success": ("gauge", ("probe",), (
        "1 if every run of the probe that the last tick stands on succeeded (its own runs, "
        "and those of the looks it kept for steady jobs: ddpwatch_looks_kept_total), else 0. "
        "Probes run only on suspicion (stacks) appear only in ticks that ran them.")),
    "ddpwatch_probe_duration_seconds": ("gauge", ("probe",), (
        "Time the probe took in the runs the last tick stands on (summed).")),
    "ddpwatch_probe_error_info": ("gauge", ("probe", "reason"), (
        "Why the probe failed in the runs the last tick stands on (its error with numbers as "
        "N, cut to 120 "
        "characters), for each "
        "probe with ddpwatch_probe_success 0; the value is always 1.")),
    "ddpwatch_stage_failures_total": ("counter", ("stage",), (
        "Tick stages that failed since the daemon started (logged, then the tick went on): "
        "discovery, departures (ranks that ended: the job judged as discovered), judge, "
        "incidents, bundle (evidence not written, retried), persist (incidents not saved), "
        "alerts, peer_signals (a job judged without its peers' ranks), between (the "
        "between-ticks reader's failed passes).")),
    "ddpwatch_looks_kept_total": ("counter", (), (
        "Ticks that kept a job's last look rather than look again, summed over jobs since "
        "the daemon started: a healthy job whose every rank's record moved on since the last "
        "tick, none seen stopped, is looked at every steady_s.")),
    "ddpwatch_stack_dumps_total": ("counter", (), (
        "py-spy runs since the daemon started (stack dumps of suspect ranks; a stopped rank "
        "is not dumped).")),
    "ddpwatch_left_out_total": ("counter", ("what",), budget.left_out_help()),
    "ddpwatch_http_refused_total": ("counter", ("reason",), (
        "HTTP connections the daemon's bounded server did not serve in full since it "
        "started: busy_503 (every worker of the request's class busy), evicted (too many "
        "waiting), expired (no request in time), cut (a request too slow or too large), "
        "slow_reader (an answer cut: read slower than the minimum rate, or past its "
        "deadline), writers_full (an answer cut to make room for a newer one of its class), "
        "accept_errors.")),
    "ddpwatch_incidents_open": ("gauge", (JOB,), "Incidents open or ongoing."),
    "ddpwatch_incidents_without_bundle": ("gauge", (JOB,), (
        "Open incidents whose evidence bundle could not be written yet (retried each tick; "
        "/status says why under bundle_error).")),
    "ddpwatch_incidents_opened_total": ("counter", ("verdict",), (
        "Incidents opened since the daemon started, by the verdict that opened them.")),
    "ddpwatch_incidents_limited_total": ("counter", ("reason",), (
        "Jobs whose problem opened no incident when it would have, since the daemon started: "
        "claims_only (a job no look saw more of than ranks claimed in an environment: no "
        "heartbeat record, no socket, never healthy), young (a death of a job that lived less than min_life_s), uid_rate (its owner's "
        "uid used up uid_incidents; it opens when the uid's bucket refills, if it still "
        "stands).")),
    "ddpwatch_bundles_limited_total": ("counter", (), (
        "Incidents whose evidence bundle was held back because its owner's uid used up "
        "uid_bundles (written when the bucket refills, if the job is still there).")),
    "ddpwatch_bundles_pruned_total": ("counter", ("reason",), (
        "Evidence bundles of incidents no longer open removed since the daemon started: age "
        "(older than bundle_max_age_s), size (the oldest, while all held more than "
        "bundle_max_mb).")),
    "ddpwatch_webhook_alerts_total": ("counter", ("sink", "outcome"), (
        "Alerts per webhook sink since the daemon started, by outcome: sent, failed (given up "
        "after retries), dropped (the sink's queue was full: the least severe pending alert "
        "went, the oldest of those); retried counts extra attempts.")),
    "ddpwatch_webhook_alerts_pending": ("gauge", ("sink",), (
        "Alerts queued or in flight for the webhook sink.")),
    "ddpwatch_peer_up": ("gauge", ("peer",), (
        "1 if the peer daemon's last answer is recent enough that its ranks are judged here "
        "(the peer view), else 0.")),
    "ddpwatch_peer_answer_age_seconds": ("gauge", ("peer",), (
        "Seconds since the peer daemon last answered /peer; absent until it has.")),
    "ddpwatch_job_ranks": ("gauge", (JOB,), (
        "Ranks of the job judged on this node (dead ones included).")),
    "ddpwatch_job_state": ("gauge", (JOB, "verdict"), (
        "The job's verdict on this node: 1 for the current verdict, 0 for the others.")),
    "ddpwatch_job_culprit": ("gauge", _R, (
        "1 for each rank this node names as the job's culprit; absent for the others.")),
    "ddpwatch_rank_info": ("gauge", RANK_INFO_LABELS, (
        "Identity of a rank from its heartbeat record (\"\" where unknown); the value is "
        "always 1.")),
    "ddpwatch_rank_state": ("gauge", _R + ("verdict",), (
        "The rank's verdict: 1 for the current verdict, 0 for the others.")),
    "ddpwatch_rank_role": ("gauge", _R + ("role",), (
        "The rank's role in the job's problem: 1 for the current role, 0 for the others.")),
    "ddpwatch_rank_finding": ("gauge", _R + ("finding",), (
        "1 if the finding holds for the rank, else 0.")),
    "ddpwatch_rank_alive": ("gauge", _R, (
        "1 while the rank's process exists, 0 once it is gone (its heartbeat record remains).")),
    "ddpwatch_rank_verdict_confidence": ("gauge", _R, (
        "Confidence of the rank's verdict, 0..1.")),
    "ddpwatch_rank_cpu_seconds_total": ("counter", _R, (
        "CPU time of the rank's process (user + system).")),
    "ddpwatch_rank_step": ("gauge", _R, "Training step the rank is in (steps completed)."),
    "ddpwatch_rank_collective_seq": ("gauge", _R, (
        "Number of the collective the rank is in or last entered.")),
    "ddpwatch_rank_heartbeat_age_seconds": ("gauge", _R, (
        "Seconds since the rank's last heartbeat.")),
    "ddpwatch_rank_in_collective_seconds": ("gauge", _R, (
        "Seconds the rank has been inside its current collective; 0 when outside.")),
    "ddpwatch_rank_step_duration_seconds": ("gauge", _R, (
        "Duration of the rank's last completed step.")),
    "ddpwatch_rank_step_seconds_total": ("counter", _R, "Seconds in completed steps."),
    "ddpwatch_rank_collectives_total": ("counter", _R, "Collectives completed."),
    "ddpwatch_rank_collective_seconds_total": ("counter", _R, (
        "Wall time with a collective outstanding (overlaps counted once).")),
    "ddpwatch_rank_collective_bytes_total": ("counter", _R, (
        "Bytes moved by completed collectives.")),
    "ddpwatch_rank_tokens_total": ("counter", _R, "Tokens the rank processed."),
    "ddpwatch_job_pause_seconds": ("gauge", (JOB, "kind"), (
        "Seconds the job's pause in progress has lasted (a rank working outside the "
        "collectives while its peers wait: evaluation, checkpoint, data, compile, logging, "
        "unknown); absent when none.")),
    "ddpwatch_job_pause_bound_seconds": ("gauge", (JOB, "kind"), (
        "How long the pause in progress may last before it pages: max(pause_floor_s, "
        "pause_factor x the job's longest earlier pause at that place), at most the "
        "collective timeout less max(60 s, 20% of it); absent when no pause.")),
    "ddpwatch_rank_time_seconds_total": ("counter", _R + ("state", "kind"), (
        "Where the rank's time went while watched, from each tick's verdict: computing, "
        "collective (both split by the heartbeat's share in collectives; computing without "
        "heartbeats), waiting (for a pausing or slower peer), paused (kind: what it did), "
        "stalled, starting, unknown.")),
    "ddpwatch_rank_arrival_lateness_seconds": ("gauge", _R, (
        "At the newest collective every local live rank completed: this rank's start minus "
        "the earliest local start. The straggler arrives last.")),
}

Row = tuple[str, tuple[str, ...], float]


def _str(value) -> str:
    return "" if value is None else str(value)


def _num(value: float) -> float:
    return round(float(value), 6)


def _job_rows(jv: JobView) -> list[Row]:
    """Every job and rank series of one JobView (raises on a malformed view)."""
    snap, key, job = jv.last, jv.key, jv.judgement.job
    records = {r.pid: (r, alive) for r, alive in jv.judgement.records}
    procs = {p.pid: p for p in snap.processes.procs if not p.error} if snap.processes else {}
    # Ranks judged here from a peer's signals are exported by their own node's
    # daemon; the job's verdict and culprits here include them.
    local = [rv for rv in jv.judgement.ranks if not rv.remote]
    rows: list[Row] = [("ddpwatch_job_ranks", (key,), len(local))]
    rows += [("ddpwatch_job_state", (key, v), float(v == job.verdict)) for v in VERDICTS]
    rows += [("ddpwatch_job_culprit", (key, str(rank)), 1.0) for rank in sorted(set(job.culprits))]
    seen: set[str] = set()
    live: list[Record] = []

    def alive_of(rv) -> bool:
        return bool(rv.signals.get("alive", records.get(rv.pid, (None, False))[1]))
    # Two processes may claim one rank (a restarted rank next to its dead
    # predecessor's record) or several be unidentified (rank -1): a second series
    # would be a duplicate Prometheus rejects. The live one speaks for the rank.
    for rv in sorted(local, key=lambda rv: not alive_of(rv)):
        rank = str(rv.rank)
        if rank in seen:
            continue
        seen.add(rank)
        r = (key, rank)
        sig = rv.signals
        rec = records.get(rv.pid, (None, False))[0]
        alive = alive_of(rv)
        rows.append(("ddpwatch_rank_info", (
            key, rank, str(rv.local_rank), rv.host or (rec.hostname if rec else ""),
            rec.backend if rec else "", _str(sig.get("device_type") or (rec and rec.device_type)),
            _str(sig.get("compute_dtype") or (rec and rec.compute_dtype)),
            rec.torch_version if rec else "", rec.data_fingerprint if rec else ""), 1.0))
        rows += [("ddpwatch_rank_state", r + (v,), float(v == rv.verdict)) for v in VERDICTS]
        rows += [("ddpwatch_rank_role", r + (v,), float(v == rv.role)) for v in ROLES]
        present = {f.id for f in rv.findings}
        rows += [("ddpwatch_rank_finding", r + (f,), float(f in present)) for f in FINDINGS]
        rows.append(("ddpwatch_rank_alive", r, float(alive)))
        rows.append(("ddpwatch_rank_verdict_confidence", r, _num(rv.confidence)))
        proc = procs.get(rv.pid)
        if proc is not None and proc.cpu_seconds >= 0:
            rows.append(("ddpwatch_rank_cpu_seconds_total", r, _num(proc.cpu_seconds)))
        if rec is None:
            continue
        if alive and rv.rank >= 0:
            live.append(rec)
        age = snap.taken_at - rec.updated_at
        rows += [
            ("ddpwatch_rank_step", r, float(rec.step)),
            ("ddpwatch_rank_collective_seq", r, float(rec.collective_seq)),
            ("ddpwatch_rank_heartbeat_age_seconds", r, _num(max(age, 0.0))),
            ("ddpwatch_rank_in_collective_seconds", r, _num(rec.inside_s(snap.taken_at, alive))),
            ("ddpwatch_rank_step_duration_seconds", r, _num(rec.last_step_seconds)),
            ("ddpwatch_rank_step_seconds_total", r, _num(rec.step_seconds)),
            ("ddpwatch_rank_collectives_total", r, float(rec.collectives_completed)),
            ("ddpwatch_rank_collective_seconds_total", r, _num(rec.collective_seconds)),
            ("ddpwatch_rank_collective_bytes_total", r, float(rec.bytes_total)),
            ("ddpwatch_rank_tokens_total", r, float(rec.tokens)),
        ]
    for rank, late in sorted(arrival_lateness(live).items()):
        rows.append(("ddpwatch_rank_arrival_lateness_seconds", (key, str(rank)), late))
    return rows + _over_time_rows(key, jv.over_time)


def _over_time_rows(key: str, over) -> list[Row]:
    """The job's pause and its ranks' time by state (watch/job.py OverTime)."""
    if over is None:
        return []
    rows: list[Row] = []
    if over.pause is not None:
        rows.append(("ddpwatch_job_pause_seconds", (key, over.pause.kind),
                     _num(over.pause.elapsed_s)))
        rows.append(("ddpwatch_job_pause_bound_seconds", (key, over.pause.kind),
                     _num(over.pause.bound_s)))
    for (rank, state, kind), seconds in sorted(over.totals.items()):
        rows.append(("ddpwatch_rank_time_seconds_total", (key, str(rank), state, kind),
                     _num(seconds)))
    return rows


def _daemon_rows(view: DaemonView) -> list[Row]:
    rows: list[Row] = [
        ("ddpwatch_ticks_total", (), float(view.tick)),
        ("ddpwatch_tick_duration_seconds", (), _num(view.tick_duration_s)),
        ("ddpwatch_last_tick_timestamp_seconds", (), _num(view.wall_time)),
    ]
    probes: dict[str, list] = {}
    for p in view.published_probes:
        probes.setdefault(p.name, []).append(p)
    for name, runs in sorted(probes.items()):
        rows.append(("ddpwatch_probe_success", (name,), float(all(p.ok for p in runs))))
        rows.append(("ddpwatch_probe_duration_seconds", (name,),
                     _num(sum(p.duration_s for p in runs))))
        # digits (pids, ports, counts) made N: one series per kind of failure
        reasons = sorted({re.sub(r"\d+", "N", p.error)[:120] or "failed"
                          for p in runs if not p.ok})
        rows += [("ddpwatch_probe_error_info", (name, r), 1.0) for r in reasons]
    if view.stage_failures is not None:
        failures = dict.fromkeys(STAGES, 0) | dict(view.stage_failures)
        rows += [("ddpwatch_stage_failures_total", (stage,), float(n))
                 for stage, n in sorted(failures.items())]
    if view.stack_dumps >= 0:
        rows.append(("ddpwatch_stack_dumps_total", (), float(view.stack_dumps)))
    if view.looks_kept >= 0:
        rows.append(("ddpwatch_looks_kept_total", (), float(view.looks_kept)))
    if view.left_out is not None:
        left = dict.fromkeys(LEFT_OUT, 0) | dict(view.left_out)
        rows += [("ddpwatch_left_out_total", (what,), float(n))
                 for what, n in sorted(left.items())]
    missing: dict[str, int] = {}
    for inc in view.incidents:
        if inc.state != IncidentState.RESOLVED and not inc.bundle and inc.bundle_error:
            missing[inc.job] = missing.get(inc.job, 0) + 1
    rows += [("ddpwatch_incidents_without_bundle", (job,), float(n))
             for job, n in sorted(missing.items())]
    open_by_job = {jv.key: 0 for jv in view.jobs}
    for inc in view.incidents:
        if inc.state != IncidentState.RESOLVED:
            open_by_job[inc.job] = open_by_job.get(inc.job, 0) + 1
        else:
            open_by_job.setdefault(inc.job, 0)
    rows += [("ddpwatch_incidents_open", (job,), float(n))
             for job, n in sorted(open_by_job.items())]
    # Every verdict from 0, so the first incident of a kind is an increase to rate().
    opened = dict.fromkeys(VERDICTS, 0) | dict(view.incidents_opened_total)
    rows += [("ddpwatch_incidents_opened_total", (v,), float(n)) for v, n in opened.items()]
    if view.limits is not None:
        held = dict.fromkeys(LIMITED, 0) | dict(view.limits.get("incidents_limited", {}))
        rows += [("ddpwatch_incidents_limited_total", (why,), float(n))
                 for why, n in sorted(held.items())]
        rows.append(("ddpwatch_bundles_limited_total", (),
                     float(view.limits.get("bundles_limited", 0))))
        pruned = dict.fromkeys(("age", "size"), 0) | dict(view.limits.get("bundles_pruned", {}))
        rows += [("ddpwatch_bundles_pruned_total", (why,), float(n))
                 for why, n in sorted(pruned.items())]
    for sink, counts in sorted((view.alert_stats or {}).items()):
        rows += [("ddpwatch_webhook_alerts_total", (sink, outcome), float(counts[outcome]))
                 for outcome in ("sent", "failed", "dropped", "retried")]
        rows.append(("ddpwatch_webhook_alerts_pending", (sink,), float(counts["pending"])))
    for peer in view.peers:
        rows.append(("ddpwatch_peer_up", (peer.url,), float(peer.fresh)))
        if peer.age_s is not None:
            rows.append(("ddpwatch_peer_answer_age_seconds", (peer.url,), _num(peer.age_s)))
    return rows


def families(view: DaemonView | None, errors: int = 0,
             http_stats: dict | None = None) -> list[Metric]:
    """The metric families for one view (None: the daemon has no view yet);
    `errors` counts failures the caller already met; `http_stats` the HTTP
    server's refusals (bounded_server.BoundedServer.stats)."""
    rows: list[Row] = [("ddpwatch_up", (), 1.0), ("ddpwatch_build_info", (__version__,), 1.0)]
    rows += [("ddpwatch_http_refused_total", (reason,), float(n))
             for reason, n in sorted((http_stats or {}).items())]
    ready = view is not None and view.ready
    rows.append(("ddpwatch_ready", (), float(ready)))
    if ready:
        rows += _daemon_rows(view)
        exported = set()
        for jv in view.jobs:
            # jobs past their user's label values share one (publish/label_budget.py):
            # the first in the view's order (the most severe) speaks for it, or
            # /metrics would hold two series alike
            if jv.key in exported:
                continue
            exported.add(jv.key)
            try:
                rows += _job_rows(jv)
            except Exception:  # one job must not break the scrape
                errors += 1
                log.exception("metrics: could not export job %s", getattr(jv, "key", "?"))
    rows.append(("ddpwatch_collect_errors", (), float(errors)))
    return to_families(rows)


def to_families(rows: list[Row]) -> list[Metric]:
    """Rows (name, label values in SPECS order, value) as metric families, in SPECS
    order; benchmarks/cluster_scale.py renders its simulated daemons through this."""
    by_name: dict[str, list[Row]] = {}
    for row in rows:
        by_name.setdefault(row[0], []).append(row)
    out: list[Metric] = []
    for name, (kind, labels, doc) in SPECS.items():
        if name not in by_name:
            continue
        cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        family = cls(name, doc, labels=labels)
        for _, values, value in by_name[name]:
            family.add_metric(values, value)
        out.append(family)
    return out


class ViewCollector(Collector):
    """Collects from whatever view `get_view` returns at scrape time."""

    def __init__(self, get_view: Callable[[], DaemonView | None],
                 get_http_stats: Callable[[], dict | None] = lambda: None):
        self._get_view = get_view
        self._get_http_stats = get_http_stats

    def describe(self) -> list[Metric]:
        return []  # nothing at registration: the view may not exist yet

    def collect(self) -> Iterator[Metric]:
        try:
            view, errors = self._get_view(), 0
        except Exception:  # a broken getter is reported, not raised
            log.exception("metrics: could not get the daemon view")
            view, errors = None, 1
        try:
            http_stats = dict(self._get_http_stats() or {})
        except Exception:
            log.exception("metrics: could not get the HTTP server's counts")
            http_stats, errors = None, errors + 1
        yield from families(view, errors, http_stats)


def make_registry(get_view: Callable[[], DaemonView | None],
                  get_http_stats: Callable[[], dict | None] = lambda: None
                  ) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ViewCollector(get_view, get_http_stats))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition format (Content-Type prometheus_client.CONTENT_TYPE_LATEST)."""
    return generate_latest(registry)
