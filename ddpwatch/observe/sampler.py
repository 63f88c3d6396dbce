"""One way to look at jobs, for the daemon's ticks and `diagnose` alike: which
probes run when, run them, and make the Snapshot.

A pass starts with `survey()`, which reads the process table and runs the node
probes (what is shared by every job on the node: the heartbeat records, the
connection attempts on the wire, the host, the ranks' exits), then
`sample(job, survey, look)` looks at one job as closely as asked. When each
probe runs is in its registration (probes/__init__.py `register(...)`: a node
probe's stage, a job probe's look), like node_exporter's `registerCollector`;
the sampler honours it and the probes' on/off switches. The probes' objects,
made once per Sampler, keep what they learn between passes; the sampler keeps
the pass's budget and the job probes' rate limits.
"""
from __future__ import annotations

import collections
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

from .jobs import discovery, tcp_discovery
from .probes import (REGISTRY, Look, Pass, Probe, ProbeContext, ProbeSpec, job_probes,
                     load_all, make_all, node_probes, run_probe)
from .budget import PassBudget
from .snapshot import SNAPSHOT_VERSION, ProbeStatus, Snapshot, status_of
from .jobs.job import Job

# py-spy runs one pass may start, over all jobs (a person's request excepted):
# every local user can start processes that look like suspicious ranks, and
# each would cost a py-spy run every stacks_min_interval_s (65 runs per
# 10 s). Jobs past the budget get theirs on a later pass.
MAX_DUMPS_PER_PASS = 8
# A person's request (/status?stacks=1) is not held to that, but to this: the
# request comes at most every stacks_min_interval_s from anyone, and each forced
# job costs a py-spy run per rank: a user's hundred fake jobs must not turn one
# request into hundreds of runs (tests/hostile/test_hostile_surface.py).
MAX_FORCED_DUMPS_PER_PASS = 32


@dataclass(frozen=True)
class Survey:
    """What one pass saw of the whole node."""
    table: dict                    # pid -> discovery.ProcInfo
    # the node probes' readings by Snapshot field ("heartbeats": a HeartbeatObs,
    # "host": the facts of the last minute...); None: it failed, or is off
    readings: dict
    record_dirs: tuple[str, ...]   # directories the ranks named (DDPWATCH_DIR)
    probes: tuple[ProbeStatus, ...]
    procfs: str = "/proc"
    # every job on the node when the pass grouped lone ranks on the wire too
    # (survey(wire=True), the daemon's); None: discovery's alone, on demand
    found: tuple[Job, ...] | None = None

    @property
    def heartbeats(self):
        """The records (probes.heartbeats.HeartbeatObs): discovery finds jobs by them."""
        return self.readings.get("heartbeats")

    @property
    def exits(self):
        """The watched pids' ends (probes.exits.Exits): the daemon's departed ranks."""
        return self.readings.get("exits")

    @property
    def live_record_pids(self) -> frozenset[int]:
        if self.heartbeats is None:
            return frozenset()
        return frozenset(r.pid for r, alive in zip(self.heartbeats.records,
                                                   self.heartbeats.alive) if alive)

    def jobs(self) -> list[Job]:
        if self.found is not None:
            return list(self.found)
        return discovery.all_jobs(self.table, self.live_record_pids)

    def job_of(self, pid: int) -> Job | None:
        """The job of `pid`; a lone rank started by hand with its peers found on
        the wire (observe/jobs/tcp_discovery.py): only for a person's request, it reads
        the sockets of every Python process of the rank's user."""
        job = discovery.find_job(pid, self.table, self.live_record_pids)
        return tcp_discovery.extend(job, self.table, self.procfs) if job is not None else None


@dataclass
class KeptStacks:
    """One job's last stack dump, kept between looks by whoever watches the job
    (watch/job.py WatchedJob.stacks): when it was taken, the dump, and each
    rank's (seq, step) then (`still_current`)."""
    taken_at: float = -1e18
    stacks: object = None
    progress: dict = field(default_factory=dict)


