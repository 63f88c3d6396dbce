"""`ddpwatch run`: the per-node loop. The only module that wires the stages:

    discover -> watch each job (watch/: look, judge, over time) -> publish
                (stacks only on suspicion, rate-limited per job: watch/look.py)

Everything kept of one job while it is watched lives in its WatchedJob
(watch/job.py), kept in `self.watched` (WatchedJobs: forgetting a job is one
call); what outlives a job is the IncidentBook's (publish/incidents.py) and
Departures' (observe/jobs/departures.py). Each policy is its stage's: budgets
(observe/budget.py), the incident gate (publish/limits.py Gate), the journal
(publish/journal.py), persistence (publish/incident_store.py Keeper), who may
ask for stacks (publish/viewer.py StackRequests). A tick's state is a `Tick`,
passed along, never kept on the daemon.

Each stage of a tick is guarded: a failure is logged and counted, and the loop
goes on (a watcher that dies at 3 a.m. is worse than one that misses a tick).
"""
from __future__ import annotations

import collections
import logging
import socket
import time

from . import errors
from .judge import rules as rules_mod, vocabulary
from .observe import budget
from .observe.jobs import discovery
from .observe.system import programs
from .observe.window.between import BetweenTicks
from .publish import journal, limits
from .publish.alerts import dispatcher_for
from .publish.alerts.route import AlertRoute, alert_for, alerting, route_open
from .publish.endpoints import base_url
from .publish.evidence import Evidence
from .publish.label_budget import LabelBudget
from .config import Config
from .heartbeat.paths import record_dirs
from .publish.incident_store import Keeper
from .publish.incidents import IncidentBook
from .observe.jobs.departures import Departures
from .observe.probes import ProbeContext
from .observe.sampler import Sampler, progress_of
from .publish.page_list import incident_path
from .publish.view import DaemonView
from .publish.viewer import StackRequests
from .watch.job import WatchedJobs
from .watch.judging import Judging, Tick

log = logging.getLogger("ddpwatch")
# The tick makes a second's worth of short-lived objects (records, signals,
# verdicts) and keeps few: at CPython's default (700 allocations) the cycle
# collector ran ~3.5 times a tick, 2 ms of a 256-rank job's 36 ms kept tick,
# each time walking what the tick still held (benchmarks/README.md "The
# 256-record tick trimmed, A/B"). Reference counting frees nearly all of it
# either way.
GC_GEN0 = 20_000


def collect_less() -> None:
    """The daemon process's cycle collector at GC_GEN0 allocations (`ddpwatch
    run` at start, and benchmarks/daemon.py's in-process ticks as it)."""
    import gc
    gc.set_threshold(GC_GEN0, *gc.get_threshold()[1:])


