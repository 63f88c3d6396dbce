"""`ddpwatch run`: the per-node loop. The only module that wires the stages:

    discover -> watch each job (watch/: look, judge, over time) -> publish
                (stacks only on suspicion, rate-limited per job: watch/look.py)

Everything the daemon knows of one job lives in its WatchedJob (watch/job.py),
kept in `self.watched`; the daemon itself holds node-wide books only (incidents,
alert routing, the limits per uid).

Each stage of a tick is guarded: a failure is logged and counted, and the loop
goes on (a watcher that dies at 3 a.m. is worse than one that misses a tick).
"""
from __future__ import annotations

import collections
import logging
import socket
import threading
import time

from .judge import classify, rules as rules_mod, vocabulary
from .observe.jobs import discovery
from .observe.budget import MAX_JOBS_PER_UID
from .observe.system import programs
from .observe.window.between import BetweenTicks
from .publish.alerts.route import AlertRoute, alert_for, route_open
from .publish import limits
from .publish.evidence import Evidence
from .publish.label_budget import LabelBudget
from .config import Config
from .heartbeat.paths import record_dirs
from .publish import incident_store
from .publish.incidents import IncidentBook
from .observe.jobs.departures import Departures
from .observe.probes import ProbeContext
from .observe.sampler import Sampler, progress_of
from .publish.page_list import incident_path
from .publish.view import DaemonView, JobView
from .watch import look
from .watch.job import Looked, WatchedJob

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