class Sampler:
    """Keeps the probes' objects (each keeps what it learns: the packet capture,
    a peer's connects retry seconds apart; the host facts; the records of gone
    writers) and the process table it learns (jobs/proctable.py). A job's last
    stack dump is its watcher's (`KeptStacks`), handed in with each look."""

    def __init__(self, ctx: ProbeContext, enabled: Callable[[str], bool] = lambda name: True,
                 stacks_min_interval_s: float = 0.0, keep_caches: bool = True,
                 budgets: bool = False, options: dict[str, dict] | None = None):
        """`options`: the probes' construction options, by name (diagnose --native:
        {"stacks": {"native": True}}). Without `keep_caches`, nothing learned of
        processes is kept between passes: command lines, gone writers' records,
        lone ranks' torch."""
        load_all()
        self.ctx = ctx
        # a PassBudget per pass (observe/budget.py): the daemon's, beside other users
        self.budgets = budgets
        self._budget: PassBudget | None = None
        self._left_out: collections.Counter = collections.Counter()  # earlier passes'
        self.enabled = enabled
        self.stacks_min_interval_s = stacks_min_interval_s
        # the process table, learned across passes (jobs/proctable.py); without
        # caches every pass reads every process
        self._tables = discovery.TableReader(ctx.procfs, ctx.clock) if keep_caches else None
        self._writers: frozenset[int] = frozenset()  # the last pass's live record pids
        options = dict(options or {})
        if not keep_caches:
            options["heartbeats"] = {"keep_dead": False, **options.get("heartbeats", {})}
            options["wire_groups"] = {"keep": False, **options.get("wire_groups", {})}
        self._probes: dict[str, Probe] = make_all(options)
        for name, probe in self._probes.items():
            probe.switch(ctx, enabled(name))
        # pids of the ranks and launchers sampled since the last survey: the node
        # probes that ask (ProbeSpec.sampled_pids: whose exits are kept) get them
        self._sampled: set[int] = set()
        self._dumps_left = MAX_DUMPS_PER_PASS
        self._forced_left = MAX_FORCED_DUMPS_PER_PASS
        self.stack_dumps = 0  # py-spy runs since start (ddpwatch_stack_dumps_total)

    def reconfigure(self, ctx: ProbeContext, enabled: Callable[[str], bool],
                    stacks_min_interval_s: float) -> None:
        """New settings (SIGHUP); a probe keeps what it holds while it stays on
        (the capture stays open while traffic stays on)."""
        for name, probe in self._probes.items():
            probe.switch(ctx, enabled(name))
        self.ctx, self.enabled = ctx, enabled
        self.stacks_min_interval_s = stacks_min_interval_s
        if self._tables is not None and self._tables.procfs != ctx.procfs:
            self._tables = discovery.TableReader(ctx.procfs, ctx.clock)

    def close(self) -> None:
        for probe in self._probes.values():
            probe.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def probe(self, name: str) -> Probe:
        """A probe's object (diagnose moves the traffic probe's capture)."""
        return self._probes[name]

    # --- the node --------------------------------------------------------------------
    def survey(self, wire: bool = False) -> Survey:
        """The node as it is now; with `wire`, every job on it, lone ranks started
        by hand grouped by their connections too (the "jobs" stage: wire_groups)."""
        ctx, statuses = self.ctx, []
        self._dumps_left = MAX_DUMPS_PER_PASS
        self._forced_left = MAX_FORCED_DUMPS_PER_PASS
        if self.budgets:
            if self._budget is not None:
                self._left_out.update(self._budget.left_out)
            self._budget = PassBudget()
        table = (self._tables.read(self._writers) if self._tables is not None
                 else discovery.read_table(ctx.procfs))
        seen = Pass(table, discovery.heartbeat_dirs(table, ctx.procfs), self._budget)
        sampled, self._sampled = tuple(sorted(self._sampled)), set()
        readings = {spec.snapshot_field: self._node(spec, seen, sampled, statuses)
                    for spec in node_probes("records") + node_probes("node")}
        survey = Survey(table, readings, seen.record_dirs, tuple(statuses), ctx.procfs)
        self._writers = survey.live_record_pids
        return self._with_found_jobs(survey, seen) if wire else survey

    def _node(self, spec: ProbeSpec, seen: Pass, sampled: tuple[int, ...], statuses: list):
        """Node probe `spec`'s reading this pass: run when on (one that cannot be
        switched off always is) and due, else (or when it failed) what it kept."""
        probe = self._probes[spec.name]
        on = self.enabled(spec.name) or not spec.switchable
        if on and probe.due(self.ctx.clock()):
            result = run_probe(probe, self.ctx, seen, sampled if spec.sampled_pids else ())
            statuses.append(status_of(result))
            if result.ok:
                return result.data
        return probe.kept()

    def _with_found_jobs(self, survey: Survey, seen: Pass) -> Survey:
        jobs, statuses = tuple(survey.jobs()), []
        for spec in node_probes("jobs"):
            if not self.enabled(spec.name):
                continue
            # A rank alone in its job (no launcher, nothing of its peers in its
            # environment) may be one of a group only the wire shows: Ray Train's
            # workers under DDPWATCH_AUTO=1 write records, so discovery finds each,
            # alone (tests/thirdparty/test_ray_jobs.py). Left unclaimed, the wire groups them.
            alone = {job.rank_pids[0] for job in jobs if len(job.rank_pids) == 1
                     and job.launcher_pid <= 0 and job.launcher_kind == "none"}
            claimed = {pid for job in jobs for pid in job.rank_pids + (job.launcher_pid,
                                                                        job.target_pid)} - alone
            result = run_probe(self._probes[spec.name], self.ctx, seen, tuple(sorted(claimed)))
            status = status_of(result)
            if result.ok and result.data.note:  # a bound left processes out: partly blind
                status = dataclasses.replace(status, ok=False, error=result.data.note)
            statuses.append(status)
            grouped = result.data.jobs if result.ok else ()
            in_groups = {pid for job in grouped for pid in job.rank_pids}
            jobs = tuple(job for job in jobs if not set(job.rank_pids) & in_groups) + grouped
        return dataclasses.replace(survey, probes=survey.probes + tuple(statuses), found=jobs)

    # --- one job ---------------------------------------------------------------------
    def sample(self, job: Job, survey: Survey, look: Look, kept: KeptStacks | None = None,
               force_stacks: bool = False) -> Snapshot:
        """A snapshot of `job` looked at as closely as `look` asks (Look.STACKS:
        through `look_closer`, see there for `kept` and `force_stacks`). Which job
        probes run is their registration's policy (probes/__init__.py ProbeSpec)."""
        self.watch_ends(job)
        seen = self._pass(survey, look)
        # An orphan rank's finding needs its listening sockets, and a job without
        # heartbeats has nothing but what the probes see: such jobs are "silent"
        table = survey.table
        silent = (any(pid in table and table[pid].ppid == 1 for pid in job.rank_pids)
                  or not set(job.rank_pids) & survey.live_record_pids)
        results, specs = [], job_probes()
        for spec in specs:
            start = spec.sooner_if_silent if silent and spec.sooner_if_silent is not None \
                else spec.look
            later = spec.budgeted or (spec.again_at is not None and look >= spec.again_at)
            if start <= look and not later and self.enabled(spec.name):
                results.append(run_probe(self._probes[spec.name], self.ctx, seen,
                                         _pids_for(spec, job)))
        data = {spec.snapshot_field: None for spec in specs}
        data.update({REGISTRY[r.name].snapshot_field: (r.data if r.ok else None)
                     for r in results})
        snap = Snapshot(
            version=SNAPSHOT_VERSION, taken_at=self.ctx.clock(), wall_time=time.time(), job=job,
            probes=tuple(status_of(r) for r in results), **_node_for_job(survey, job, data),
            **data)
        return self.look_closer(snap, survey, kept, force_stacks) if look >= Look.STACKS else snap

    def watch_ends(self, job: Job) -> None:
        """Keep the ends of `job`'s processes that the next surveys see (the
        exits probe keeps those of the pids sampled in the last two passes):
        `sample` does, and so must a tick that keeps a steady job's last look
        (daemon.py), or a rank killed then is never known to have died."""
        pids = job.rank_pids + ((job.launcher_pid,) if job.launcher_pid > 0 else ())
        # departed ranks too: a held job's rank may still be ending (Lightning's rank
        # 0 alone is no job to discovery, and may end seconds after its peer's
        # death); an end not seen leaves the job's first death unknown
        # (judge/signals/exits.py link)
        self._sampled.update(pids + job.departed_pids)

    def look_closer(self, snap: Snapshot, survey: Survey, kept: KeptStacks | None = None,
                    force_stacks: bool = False) -> Snapshot:
        """`snap` with what only suspicion or a person's request pays for: the
        budgeted probes (the ranks' stacks) and the probes that see more at
        Look.STACKS (the sockets' byte counts and idle times, `ss -ti`).
        Budgeted probes run at most every `stacks_min_interval_s` per job (its
        `kept`: watch/job.py WatchedJob.stacks; None: no earlier dump, diagnose's)
        (py-spy costs the ranks) unless `force_stacks`; in between, the last dump
        stands for the ranks that have not moved since."""
        kept = kept if kept is not None else KeptStacks()
        seen = self._pass(survey, Look.STACKS)
        results, fields = [], {}
        for spec in job_probes():
            if not self.enabled(spec.name):
                continue
            if spec.budgeted:
                fields[spec.snapshot_field] = self._budgeted(
                    spec, seen, _pids_for(spec, snap.job), survey, kept, force_stacks, results)
            elif spec.again_at is not None and spec.again_at <= Look.STACKS:
                result = run_probe(self._probes[spec.name], self.ctx, seen,
                                   _pids_for(spec, snap.job))
                results.append(result)
                if result.ok:
                    fields[spec.snapshot_field] = result.data
        data = {spec.snapshot_field: getattr(snap, spec.snapshot_field)
                for spec in job_probes()} | fields
        return dataclasses.replace(
            snap, **fields, probes=snap.probes + tuple(status_of(r) for r in results),
            **_node_for_job(survey, snap.job, data))

    def _pass(self, survey: Survey, look: Look) -> Pass:
        # discovery has just read every parent, command line and environment
        return Pass(survey.table, survey.record_dirs, self._budget, look)

    def listed_proc(self) -> bool:
        """Whether the last survey listed /proc (jobs/proctable.py TableReader;
        benchmarks/daemon.py counts the ticks that did)."""
        return bool(self._tables is not None and self._tables.listed)

    def processes_read(self) -> int:
        """How many processes the last survey read (benchmarks/daemon.py)."""
        return self._tables.reads if self._tables is not None else 0

    def left_out_now(self, what: str, n: int = 1) -> None:
        """Something this pass left out by a caller's bound (the daemon's jobs)."""
        if self._budget is not None:
            self._budget.count(what, n)
        else:
            self._left_out[what] += n

    def left_out(self) -> dict[str, int]:
        """What the passes' budgets refused, since start, by kind
        (`ddpwatch_left_out_total{what}`)."""
        total = collections.Counter(self._left_out)
        if self._tables is not None and self._tables.set_aside_total:
            total["processes"] += self._tables.set_aside_total
        if self._budget is not None:
            total.update(self._budget.left_out)
        return dict(total)

    def _budgeted(self, spec, seen, pids, survey, kept: KeptStacks, force, results):
        now = progress_of(survey.heartbeats)
        stacks, then = kept.stacks, kept.progress
        due = self.ctx.clock() - kept.taken_at >= self.stacks_min_interval_s
        forced = force and self._forced_left > 0
        if forced or (due and self._dumps_left >= min(len(pids), MAX_DUMPS_PER_PASS)):
            result = run_probe(self._probes[spec.name], self.ctx, seen, pids)
            results.append(result)
            if result.ok:
                runs = sum(p.status in ("ok", "error") for p in result.data.pids)
                self.stack_dumps += runs
                self._dumps_left -= runs
                if forced:
                    self._forced_left -= runs
                kept.taken_at, kept.stacks, kept.progress = self.ctx.clock(), result.data, now
                return result.data
        return still_current(stacks, then, now) if stacks is not None else None


