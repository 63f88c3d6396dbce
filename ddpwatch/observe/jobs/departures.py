"""Ranks that ended while their job was watched, and jobs held after a death.

Discovery sees only live processes: a rank that died is no longer in its job,
and a job whose ranks all ended (mp.spawn and Lightning end the whole job within
a second of one rank's SIGKILL) is no longer on the node at all. With the exits
probe the daemon knows how and when each ended. `Departures` keeps that in the
jobs it judges:
* a live job's ranks that ended since the last tick stay in it as departed
  ranks (Job.departed_pids), judged dead with their exit;
* a job that vanished because a rank (or its launcher) ended abnormally (a
  signal, a non-zero code) is held as it was last seen, every rank departed,
  for HOLD_S: long enough to be judged on a few ticks, open its incident, send
  its webhook and write its bundle. A job whose ranks all exited 0 just ended;
  one whose first abnormal end was a stop request (Ctrl-C's SIGINT to the
  whole group, SIGTERM from `kill` or scancel), or whose every rank ended by
  one signal at once (a `kill -9` of its process group), was stopped: neither
  is held. Nor is a job run in a terminal's foreground whose ranks all ended
  within CTRL_C_S without a crash or an OOM kill: Ctrl-C there reaches every
  rank, and a trainer that handles it (Lightning: "Detected KeyboardInterrupt,
  attempting graceful shutdown", then SIGKILL to its other ranks and exit 1)
  ends no differently from one whose rank died. The person at that terminal
  saw either happen.
A stop request reaches the whole job: the launcher (which forwards it) or every
rank at once. One rank sent SIGTERM alone (earlyoom and systemd-oomd pick the
biggest process; a `kill` of one pid) ends the same way, and the launcher then
SIGTERMs the others (torchrun: within 0.1 s). Where the exits probe watches who
sends stop signals (observe/system/tracefs.py), a rank's stop signal counts as
its job's stop only when its sender is of the job (a launcher forwarding) or
also signalled the launcher or every other rank within STOP_TOGETHER_S; a rank
signalled alone died, and its job is held (`_stopped_by_request`). Unwatched,
any stop signal first reads as the job stopped.
Bounded by the jobs the daemon watches. Pure but for what it is handed: each
tick's jobs and exits, and each watched job's `Ends` (its WatchedJob's).
"""
from __future__ import annotations

import dataclasses
import logging

from ..probes.exits import signal_name
from .job import Job

log = logging.getLogger("ddpwatch.departures")

HOLD_S = 30.0  # how long a job gone with a rank's death stays judged
WHOLE_S = 0.5  # every rank ended by one signal within this: the job was killed whole
CTRL_C_S = 3.0  # a terminal job's ranks all ended within this: stopped there
# signals of a crash, never of a person's stop
CRASH_SIGNALS = frozenset({4, 6, 7, 8, 11})  # SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV
STOP_TOGETHER_S = 2.0  # one stop request's signals to a job's processes fall within this


def _job_pids(job: Job) -> set[int]:
    return set(job.rank_pids + job.departed_pids) | (
        {job.launcher_pid} if job.launcher_pid > 0 else set())


def _stopped_by_request(job: Job, first, exits) -> tuple[bool | None, str]:
    """Whether the first abnormal end was the job being stopped (None: unknown,
    its sender unseen and its end no stop signal), and why (for the log).
    Unwatched senders: an end by a stop signal is a stop. Watched: a stop signal
    sent to it (the end may be its handler's exit code) counts when its sender
    is of the job or also asked the launcher or every rank."""
    sent = exits.stop_sent_to(first) if exits is not None and exits.traced else None
    if sent is None:
        if first.asked_to_stop:
            return True, f"pid {first.pid} was asked to stop ({_how(first)})"
        return None, ""
    asked = f"{signal_name(sent.signal)} to pid {first.pid}"
    if sent.sender in _job_pids(job):
        return True, f"{asked} came from its own job's {sent.by}"
    if _leads(job, first, exits):
        # the process a person started, which started the other ranks (Lightning's
        # rank 0 has no launcher above it): a stop of it is a stop of the job
        return True, f"{sent.by} sent {asked}, the parent of the job's other ranks"
    near = {s.target for s in exits.sent if s.sender == sent.sender
            and abs(s.at - sent.at) <= STOP_TOGETHER_S}
    if job.launcher_pid in near or set(job.rank_pids + job.departed_pids) <= near:
        return True, (f"{sent.by} asked the whole job to stop ({signal_name(sent.signal)} to "
                      f"{'its launcher' if job.launcher_pid in near else 'every rank'})")
    return False, f"{sent.by} sent {asked} alone ({_how(first)})"