def boot_time() -> float:
    """Seconds since boot, as /proc/PID/stat's start times count (publish/limits.py)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def load_rules(config: Config) -> list:
    """The shipped rules with the config's rule files on top; an old-format file
    (`priority:`) loads, and the journal says what replaces it (judge/stages.py)."""
    return rules_mod.load_default(config.rules, warn=lambda note: log.warning("rules: %s", note))


class Daemon:
    def __init__(self, config: Config, rules: list, dispatcher=None, clock=time.monotonic,
                 peers=None, boottime=boot_time):
        self.config, self.rules, self.clock, self.boottime = config, rules, clock, boottime
        self.peers = peers  # observe/peers.py PeerPoller when peers are configured (the peer view)
        self.dispatcher = dispatcher
        self.node = socket.gethostname()
        self.view: DaemonView | None = None
        self.gate = limits.Gate(config, clock)  # floods of fake jobs (publish/limits.py)
        self.incidents = IncidentBook(
            config.resolve_after_s, config.open_after_s, config.group_interval_s,
            gate=lambda key, verdict: self.gate.may_open(key, verdict, self.watched.get(key)))
        self.stage_failures: dict[str, int] = collections.Counter()
        # incidents' bundles: written, held back per uid, retried, pruned
        self.evidence = Evidence(self.incidents, config, clock, self.stage_failures)
        self.alert_route = AlertRoute(config.peer_max_age_s)
        # owner key -> all kept of that job while watched, its readings between
        # ticks included (watch/job.py, observe/window/between.py)
        self.between = BetweenTicks(clock, glance_s=config.reading_s)
        self.watched = WatchedJobs(clock, self.between)
        self.departures = Departures()  # ranks seen ending, jobs held after a death
        self.label_budget = LabelBudget()  # ddp_job values per user (publish/label_budget.py)
        self.sampler = self._make_sampler(config)
        self.judging = Judging(self.sampler, self.gate, self.stage_failures, clock)
        self._tick = 0
        self.stack_requests = StackRequests()  # GET /status?stacks=1 (publish/viewer.py)
        self.keeper = Keeper(self.incidents, self.alert_route, self.stage_failures)
        # helper programs found once, by absolute path, not through PATH per call
        missing = [n for n, p in programs.resolve_all().items() if p is None]
        if missing:
            log.warning("not found: %s (the probes that run them report it)",
                        ", ".join(missing))
        self.keeper.resume(config.effective_state_dir())

    def _probe_context(self, config: Config) -> ProbeContext:
        return ProbeContext(heartbeat_dir=config.heartbeat_dir or None, clock=self.clock,
                            timeout_s=config.probe_timeout_s)

    def _make_sampler(self, config: Config) -> Sampler:
        return Sampler(self._probe_context(config), config.probe_on,
                       config.stacks_min_interval_s, budgets=True)

    def reload(self, config: Config, rules: list) -> None:
        """Swap config and rules between ticks (SIGHUP): the webhooks' dispatcher
        and the peer poller are made anew when their settings changed; history and
        incidents stay."""
        from .observe.peers import poller_for, poller_inputs
        try:
            dispatcher = dispatcher_for(config) if config.webhooks != self.config.webhooks \
                else self.dispatcher
        except errors.DdpwatchError as err:  # checked at load already; kept for safety
            log.error("reload: webhooks kept as they were: %s", err)
            dispatcher = self.dispatcher
        if poller_inputs(config) != poller_inputs(self.config):
            if self.peers is not None:
                self.peers.stop()
            self.peers = poller_for(config)
            if self.peers is not None:
                self.peers.start()
        if dispatcher is not self.dispatcher and self.dispatcher is not None:
            self.dispatcher.close(timeout_s=2.0)
        self.config, self.rules, self.dispatcher = config, rules, dispatcher
        self.incidents.resolve_after_s = config.resolve_after_s
        self.incidents.open_after_s = config.open_after_s
        self.incidents.group_interval_s = config.group_interval_s
        self.alert_route.grace_s = config.peer_max_age_s
        self.between.glance_s = config.reading_s
        self.gate.reconfigure(config)
        self.evidence.reconfigure(config)
        self.sampler.reconfigure(self._probe_context(config), config.probe_on,
                                 config.stacks_min_interval_s)
        for watched in self.watched.values():
            watched.looked = None  # judged by the old rules: the next tick looks again

    def close(self) -> None:
        self.sampler.close()

    # --- one tick ------------------------------------------------------------------
    def tick(self) -> DaemonView:
        started = self.clock()
        now = Tick()
        jobs = self._guard("discovery", lambda: self._discover(now), [])
        now.requested = self.stack_requests.take()
        # how far each rank had got by its record (watch/job.py steady)
        now.progress = progress_of(now.survey.heartbeats if now.survey else None)
        # Jobs are who owns them (uid, launcher); a run id is only their label
        # (two users' jobs may claim one: tests/unit/publish/test_hostile_unit.py)
        table = now.survey.table if now.survey is not None else {}
        labels = self._guard("discovery", lambda: discovery.labels(jobs, table), {})
        live = []
        for job in jobs:
            owner, run_id = discovery.owner_key(job, table), discovery.job_key(job)
            watched = self.watched.of(owner)
            label = watched.name(labels.get(owner) or run_id, run_id)
            # a user's label values are bounded (publish/label_budget.py)
            live.append((owner, self.label_budget.label(owner, label, self.clock(),
                                                        watched.grant), job))
        exits = now.survey.exits if now.survey is not None else None
        # only the jobs' ranks and launchers are asked about (departures.py)
        foreground = frozenset(pid for _, _, job in live
                               for pid in job.rank_pids + (job.launcher_pid,)
                               if pid in table and table[pid].foreground)
        judged = self._guard("departures", lambda: self.departures.update(
            live, exits, self.clock(), self.watched.ends, foreground), live)
        alive_at = self.boottime()
        for owner, _, job in judged:
            if job.rank_pids:
                self.watched.of(owner).alive_at = alive_at
        owners = {}
        for owner, label, job in judged:
            view = self._guard("judge", lambda: self.judging.job(
                self.watched.of(owner), job, now, label, self.config, self.rules, self.peers),
                None)
            if view is not None:
                owners[owner] = view
        # the jobs this tick does not watch (one whose judging failed keeps its past)
        self.watched.forget(set(self.watched) - {owner for owner, _, _ in judged})
        self._guard("incidents", lambda: self._incidents(owners, now), None)
        self._guard("bundle", lambda: self.evidence.retry(self._evidence_of,
                                                          self._record_dirs(now)), None)
        self._guard("bundle", self.evidence.prune, None)
        self._guard("persist", lambda: self.keeper.save(self.config.effective_state_dir()), None)
        self._tick += 1
        if self.between.failures:  # counted by the reading thread, published here
            self.stage_failures["between"] = self.between.failures
        views = sorted(owners.values(),
                       key=lambda v: (vocabulary.SEVERITY.index(v.judgement.job.verdict), v.key))
        self.view = DaemonView(
            node=self.node, tick=self._tick, wall_time=time.time(),
            tick_duration_s=round(self.clock() - started, 4), jobs=tuple(views),
            incidents=self.incidents.all(), probes=tuple(now.statuses),
            kept_probes=tuple(now.kept_probes),
            incidents_opened_total=dict(self.incidents.opened_total), ready=True,
            limits={"incidents_limited": dict(self.incidents.limited_total),
                    "bundles_limited": self.evidence.limited,
                    "bundles_pruned": dict(self.evidence.pruned)},
            peers=self.peers.views() if self.peers else (),
            alert_stats=self._guard("alerts", self.dispatcher.stats, None)
            if self.dispatcher is not None else None,
            alerting_jobs=alerting(self.alert_route, self.incidents, self._run_id),
            webhooks=self.dispatcher is not None, stage_failures=dict(self.stage_failures),
            stack_dumps=self.sampler.stack_dumps,
            left_out=self.sampler.left_out() | {"job_labels": self.label_budget.left_out},
            looks_kept=self.judging.looks_kept)
        return self.view

    def _run_id(self, incident) -> str:
        """The run id its other nodes know the incident's job by (JobView.run_id)."""
        watched = self.watched.get(incident.owner)
        return (watched.run_id if watched is not None else "") or incident.job

    def _guard(self, stage: str, fn, default):
        try:
            return fn()
        except Exception:  # one broken stage must not kill the loop
            self.stage_failures[stage] += 1
            log.exception("tick stage %s failed", stage)
            return default

    def _discover(self, now: Tick) -> list:
        now.survey = self.sampler.survey(wire=True)  # ranks started by hand too
        now.statuses.extend(now.survey.probes)
        table = now.survey.table
        return budget.per_user(now.survey.jobs(), lambda job: discovery.owner_key(job, table),
                               discovery.owner_uid, discovery.born_s,
                               lambda: self.sampler.left_out_now("jobs"))

    def between_ticks(self, deadline: float, stop) -> None:
        """Until the next tick; the ranks' states are read meanwhile (the window's
        evidence) by a thread started on the first call (observe/window/between.py)."""
        self.between.start(stop, lambda: log.exception("reading the ranks between ticks failed"))
        stop.wait(max(0.0, deadline - self.clock()))

    def _incidents(self, by_key: dict, now: Tick) -> None:
        """by_key: owner key -> this tick's JobView."""
        journal.transitions(by_key, self.watched)
        verdicts = {k: (v.judgement.job.verdict, v.judgement.job.culprits,
                        v.judgement.job.summary) for k, v in by_key.items()}
        news = set()  # incidents opened or changed this tick
        for event in self.incidents.update(verdicts, time.time(),
                                           {k: v.key for k, v in by_key.items()},
                                           self.watched.standings(by_key)):
            incident = event.incident
            journal.incident(event)
            if event.kind in ("opened", "changed") and event.evidence:
                self.evidence.write(incident, by_key[incident.owner],
                                    self.watched[incident.owner].history,
                                    self._record_dirs(now))
            elif incident.bundle:  # resolved: the page says when and how
                self._guard("bundle", lambda: self.evidence.resolved(incident), "")
            if event.kind != "resolved":
                if event.notify:  # people hear of it (publish/incidents.py Event)
                    news.add(incident.id)
            elif self.alert_route.forget(incident.id):  # it fired from here: resolve it here
                self._send(incident)
        if self.dispatcher is None:
            return  # no webhooks here: claim nothing, so the peers alert themselves
        route_open(self.alert_route, self.incidents, by_key, self.node, self.peers, news,
                   self.clock(), self._send, log.info, self._run_id)

    def _evidence_of(self, owner: str):
        """(JobView, history) of the job `owner` as the last tick judged it, None gone."""
        watched = self.watched.get(owner)
        return (watched.view, watched.history) if watched and watched.view else None

    def _record_dirs(self, now: Tick) -> tuple[str, ...]:
        """The record directories a bundle copies records from: the config's and
        those the ranks named this tick."""
        return record_dirs(self.config.heartbeat_dir or None,
                           now.survey.record_dirs if now.survey is not None else ())

    def _send(self, incident) -> None:
        if self.dispatcher is not None:
            url = base_url(self.config)
            self._guard("alerts", lambda: self.dispatcher.submit(
                alert_for(incident, self.node, url + "/status",
                          url + incident_path(incident.id))), None)


__all__ = ["Daemon", "load_rules"]
