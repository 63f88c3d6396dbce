"""`ddpwatch diagnose` with no pid: every job on the node, found as the daemon
finds them (Sampler.survey(wire=True)), judged over one window they share
(diagnose.watched), each as `diagnose <pid>` judges it. Jobs with a problem
first, each in full; a healthy job in one line. Exit code: the worst job's.

Without CAP_SYS_PTRACE only the caller's own jobs are judged (another user's
environment, sockets and stacks are closed to us, diagnose.find_job), and a
line says that the others need root."""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field

from .. import errors
from ..judge import classify
from ..judge.vocabulary import SEVERITY, label
from ..observe.jobs import discovery
from ..observe.probes import ProbeContext
from ..observe.sampler import Sampler
from ..observe.system import ptrace
from ..publish import stackless
from ..publish.terminal import printable, printable_lines
from . import diagnose as one, load_rules
from .token import token
from ..observe.jobs import nonrank


@dataclass
class JobResult:
    key: str
    uid: int
    judgement: object = None
    last: object = None
    refusal: ptrace.Refusal | None = None
    error: str = ""   # it could not be looked at (it ended, access denied)

    @property
    def code(self) -> int:
        return errors.PROBLEM_FOUND if self.judgement is None else one.exit_code(self.judgement)


@dataclass
class NodeResult:
    jobs: list[JobResult] = field(default_factory=list)
    others_hidden: bool = False  # not root: other users' jobs not looked at
    hidden_remedy: str = ptrace.SUDO  # what shows them
    seen: list = field(default_factory=list)  # --all: (pid, uid, name, why no rank)

    @property
    def code(self) -> int:
        return max((j.code for j in self.jobs), default=errors.OK)

    def ordered(self) -> list[JobResult]:
        """Jobs with a problem first, the most severe first (judge/vocabulary.py
        severity: a stopped rank's job before a paused one), else in the order
        they were found."""
        return sorted(self.jobs, key=lambda j: (j.code == errors.OK, _severity(j)))


def _severity(entry: JobResult) -> int:
    if entry.judgement is None:
        return len(SEVERITY)  # not looked at: after those that were
    return SEVERITY.index(entry.judgement.job.verdict)


def _distinct(jobs) -> list:
    """Each job once: the wire's grouping may find again a job discovery found."""
    out, seen = [], set()
    for job in jobs:
        if job.rank_pids not in seen:
            seen.add(job.rank_pids)
            out.append(job)
    return out


def _owner(job, table) -> int:
    anchor = job.launcher_pid if job.launcher_pid > 0 else min(job.rank_pids,
                                                               default=job.target_pid)
    info = table.get(anchor)
    return info.uid if info is not None else -1


def collect(ctx: ProbeContext, window_s: float, with_stacks: bool, rules,
            seen_all: bool = False) -> NodeResult:
    """Every job of the node (the caller's only, without CAP_SYS_PTRACE), judged
    over one shared window of `window_s`."""
    caller = ptrace.read_caller(ctx.procfs)
    root = caller.can_ptrace_any
    switch = one.StacksSwitch(with_stacks)
    result = NodeResult(others_hidden=not root, hidden_remedy=ptrace.privilege(caller))
    with Sampler(ctx, switch.enabled) as sampler:
        survey = sampler.survey(wire=True)
        jobs = survey.jobs()
        table = survey.table
        mine = _distinct(j for j in jobs if root or _owner(j, table) == caller.uid)
        if seen_all:
            result.seen = nonrank.explain(table, jobs, survey.live_record_pids,
                                          None if root else caller.uid)
        labels = discovery.labels(mine, table)
        looked, refusals = [], {}
        for job in mine:
            entry = JobResult(labels[discovery.owner_key(job, table)], _owner(job, table))
            result.jobs.append(entry)
            refusals[id(job)] = switch.refusal = switch.check(ctx, job)
            try:
                looked.append((job, entry, one.sample(sampler, job)))
            except errors.DdpwatchError as err:
                entry.error = str(err)
        if not looked:
            return result
        deadline = max(first.taken_at for _, _, first in looked) + window_s
        switch.refusal = None  # the window's dumps ask per job (`stacks`)
        seconds, survey = one.watched(ctx, sampler, [job for job, _, _ in looked], deadline,
                                      stacks=lambda job: refusals[id(job)] is None)
        for (job, entry, first), second in zip(looked, seconds):
            switch.refusal = refusals[id(job)]
            judgement, history = one.closest(sampler, survey, first, second,
                                             lambda h: classify.judge(h, rules))
            refusal = switch.refusal or (stackless.refused_dump(history[-1])
                                         if with_stacks else None)
            entry.judgement, entry.last = stackless.mark(judgement, refusal), history[-1]
            entry.refusal = refusal
    return result