def _abnormal(job: Job, e, exits) -> bool:
    """Ended by a signal or a non-zero code, or by its own exit after a stop
    signal from outside the job (`stopped_from_outside`)."""
    if e.abnormal:
        return True
    return stopped_from_outside(job, e, exits)


def stopped_from_outside(job: Job, e, exits) -> bool:
    """`e` (an exit 0) came after a stop signal (SIGHUP, SIGINT, SIGTERM) sent to
    it from outside its job, and it is not the job's first process: a trainer
    that handles the signal ends as if it had finished, and its peers then fail.
    mp.spawn's worker wrapper turns a KeyboardInterrupt into exit code 0;
    Lightning raises SIGTERMException, a SystemExit without a code, at its next
    step (benchmarks/faults.yaml terminate/lightning: rank 1 exited 0 and the
    daemon named rank 0, which failed a second later with code 1). Whether that
    stop was the whole job's is `_stopped_by_request`'s to say.
    judge/signals/exits.py counts it abnormal too."""
    sent = exits.stop_sent_to(e) if exits is not None and exits.traced else None
    return sent is not None and sent.sender not in _job_pids(job) and not _leads(job, e, exits)


def _leads(job: Job, e, exits) -> bool:
    """`e`'s process started the job's other ranks (Lightning's rank 0): it is
    their parent at their ends, or it passed a stop signal on to every other
    rank, as a launcher forwards one. The second is what is left when it ended
    first: its ranks were then another's children at their ends (Lightning's
    rank 0 SIGTERMed exits 0 before rank 1, which it sent SIGTERM;
    benchmarks/faults.yaml job-stopped/lightning paged before this)."""
    mine = _job_pids(job)
    if e.pid in exits.parents(mine):
        return True
    others = set(job.rank_pids + job.departed_pids) - {e.pid}
    relayed = {s.target for s in exits.sent if s.sender == e.pid and s.target != e.pid}
    return bool(others) and others <= relayed


def _killed_whole(job: Job, ended: dict, first) -> bool:
    """Every rank of the job (and its launcher, if its end was seen) ended by the
    first one's signal within WHOLE_S: a `kill -9` of the process group, a
    scheduler's or a container's stop, not one rank's death that took the others
    down (they then end by another signal or an exit code, later)."""
    ranks = job.rank_pids + job.departed_pids
    if not first.signal or not ranks or any(p not in ended for p in ranks):
        return False
    seen = [ended[p] for p in ranks + (job.launcher_pid,) if p in ended]
    return all(e.signal == first.signal and e.at - first.at <= WHOLE_S for e in seen)


def _stopped_at_terminal(job: Job, ended: dict, died: list) -> bool:
    """Every rank of a job in a terminal's foreground ended within CTRL_C_S of
    the first end, none by a crash signal or the OOM killer: how Ctrl-C ends a
    trainer that catches KeyboardInterrupt."""
    ranks = job.rank_pids + job.departed_pids
    if not ranks or any(p not in ended for p in ranks):
        return False
    ends = [ended[p] for p in ranks]
    first = min(e.at for e in ends)
    return (all(e.at - first <= CTRL_C_S for e in ends)
            and not any(e.signal in CRASH_SIGNALS or (e.signal == 9 and e.oom_kills)
                        for e in died))


def _how(e) -> str:
    return f"signal {e.signal}" if e.signal else f"code {e.code}"