ALL_JOBS = "all"  # stacks_requested: every job, whoever owns it


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
        self.config = config
        self.peers = peers  # observe/peers.py PeerPoller when peers are configured (the peer view)
        self.rules = rules
        self.dispatcher = dispatcher
        self.clock = clock
        self.node = socket.gethostname()
        self.view: DaemonView | None = None
        self.incidents = IncidentBook(config.resolve_after_s, config.open_after_s,
                                      config.group_interval_s, gate=self._may_open)
        # floods of fake jobs (publish/limits.py): a bucket of incidents and of
        # bundles per uid; boot-time seconds date when a job was last seen alive
        self.boottime = boottime
        self.incident_buckets = limits.Buckets(config.uid_incidents, config.uid_refill_s)
        self.stage_failures: dict[str, int] = collections.Counter()
        # incidents' bundles: written, held back per uid, retried, pruned
        self.evidence = Evidence(self.incidents, config, clock, self.stage_failures)
        self.alert_route = AlertRoute(config.peer_max_age_s)
        # owner key -> all the daemon knows of that job (watch/job.py)
        self.watched: dict[str, WatchedJob] = {}
        # the ranks' states read between ticks (observe/window/between.py)
        self.between = BetweenTicks(clock, glance_s=config.reading_s)
        self._requested: object = frozenset()  # this tick's stacks_requested
        self._survey = None  # the node as this tick's pass saw it (observe/sampler.py)
        self._progress: dict = {}  # this tick's live records: pid -> (collective seq, step)
        self.looks_kept = 0  # ticks that kept a steady job's last look (ddpwatch_looks_kept_total)
        # ranks seen ending, and jobs held after a rank's death took them away
        self.departures = Departures()
        self.label_budget = LabelBudget()  # ddp_job values per user (publish/label_budget.py)
        self.sampler = self._make_sampler(config)
        self._tick = 0
        # Set from the HTTP threads (GET /status?stacks=1, `request_stacks`): the
        # next tick dumps the stacks of the jobs the asker may see, suspicious or
        # not: ALL_JOBS, or a frozenset of owner uids. Replaced whole, never mutated.
        self.stacks_requested: object = frozenset()
        # the HTTP threads add to it while a tick takes it: one lock, or a request
        # made between the tick's read and its reset is lost
        self._requests_lock = threading.Lock()
        self._saved = None  # what incident_store last saved (a mark of it)
        self._persist_error = ""
        # helper programs found once, by absolute path, not through PATH per call
        missing = [n for n, p in programs.resolve_all().items() if p is None]
        if missing:
            log.warning("not found: %s (the probes that run them report it)",
                        ", ".join(missing))
        self._resume()

    def _resume(self) -> None:
        """Take up the incidents a previous daemon left in the state directory."""
        counter, open_, resolved, sending = incident_store.load(
            self.config.effective_state_dir())
        open_ = {k: i for k, i in open_.items() if i.owner == k}  # ours, or not used
        self.incidents.restore(counter, open_, resolved)
        self.alert_route.resume({i: j for i, j in sending.items()
                                 if any(inc.id == i for inc in open_.values())})
        self._saved = self._state_mark()[2]  # nothing new to write yet
        if open_:
            log.warning("resumed %d open incident(s) from %s: %s", len(open_),
                        incident_store.path_in(self.config.effective_state_dir()),
                        ", ".join(sorted(i.id for i in open_.values())))

    def _may_open(self, key: str, verdict: str) -> str:
        """IncidentBook's gate: "" to open `key`'s incident now, else why not."""
        watched = self.watched.get(key)
        # a job that only claims ranks (no record, no socket, never healthy);
        # without the sockets probe nothing could show one, so nothing is held
        if (watched is not None and not (watched.shown or watched.worked)
                and self.config.probe_on("sockets")):
            return "claims_only"
        if limits.too_young(verdict, limits.life_s(key, watched and watched.alive_at),
                            self.config.min_life_s, bool(watched and watched.worked)):
            return "young"
        if not self.incident_buckets.take(discovery.owner_uid(key), self.clock()):
            return "uid_rate"
        return ""

    def _probe_context(self, config: Config) -> ProbeContext:
        return ProbeContext(heartbeat_dir=config.heartbeat_dir or None, clock=self.clock,
                            timeout_s=config.probe_timeout_s)

    def _make_sampler(self, config: Config) -> Sampler:
        return Sampler(self._probe_context(config), config.probe_on,
                       config.stacks_min_interval_s, budgets=True)

    def reconfigure(self, config: Config, rules: list) -> None:
        """Swap config and rules between ticks (SIGHUP); history and incidents stay."""
        self.config, self.rules = config, rules
        self.incidents.resolve_after_s = config.resolve_after_s
        self.incidents.open_after_s = config.open_after_s
        self.incidents.group_interval_s = config.group_interval_s
        self.alert_route.grace_s = config.peer_max_age_s
        self.between.glance_s = config.reading_s
        if (config.uid_incidents, config.uid_refill_s) != (self.incident_buckets.burst,
                                                           self.incident_buckets.refill_s):
            self.incident_buckets = limits.Buckets(config.uid_incidents, config.uid_refill_s)
        self.evidence.reconfigure(config)
        self.sampler.reconfigure(self._probe_context(config), config.probe_on,
                                 config.stacks_min_interval_s)
        for watched in self.watched.values():
            watched.looked = None  # judged by the old rules: the next tick looks again

    def close(self) -> None:
        self.sampler.close()

    def request_stacks(self, uid: int | None = None) -> None:
        """A person asked for stacks (GET /status?stacks=1): the next tick dumps
        those of every job they may see: all of them for uid None (root, a
        token holder), else their own uid's (publish/viewer.py). A local user
        cannot make the daemon dump other users' ranks."""
        if uid is not None and uid < 0:
            return  # an asker who could not be told owns no job
        with self._requests_lock:
            wanted = self.stacks_requested
            if uid is None:
                self.stacks_requested = ALL_JOBS
            elif wanted is not ALL_JOBS:
                self.stacks_requested = frozenset(wanted) | {uid}

    # --- one tick ------------------------------------------------------------------
    def tick(self) -> DaemonView:
        started = self.clock()
        statuses = []
        self._kept_probes: list = []  # the kept looks' probe runs (DaemonView.kept_probes)
        jobs = self._guard("discovery", lambda: self._discover(statuses), [])
        with self._requests_lock:
            requested, self.stacks_requested = self.stacks_requested, frozenset()
        self._requested = requested
        # how far each rank had got by its record (watch/job.py steady)
        self._progress = progress_of(self._survey.heartbeats if self._survey else None)
        # Jobs are who owns them (uid, launcher); a run id is only their label
        # (two users' jobs may claim one: tests/unit/publish/test_hostile_unit.py)
        table = self._survey.table if self._survey is not None else {}
        views, owners = [], {}
        labels = self._guard("discovery", lambda: discovery.labels(jobs, table), {})
        live = []
        for job in jobs:
            owner, run_id = discovery.owner_key(job, table), discovery.job_key(job)
            label = self._watched(owner).name(labels.get(owner) or run_id, run_id)
            # a user's label values are bounded (publish/label_budget.py)
            live.append((owner, self.label_budget.label(owner, label, self.clock()), job))
        exits = self._survey.exits if self._survey is not None else None
        # only the jobs' ranks and launchers are asked about (departures.py)
        foreground = frozenset(pid for _, _, job in live
                               for pid in job.rank_pids + (job.launcher_pid,)
                               if pid in table and table[pid].foreground)
        judged = self._guard("departures", lambda: self.departures.update(
            live, exits, self.clock(), self._rank_numbers(), foreground), live)
        alive_at = self.boottime()
        for owner, _, job in judged:
            if job.rank_pids:
                self._watched(owner).alive_at = alive_at
        for owner, label, job in judged:
            view = self._guard("judge", lambda: self._judge_job(job, statuses, owner, label),
                               None)
            if view is not None:
                views.append(view)
                owners[owner] = view
        self._forget_vanished(set(owners))
        self._guard("incidents", lambda: self._incidents(owners), None)
        self._guard("bundle", lambda: self.evidence.retry(self._evidence_of,
                                                          self._record_dirs()), None)
        self._guard("bundle", self.evidence.prune, None)
        self._guard("persist", self._persist, None)
        self._tick += 1
        if self.between.failures:  # counted by the reading thread, published here
            self.stage_failures["between"] = self.between.failures
        views.sort(key=lambda v: (vocabulary.SEVERITY.index(v.judgement.job.verdict), v.key))
        self.view = DaemonView(
            node=self.node, tick=self._tick, wall_time=time.time(),
            tick_duration_s=round(self.clock() - started, 4), jobs=tuple(views),
            incidents=self.incidents.all(), probes=tuple(statuses),
            kept_probes=tuple(self._kept_probes),
            incidents_opened_total=dict(self.incidents.opened_total), ready=True,
            limits={"incidents_limited": dict(self.incidents.limited_total),
                    "bundles_limited": self.evidence.limited,
                    "bundles_pruned": dict(self.evidence.pruned)},
            peers=self.peers.views() if self.peers else (),
            alert_stats=self._guard("alerts", self.dispatcher.stats, None)
            if self.dispatcher is not None else None,
            alerting_jobs=self._alerting(),
            webhooks=self.dispatcher is not None, stage_failures=dict(self.stage_failures),
            stack_dumps=self.sampler.stack_dumps,
            left_out=self.sampler.left_out() | {"job_labels": self.label_budget.left_out},
            looks_kept=self.looks_kept)
        return self.view

    def _alerting(self) -> tuple:
        """(run id, owner uid) of the jobs this node sends webhooks for, told to its
        peers (publish/peers.py): a claim names whose job it is, not only its name."""
        return tuple(sorted({(self._run_id(i), discovery.owner_uid(i.owner))
                             for i in self.incidents.open() if self.alert_route.sending(i.id)}))

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

    def _discover(self, statuses: list) -> list:
        self._survey = self.sampler.survey(wire=True)  # ranks started by hand too
        statuses.extend(self._survey.probes)
        return self._per_user(self._survey.jobs())

    def _per_user(self, jobs: list) -> list:
        """At most MAX_JOBS_PER_UID jobs of each user but root are watched, their
        oldest first: every job costs the tick its reads, and any user can start
        hundreds (observe/budget.py; tests/hostile/test_hostile_second.py). What is left out
        is counted in ddpwatch_left_out_total{what="jobs"}."""
        table = self._survey.table
        keyed = [(discovery.owner_key(job, table), job) for job in jobs]
        kept, per_uid = [], collections.Counter()
        for key, job in sorted(keyed, key=lambda kj: (discovery.born_s(kj[0]) or 0.0, kj[0])):
            uid = discovery.owner_uid(key)
            if uid != 0 and per_uid[uid] >= MAX_JOBS_PER_UID:
                self.sampler.left_out_now("jobs")
                continue
            per_uid[uid] += 1
            kept.append(job)
        chosen = {id(job) for job in kept}
        return [job for job in jobs if id(job) in chosen]  # discovery's order

    def between_ticks(self, deadline: float, stop) -> None:
        """Until the next tick; the ranks' states are read meanwhile (the window's
        evidence) by a thread started on the first call (observe/window/between.py)."""
        self.between.start(stop, self._between_failed)
        stop.wait(max(0.0, deadline - self.clock()))

    @staticmethod
    def _between_failed() -> None:
        log.exception("reading the ranks between ticks failed")

    def _watched(self, key: str) -> WatchedJob:
        watched = self.watched.get(key)
        if watched is None:
            watched = self.watched[key] = WatchedJob(key, self.clock())
        return watched

    def _judge_job(self, job, statuses, key: str, label: str) -> JobView:
        """Look at a job as closely as it asks (watch/look.py), judge it over time
        (watch/job.py), and say what to publish. `key`: who the job is
        (discovery.owner_key), for the daemon's books; `label`: what it is called
        (the run id), for people, metrics and peers."""
        watched = self._watched(key)
        requested = self._requested is ALL_JOBS or discovery.owner_uid(key) in self._requested
        progress = {pid: self._progress.get(pid) for pid in job.rank_pids}
        now = self.clock()
        if not requested and watched.steady(job, progress, self.between.calm(key, job.rank_pids),
                                            now, self.config.steady_s):
            # a steady job keeps its last look (watch/job.py steady): no probe
            # runs for it and the readings go on into the next look's window;
            # its ranks' ends are still kept for the next surveys (exits probe)
            self.sampler.watch_ends(job)
            watched.progress = progress
            self.looks_kept += 1
            self._kept_probes.extend(watched.looked.last.probes)
            return self._published(watched, watched.looked.judgement, watched.looked.last,
                                   key, label, requested)
        # the peer view: this job's ranks on other nodes, as their daemons see them:
        # by the run id they know it by and its owner (observe/peers.py)
        remote = (self.peers.remote_signals(watched.run_id or label, discovery.owner_uid(key))
                  if self.peers else ())

        def sample(how):
            snap = self.sampler.sample(job, self._survey, how, watched.stacks)
            statuses.extend(snap.probes)
            return snap

        def closer(last, force):
            snap = self.sampler.look_closer(last, self._survey, watched.stacks, force_stacks=force)
            statuses.extend(snap.probes[len(last.probes):])
            return snap

        def judge(history):
            nonlocal remote
            judgement, remote = self._judge(key, history, remote)
            return judgement
        judgement, last = look.look(
            watched, self.between.take(key, job.rank_pids), look.Eyes(sample, closer, judge),
            requested=requested, gone=not job.rank_pids and bool(job.departed_pids),
            now=now, window_s=self.config.window_s)
        watched.looked = Looked(judgement, last, now, job)
        watched.progress = progress
        return self._published(watched, judgement, last, key, label, requested)

    def _published(self, watched: WatchedJob, judgement, last, key: str, label: str,
                   requested: bool) -> JobView:
        """The job's look judged over time, as this tick publishes it."""
        # the job's past as signals, judged by the same rules (watch/overtime.py)
        judgement, over = watched.over_time(judgement, self.clock(), time.time(), self.config,
                                            self.rules)
        watched.worked |= judgement.job.verdict == "healthy"
        watched.shown = watched.shown or limits.shows_a_job(last)
        # read healthy jobs' main threads now and then, the others' every thread often
        self.between.watch(key, closely=judgement.job.verdict != "healthy" or requested)
        view = JobView(label, judgement, last, over, owner=key, run_id=watched.run_id or label)
        watched.view = view
        return view

    def _judge(self, key: str, history, remote: tuple) -> tuple:
        """(judgement, the remote signals it used). A peer's answer that breaks the
        judgement (another ddpwatch version's signals, say) is dropped for this
        job rather than let it hide the job's own ranks."""
        if remote:
            try:
                return classify.judge(history, self.rules, remote), remote
            except Exception as err:
                self.stage_failures["peer_signals"] += 1
                log.warning("job %s: judging with the peers' ranks failed (%r); judged "
                            "without them", key, err)
        return classify.judge(history, self.rules), ()

    def _rank_numbers(self) -> dict[str, dict[int, int]]:
        """owner key -> {pid: rank} as last judged (the rank of a rank that ends
        next, from whatever evidence named it)."""
        return {key: {r.pid: r.rank for r in w.view.judgement.ranks if not r.remote}
                for key, w in self.watched.items() if w.view is not None}

    def _forget_vanished(self, keys: set) -> None:
        """Jobs not judged this tick are forgotten: their WatchedJob, and what the
        between-ticks reader kept of them (its own thread reads them: observe/window/between.py)."""
        gone = set(self.watched) - keys
        for key in gone:
            del self.watched[key]
        self.between.forget(gone)
        self.label_budget.forget(gone)

    def _incidents(self, by_key: dict) -> None:
        """by_key: owner key -> this tick's JobView."""
        verdicts = {k: (v.judgement.job.verdict, v.judgement.job.culprits,
                        v.judgement.job.summary) for k, v in by_key.items()}
        labels = {k: v.key for k, v in by_key.items()}
        quiet = vocabulary.CALM | vocabulary.HELD
        for k, (verdict, culprits, _) in verdicts.items():
            watched = self.watched[k]
            was, watched.logged = watched.logged, verdict
            # the journal's story: into and out of trouble, not a healthy job's
            # every pause and slow spell (seconds apart on a busy node)
            if was != verdict and not (was in quiet | {"none"} and verdict in quiet):
                log.info("job %s: %s -> %s culprits=%s", labels[k], was, verdict,
                         list(culprits))
        news = set()  # incidents opened or changed this tick
        for event in self.incidents.update(verdicts, time.time(), labels):
            incident = event.incident
            log.warning("incident %s %s: %s culprits=%s", incident.id, event.kind,
                        incident.verdict, list(incident.culprits))
            if event.kind in ("opened", "changed") and event.evidence:
                self.evidence.write(incident, by_key[incident.owner],
                                    self.watched[incident.owner].history, self._record_dirs())
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

    def _record_dirs(self) -> tuple[str, ...]:
        """The record directories a bundle copies records from: the config's and
        those the ranks named this tick."""
        return record_dirs(self.config.heartbeat_dir or None,
                           self._survey.record_dirs if self._survey is not None else ())

    def _persist(self) -> None:
        """Save the incidents when they changed (publish/incident_store.py)."""
        state, sending, mark = self._state_mark()
        if mark == self._saved:
            return
        try:
            incident_store.save(self.config.effective_state_dir(), state, sending)
        except OSError as err:  # a full disk, say: tried again next tick
            self.stage_failures["persist"] += 1
            if str(err) != self._persist_error:
                log.warning("incidents not saved to %s (%s); retried each tick",
                            self.config.effective_state_dir(), err)
            self._persist_error = str(err)
            return
        self._saved, self._persist_error = mark, ""

    def _state_mark(self):
        state = self.incidents.state()
        sending = self.alert_route.sent_from_here()
        return state, sending, (state["counter"], tuple(sorted(state["open"].items())),
                                tuple(i.id for i in state["resolved"]),
                                tuple(sorted(sending.items())))

    def _send(self, incident) -> None:
        if self.dispatcher is not None:
            self._guard("alerts", lambda: self.dispatcher.submit(
                alert_for(incident, self.node, self.status_url(),
                          self.base_url() + incident_path(incident.id))), None)

    def base_url(self) -> str:
        """Where people reach this daemon: the config's external_url, else the
        address it listens on (loopback helps only someone on this node)."""
        if self.config.external_url:
            return self.config.external_url.rstrip("/")
        host, port = self.config.host_port
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    def status_url(self) -> str:
        return self.base_url() + "/status"


__all__ = ["Daemon", "load_rules"]