def _node_for_job(survey: Survey, job: Job, data: dict) -> dict:
    """The node probes' readings as `job`'s snapshot keeps them (ProbeSpec.for_job:
    the connection attempts to its sockets' ports in `data`, its ranks' exits)."""
    out = {}
    for spec in node_probes("records") + node_probes("node"):
        reading = survey.readings.get(spec.snapshot_field)
        keep = spec.for_job if spec.for_job is not None and reading is not None else None
        out[spec.snapshot_field] = keep(reading, job, data) if keep else reading
    return out


def _pids_for(spec, job: Job) -> tuple[int, ...]:
    """The pids a job probe looks at: the ranks (with the launcher if its policy
    asks); a budgeted probe of a job with no ranks yet looks at its launcher."""
    launcher = (job.launcher_pid,) if job.launcher_pid > 0 else ()
    if spec.with_launcher:
        return job.rank_pids + launcher
    return (job.rank_pids or launcher) if spec.budgeted else job.rank_pids


def progress_of(heartbeats) -> dict[int, tuple[int, int]]:
    """pid -> (collective seq, step) from a heartbeat probe's records: how far each
    rank had got when they were read."""
    if heartbeats is None:
        return {}
    # Live writers' records last, so they win over an old record under a reused pid.
    pairs = sorted(zip(heartbeats.records, heartbeats.alive), key=lambda pair: pair[1])
    return {r.pid: (r.collective_seq, r.step) for r, _ in pairs}


def still_current(stacks, progress_then: dict, progress_now: dict):
    """The dumps of earlier stacks (py-spy is rate-limited) that still describe
    their ranks. A rank whose heartbeat moved on since is elsewhere now: judged by
    the old dump it would be, say, waiting at rendezvous at step 22. Such dumps
    are left out (that rank's stack is then unknown); a rank without a record
    keeps its dump, as nothing says it moved."""
    kept = tuple(d for d in stacks.pids if progress_then.get(d.pid) == progress_now.get(d.pid))
    return stacks if len(kept) == len(stacks.pids) else dataclasses.replace(stacks, pids=kept)