def _why_not_held(ended: dict, died: list, stopped: bool | None, why: str) -> str:
    if not died:
        seen = ", ".join(f"{p}: {_how(e)}" for p, e in ended.items()) or "none seen"
        return f"no abnormal end among its processes (ends: {seen})"
    if stopped:
        return why
    return f"every rank ended by {_how(died[0])} at once (its process group was killed)"


@dataclasses.dataclass
class Ends:
    """What `Departures` keeps of one watched job between ticks. Its WatchedJob
    holds it (watch/job.py `WatchedJob.ends`), so it is forgotten with the job."""
    last: tuple[Job, str] | None = None   # (job, label) as judged live last tick
    held: tuple[Job, str, float] | None = None  # (job, label, until): gone, held
    since: float | None = None  # when first seen: older exits are of other
                                # processes that had the same pids
    at_terminal: bool = False   # last seen in a terminal's foreground
    ranks: dict[int, int] = dataclasses.field(default_factory=dict)  # pid -> rank as
    # last judged (a rank number from any evidence: watch/job.py `over_time`)


@dataclasses.dataclass(frozen=True)
class PostMortem:
    """A terminal job gone from discovery with some ranks not yet ended
    (Lightning's rank 0 alone is no job to discovery): decided once they end, or
    CTRL_C_S after the first end."""
    job: Job
    label: str
    since: float | None