def one_line(entry: JobResult) -> str:
    j, last = entry.judgement, entry.last
    launcher = (f"{last.job.launcher_kind} pid {last.job.launcher_pid}"
                if last.job.launcher_pid > 0 else last.job.launcher_kind)
    return (f"ok    {entry.key}: {label(j.job.verdict)}, {len(last.job.rank_pids)} rank(s) "
            f"({launcher})")


def as_text(result: NodeResult) -> str:
    blocks = []
    for entry in result.ordered():
        if entry.judgement is None:
            blocks.append(f"??    {entry.key}: could not be looked at: {entry.error}")
        elif entry.code == errors.OK:
            blocks.append(one_line(entry))
        else:
            blocks.append(f"=== job {entry.key} ===\n"
                          f"{one.job_text(entry.judgement, entry.last, None)}\n")
    if not result.jobs:
        blocks.append("no DDP job on this node" + (" of yours" if result.others_hidden else ""))
    by_remedy: dict[str, list[str]] = {}
    for entry in result.jobs:  # the missing evidence, once a remedy for all jobs
        if entry.refusal is not None:
            by_remedy.setdefault(entry.refusal.remedy, []).append(entry.refusal.missing)
    blocks += [ptrace.Refusal("; ".join(missing), remedy).line()
               for remedy, missing in by_remedy.items()]
    if result.others_hidden:
        blocks.append(f"only your jobs (uid {os.geteuid()}) are shown: other users' jobs "
                      f"need root ({result.hidden_remedy})")
    if result.seen:
        blocks.append("\nseen, not ranks (--all):")
        blocks += [f"  pid {pid:<8} uid {uid:<6} {printable(name)}: {why}"
                   for pid, uid, name, why in result.seen]
    return "\n".join(blocks)


def as_json(result: NodeResult) -> dict:
    jobs = []
    for entry in result.ordered():
        if entry.judgement is None:
            jobs.append({"key": entry.key, "error": entry.error})
        else:
            jobs.append(dict(one.job_json(entry.judgement, entry.last, entry.refusal),
                             key=entry.key))
    doc = {"jobs": jobs, "others_hidden": result.others_hidden}
    if result.others_hidden:
        doc["note"] = "other users' jobs need root"
    if result.seen:
        doc["seen"] = [{"pid": p, "uid": u, "name": n, "why": w} for p, u, n, w in result.seen]
    return doc


def _one_job(ctx: ProbeContext, args, rules) -> dict:
    """`diagnose <pid> --json` of the job, with its key: one look of --watch."""
    judgement, history, _, refusal = one.collect(ctx, args.pid, args.window,
                                                 not args.no_stacks, 0.0, args.native, rules)
    return dict(one.job_json(judgement, history[-1], refusal),
                key=discovery.job_key(history[-1].job))


def main(args) -> int:
    """The `diagnose` command: one job's with a pid or --replay (diagnose.main),
    else the node's."""
    if args.watch and args.replay:
        raise errors.UsageError("--watch looks at running jobs: not with --replay")
    if (args.pid is not None and not args.watch) or args.replay:
        return one.main(args)
    token(args)  # a token on the command line is refused, whatever the form (commands/token.py)
    rules = load_rules("diagnose", args.rules)
    for flag in ("save_snapshot", "peer"):
        if getattr(args, flag):
            raise errors.UsageError(f"--{flag.replace('_', '-')} needs a pid: it is about one job")
    ctx = ProbeContext(heartbeat_dir=args.dir)
    if args.watch:
        from . import live
        if args.pid is not None:
            return live.diagnose_watch(lambda: [_one_job(ctx, args, rules)])
        return live.diagnose_watch(lambda: as_json(collect(ctx, args.window, not args.no_stacks,
                                                           rules))["jobs"])
    result = collect(ctx, args.window if math.isfinite(args.window) else 1.0,
                     not args.no_stacks, rules, seen_all=args.all)
    if args.json:
        print(json.dumps(as_json(result), indent=2))
    else:
        print(printable_lines(as_text(result)))
    sys.stdout.flush()
    return result.code
