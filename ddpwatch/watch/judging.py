"""One tick's look at each watched job, as `ddpwatch run` takes it: steady jobs
keep their last look (watch/job.py `steady`), the others are looked at as
closely as they ask (watch/look.py), with their ranks on other nodes (the peer
view, observe/peers.py), then judged over time (watch/job.py `over_time`).
What the tick knows is a `Tick`, passed along; what is kept of a job between
ticks is its WatchedJob's."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from ..judge import classify
from ..observe.jobs import discovery
from ..publish.view import JobView
from ..publish.viewer import asked_for
from . import look
from .job import Looked, WatchedJob

log = logging.getLogger("ddpwatch")


@dataclass
class Tick:
    """What one tick knows, passed along its stages (daemon.py `tick`)."""
    survey: object = None  # the node as this tick's pass saw it (observe/sampler.py)
    requested: object = frozenset()  # publish/viewer.py StackRequests.take
    progress: dict = field(default_factory=dict)  # pid -> (collective seq, step) by record
    statuses: list = field(default_factory=list)  # the probe runs of this tick's looks
    kept_probes: list = field(default_factory=list)  # the kept looks' (DaemonView.kept_probes)


class Judging:
    """`sampler`: the daemon's (observe/sampler.py); `gate`: publish/limits.py
    Gate, told what each judgement showed; `failures`: the daemon's stage
    failures (a peer answer that broke judging counts "peer_signals");
    `clock`: the daemon's."""

    def __init__(self, sampler, gate, failures: dict, clock):
        self.sampler, self.gate, self.failures, self.clock = sampler, gate, failures, clock
        self.looks_kept = 0  # ticks that kept a steady job's last look (ddpwatch_looks_kept_total)

    def job(self, watched: WatchedJob, job, now: Tick, label: str, config, rules,
            peers) -> JobView:
        """Look at a job as closely as it asks, judge it over time, and say what
        to publish. `watched.key`: who the job is (discovery.owner_key), for the
        daemon's books; `label`: what it is called (the run id), for people,
        metrics and peers. `peers`: the PeerPoller, or None."""
        key = watched.key
        requested = asked_for(now.requested, key)
        progress = {pid: now.progress.get(pid) for pid in job.rank_pids}
        at = self.clock()
        if not requested and watched.steady(job, progress, watched.readings.calm(job.rank_pids),
                                            at, config.steady_s):
            # a steady job keeps its last look (watch/job.py steady): no probe
            # runs for it and the readings go on into the next look's window;
            # its ranks' ends are still kept for the next surveys (exits probe)
            self.sampler.watch_ends(job)
            watched.progress = progress
            self.looks_kept += 1
            now.kept_probes.extend(watched.looked.last.probes)
            return self._published(watched, watched.looked.judgement, watched.looked.last,
                                   label, requested, config, rules)
        # the peer view: this job's ranks on other nodes, as their daemons see them:
        # by the run id they know it by and its owner (observe/peers.py)
        remote = (peers.remote_signals(watched.run_id or label, discovery.owner_uid(key))
                  if peers else ())

        def sample(how):
            snap = self.sampler.sample(job, now.survey, how, watched.stacks)
            now.statuses.extend(snap.probes)
            return snap

        def closer(last, force):
            snap = self.sampler.look_closer(last, now.survey, watched.stacks, force_stacks=force)
            now.statuses.extend(snap.probes[len(last.probes):])
            return snap

        def judge(history):
            nonlocal remote
            judgement, remote = self.judge(key, history, rules, remote)
            return judgement
        judgement, last = look.look(
            watched, watched.readings.take(job.rank_pids), look.Eyes(sample, closer, judge),
            requested=requested, gone=not job.rank_pids and bool(job.departed_pids),
            now=at, window_s=config.window_s)
        watched.looked = Looked(judgement, last, at, job)
        watched.progress = progress
        return self._published(watched, judgement, last, label, requested, config, rules)

    def _published(self, watched: WatchedJob, judgement, last, label: str, requested: bool,
                   config, rules) -> JobView:
        """The job's look judged over time, as this tick publishes it."""
        # the job's past as signals, judged by the same rules (watch/overtime.py)
        judgement, over = watched.over_time(judgement, self.clock(), time.time(),
                                            config, rules)
        self.gate.saw(watched, judgement.job.verdict, last)
        # read healthy jobs' main threads now and then, the others' every thread often
        watched.readings.watch(closely=judgement.job.verdict != "healthy" or requested)
        view = JobView(label, judgement, last, over, owner=watched.key,
                       run_id=watched.run_id or label)
        watched.view = view
        return view

    def judge(self, key: str, history, rules, remote: tuple) -> tuple:
        """(judgement, the remote signals it used). A peer's answer that breaks the
        judgement (another ddpwatch version's signals, say) is dropped for this
        job rather than let it hide the job's own ranks."""
        if remote:
            try:
                return classify.judge(history, rules, remote), remote
            except Exception as err:
                self.failures["peer_signals"] += 1
                log.warning("job %s: judging with the peers' ranks failed (%r); judged "
                            "without them", key, err)
        return classify.judge(history, rules), ()