class Departures:
    """Decides, each tick, which ranks departed and which gone jobs are held.
    What it keeps of a watched job is that job's `Ends` (handed in by the
    caller, who owns them); what outlives a job it owns itself: the post-mortems
    of terminal jobs gone from discovery whose end is not decided yet
    (`PostMortem`, at most CTRL_C_S each)."""

    def __init__(self, hold_s: float = HOLD_S):
        self.hold_s = hold_s
        self.post_mortems: dict[str, PostMortem] = {}  # owner key -> its job's post-mortem

    def update(self, live: list[tuple[str, str, Job]], exits, now: float,
               jobs: dict[str, Ends], foreground: frozenset[int] = frozenset()
               ) -> list[tuple[str, str, Job]]:
        """The jobs to judge this tick as (key, label, job): `live` ones with
        their departed ranks, then the held ones. `exits`: the survey's
        probes.exits.Exits (None: not watched, nothing departs). `jobs`: owner
        key -> Ends of every watched job (watch/job.py `WatchedJobs.ends`: each
        WatchedJob's own; `setdefault` watches a job not watched yet), or a plain
        dict. `foreground`: pids in their terminal's foreground process group."""
        every = exits.exits if exits is not None else ()
        live = self._same_jobs(live, jobs)
        out, keys = [], set()
        for key, label, job in live:
            keys.add(key)
            ends = jobs.setdefault(key, Ends())
            ends.held = None  # back (a pid's job found again): live wins
            if ends.since is None:
                mortem = self.post_mortems.get(key)
                ends.since = mortem.since if mortem is not None and mortem.since is not None \
                    else now
            ended = {e.pid: e for e in every if e.at >= ends.since}
            if ends.last is not None and ended:
                job = self._with_departed(job, ends.last[0], ended, ends.ranks)
            out.append((key, label, job))
        pending = {}
        gone_jobs = [(key, m.job, m.label, m.since, True) for key, m in self.post_mortems.items()
                     if jobs.get(key) is None or jobs[key].last is None]
        gone_jobs += [(key, e.last[0], e.last[1], e.since, e.at_terminal)
                      for key, e in jobs.items() if e.last is not None]
        for key, job, label, since, at_terminal in gone_jobs:
            if key in keys or jobs.get(key, Ends()).held is not None:
                continue
            ended = {e.pid: e for e in every if e.at >= (now if since is None else since)}
            everyone = job.rank_pids + job.departed_pids + (
                (job.launcher_pid,) if job.launcher_pid > 0 else ())
            died = sorted((ended[p] for p in everyone
                           if p in ended and _abnormal(job, ended[p], exits)),
                          key=lambda e: e.at)
            # a stop signal's sender, when seen, decides; else how every rank ended
            stopped, why = _stopped_by_request(job, died[0], exits) if died else (None, "")
            if not died or stopped or (stopped is None and _killed_whole(job, ended, died[0])):
                # said once, as the job leaves: why a gone job pages nothing
                log.info("job %s ended: not held (%s)", label,
                         _why_not_held(ended, died, stopped, why))
                continue
            # a terminal's Ctrl-C reaches every rank: one whose sender was seen
            # asking one rank alone (stopped False) is no Ctrl-C
            if at_terminal and stopped is None:
                if any(p not in ended for p in job.rank_pids + job.departed_pids) and \
                        now - died[0].at <= CTRL_C_S:
                    pending[key] = PostMortem(job, label, since)  # the rest may still be ending
                    continue
                if _stopped_at_terminal(job, ended, died):
                    log.info("job %s ended: not held (stopped at its terminal)", label)
                    continue
            ends = jobs.setdefault(key, Ends(since=since))
            gone = self._with_departed(dataclasses.replace(job, rank_pids=(), ranks=()),
                                       job, ended, ends.ranks, every=True)
            ends.held = (gone, label, now + self.hold_s)
            log.info("job %s ended: held %.0f s, first to end pid %d (%s)", label,
                     self.hold_s, died[0].pid, why or _how(died[0]))  # why: the sender, seen
        for key, ends in jobs.items():
            if ends.held is None:
                continue
            job, label, until = ends.held
            if now > until:
                ends.held = None
            elif key not in keys:
                out.append((key, label, job))
        judged = {key for key, _, _ in out}
        for key, ends in jobs.items():
            if key not in judged:  # gone: its WatchedJob is forgotten (watch/job.py)
                ends.last, ends.since = None, None
            elif ends.held is not None:
                ends.last = None
        for key, label, job in out:
            if jobs[key].held is None:
                jobs[key].last = (job, label)
        self.post_mortems = pending
        for key, label, job in live:
            jobs[key].at_terminal = any(p in foreground
                                        for p in job.rank_pids + (job.launcher_pid,))
        return out

    def _same_jobs(self, live: list[tuple[str, str, Job]],
                   jobs: dict[str, Ends]) -> list[tuple[str, str, Job]]:
        """A job found under a new key whose ranks were all ranks of one job of the
        last tick, gone under its key, is that job: a job without a launcher is keyed
        by its lowest pid (discovery.owner_key), and when that rank dies its
        survivors are found under another (tests/thirdparty/test_ray_jobs.py: Ray Train's rank 1
        had the lower pid). It keeps its key and label, so its dead rank stays in
        it as departed, and one incident tells the story."""
        keys = {key for key, _, _ in live}
        last = {key: e.last for key, e in jobs.items() if e.last is not None}
        # launcherless jobs only: a launcher's job is keyed by its launcher, and ranks
        # outliving it are a job being killed whole, not the same job going on
        # (tests/hostile/test_hostile_users.py: torchrun's agent killed before its workers)
        owner = {pid: key for key, (job, _) in last.items() if job.launcher_pid <= 0
                 for pid in job.rank_pids + job.departed_pids}
        out, taken = [], set()
        for key, label, job in live:
            if key not in last and job.rank_pids:
                olds = {owner.get(pid) for pid in job.rank_pids}
                old = olds.pop() if len(olds) == 1 else None
                if old is not None and old not in keys and old not in taken:
                    taken.add(old)
                    key, label = old, last[old][1]
            out.append((key, label, job))
        return out

    @staticmethod
    def _with_departed(job: Job, prev: Job, ended: dict, ranks: dict[int, int],
                       every: bool = False) -> Job:
        """`job` with `prev`'s ranks that ended (all of them when `every`, seen
        ending or not: a held job is its last view) added to its departed ones."""
        pids, numbers = list(prev.departed_pids), list(prev.departed_ranks)
        for pid, rank in zip(prev.rank_pids, prev.ranks or (-1,) * len(prev.rank_pids)):
            if pid in job.rank_pids or pid in pids or not (every or pid in ended):
                continue
            pids.append(pid)
            judged = ranks.get(pid, -1)
            numbers.append(judged if judged >= 0 else rank)
        return dataclasses.replace(job, departed_pids=tuple(pids), departed_ranks=tuple(numbers))
