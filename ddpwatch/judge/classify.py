"""judge(history, rules) -> Judgement. Pure: snapshots in, verdicts out.

One rank's 0% CPU means nothing alone; so signals are first measured per rank,
then completed with what the peers do (who waits, who is behind, whose op
differs: judge/signals/), and only then are the rules applied: the first verdict
rule that matches, in the order of their stages (judge/stages.py), decides a
rank's verdict and role, every finding rule that matches adds a finding, and the
culprits and the worst verdict make the job's.

What the job's past makes of a window (a pause past its bound, a spell of
slowness: signals/overtime.py) comes as signals too, from the daemon's per-job
watch (watch/overtime.py): `judge(..., over=...)` adds them to the ranks they
concern before the rules, and `again` applies the rules anew to a judgement's
ranks with them added. Every verdict is a rule's (tests/unit/judge/test_rule_ids_unit.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from ..observe.snapshot import Snapshot
from . import signals, stages
from .rules import Rule, render
from .vocabulary import SEVERITY


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str
    evidence: str
    remedy: str


@dataclass(frozen=True)
class RankVerdict:
    pid: int
    rank: int
    local_rank: int
    host: str
    verdict: str
    role: str
    confidence: float
    rule: str
    evidence: str
    remedy: str
    findings: tuple[Finding, ...]
    stack: str
    signals: dict[str, object]
    remote: bool = False  # on another node: judged here from its daemon's signals

    @property
    def key(self) -> tuple:
        """The rank, whichever node it is on (pids repeat across nodes): what the
        signals over time are given by (`judge`'s and `again`'s `over`)."""
        return self.remote, self.host, self.pid


@dataclass(frozen=True)
class JobVerdict:
    verdict: str
    culprits: tuple[int, ...]
    summary: str
    # the culprit this node cannot judge, named by where it is ("a rank on
    # 10.0.0.2", "the node at 10.0.0.2"): victims here wait on it
    elsewhere: str = ""


@dataclass(frozen=True)
class Judgement:
    job: JobVerdict
    ranks: tuple[RankVerdict, ...]
    # this node's ranks' signals before the peers' were added (signals.local), as
    # measured: `local` gives them as the daemon serves them to its peers
    measured: tuple[dict, ...] = ()
    # the heartbeat records that belong to the job (signals/heartbeat.job_records),
    # with whether each writer is alive: what metrics and bundles report
    records: tuple = ()

    @cached_property
    def local(self) -> tuple[dict, ...]:
        """The measured signals, JSON scalars and None only: what /peer serves
        (publish/peers.py). Worked out when a peer asks, not at every judgement."""
        return tuple({k: s[k] for k in sorted(s) if type(s[k]) in _JSON_SCALARS}
                     for s in self.measured)


def judge(history: tuple[Snapshot, ...], rules: list[Rule],
          remote: tuple[dict, ...] = (), over: dict | None = None) -> Judgement:
    """`over`: signals over time by rank key (RankVerdict.key), added to those
    ranks' measured signals before the rules (a replay of what the daemon judged)."""
    tests = _ordered(rules)
    verdicts = []
    local = signals.local(history)
    order: list[str] = []
    order_set: set[str] = set()  # the names in `order`
    for s in signals.with_peers(local, remote):
        if over:
            s.update(over.get((bool(s.get("remote")), s.get("node", ""), s["pid"]), ()))
        if s.keys() != order_set:
            # ranks mostly hold the same signals: sorted once for all of them
            order = sorted(s)
            order_set = set(order)
        verdicts.append(_decide(s, order, tests))
    verdicts.sort(key=lambda v: (v.rank if v.rank >= 0 else 1 << 30, v.pid))
    return Judgement(job_verdict(verdicts), tuple(verdicts), tuple(local),
                     tuple(signals.heartbeat.job_records(history[-1])))


def again(judgement: Judgement, rules: list[Rule], over: dict) -> Judgement:
    """`judgement` with the ranks named in `over` (RankVerdict.key -> signals over
    time) judged anew by the rules, from their signals and those; the others as
    they were. What the daemon's per-job watch does each tick (watch/job.py)."""
    if not any(r.key in over for r in judgement.ranks):
        return judgement
    tests = _ordered(rules)
    ranks = []
    for r in judgement.ranks:
        extra = over.get(r.key)
        if not extra:
            ranks.append(r)
            continue
        s = {"pid": r.pid, **r.signals, **extra}  # every measured signal is kept (scalars)
        # who it is stays as measured
        ranks.append(dataclasses.replace(_decide(s, sorted(s), tests), rank=r.rank,
                                         local_rank=r.local_rank, host=r.host,
                                         remote=r.remote, stack=r.stack))
    return dataclasses.replace(judgement, job=job_verdict(ranks), ranks=tuple(ranks))


def _decide(s: dict, order: list[str], tests: tuple[list, list]) -> RankVerdict:
    """One rank's verdict from its signals `s` (`order`: their names, sorted)."""
    verdict_tests, finding_tests = tests
    # each rule's test called directly, in a plain loop: ~60 rules a rank,
    # 256 ranks a judgement (benchmarks/README.md "Where the 256-record tick goes")
    rule = None
    for r, test in verdict_tests:
        if test(s):
            rule = r
            break
    blind = None if rule else _blind(s)
    findings = tuple(Finding(r.finding, r.severity, render(r.evidence, s), render(r.remedy, s))
                     for r, test in finding_tests if test(s))
    return RankVerdict(
        pid=s["pid"], rank=s.get("rank", -1) if s.get("rank") is not None else -1,
        local_rank=s.get("local_rank", -1), host=s.get("node", ""),
        remote=bool(s.get("remote")),
        verdict=rule.verdict if rule else "unknown",
        role=rule.role if rule else "none",
        confidence=rule.confidence if rule else 0.0,
        rule=rule.id if rule else "",
        evidence=render(rule.evidence, s) if rule else blind[0],
        remedy=render(rule.remedy, s) if rule else blind[1],
        findings=findings, stack=s.get("stack_top", ""),
        signals={k: s[k] for k in order if type(s[k]) in _SCALARS})


_ordered_last: tuple = ((), ([], []))  # (the rules last ordered, what _ordered gave)


def _ordered(rules: list[Rule]) -> tuple[list[tuple], list[tuple]]:
    """(rule, its test) of the verdict rules in the order they are tried
    (stages.order), and of the finding rules. The daemon judges every job every
    tick with one list of rules (a new one after a reload): ordered once per
    list of Rule objects."""
    global _ordered_last
    last, ordered = _ordered_last  # one read: another thread may replace it whole
    if len(last) == len(rules) and all(a is b for a, b in zip(last, rules)):
        return ordered
    ordered = ([(r, r.test) for r in stages.order(rules)],
               [(r, r.test) for r in rules if r.finding])
    _ordered_last = (tuple(rules), ordered)
    return ordered


# what a signal's value may be: signals.spec's kinds (int, float, str, bool);
# by type, not isinstance: asked of ~150 values per rank per judgement
_SCALARS = frozenset((int, float, str, bool))
_JSON_SCALARS = _SCALARS | {type(None)}


BLIND_REMEDY = ("Check that ddpwatch may read /proc and ptrace the ranks (run as the ranks' "
                "user or root), then diagnose again.")


def _blind(s: dict) -> tuple[str, str]:
    """(evidence, remedy) of a rank no rule matched."""
    if s.get("stack_moved_on") and not s.get("stack"):
        # its only dump was of a wait it has left (signals/stack.py measure):
        # nothing is wrong with the daemon's access, the dump is just old
        cpu = s.get("cpu_ratio")
        return ("no rule matched: its last stack dump showed a collective wait that its "
                "main thread has left since" + (f" (CPU {cpu:.0%} over {s.get('window_s', 0):.1f}s)"
                                                if cpu is not None else ""),
                f"None yet: the next stack dump says where it is; `ddpwatch diagnose "
                f"{s['pid']}` looks now.")
    seen = [k for k in ("cpu_ratio", "stack", "hb") if s.get(k) not in (None, False)]
    return ("no rule matched what could be observed" if seen else
            "could not observe this rank (no CPU sample, no stack, no heartbeat)", BLIND_REMEDY)


def _elsewhere(victims: list[RankVerdict]) -> str:
    """Where the victims' culprit is when no view here holds it (signal
    `blamed_elsewhere`), "" when they do not say."""
    places = sorted({v.signals["blamed_elsewhere"] for v in victims
                     if v.signals.get("blamed_elsewhere")})
    return " or ".join(places)


def _name(v: RankVerdict) -> str:
    name = f"rank {v.rank}" if v.rank >= 0 else f"pid {v.pid}"
    return f"{name} (on {v.host or 'a peer node'})" if v.remote else name


def job_verdict(verdicts) -> JobVerdict:
    """The job's verdict from its ranks'."""
    if not verdicts:
        return JobVerdict("unknown", (), "No rank of this job could be found.")
    verdict = _job_verdict(verdicts)
    # A critical misconfiguration may be why the job is in this state at all (a
    # rank's Gloo on loopback, while its peer failed to start): say it beside.
    critical = [f"{_name(v)}: {f.id.replace('_', ' ')}: {f.evidence}." for v in verdicts
                for f in v.findings if f.severity == "critical"]
    if not critical:
        return verdict
    return JobVerdict(verdict.verdict, verdict.culprits,
                      f"{verdict.summary} Critical: {' '.join(critical)}", verdict.elsewhere)


def _job_verdict(verdicts: list[RankVerdict]) -> JobVerdict:
    culprits = [v for v in verdicts if v.role == "culprit"]
    victims = [v for v in verdicts if v.role == "victim"]
    if culprits:
        lead = min(culprits, key=lambda v: SEVERITY.index(v.verdict))
        verdict = lead.verdict
        parts = [f"{_name(c)} is the culprit ({c.verdict.replace('_', ' ')}): {c.evidence}."
                 for c in culprits]
        if victims:
            # casualties that ended after it (probes/exits.py) wait on nothing
            after = ("ended after it" if all(v.verdict == "dead" for v in victims) else
                     f"{'waits' if len(victims) == 1 else 'wait'} on it")
            parts.append(f"{', '.join(_name(v) for v in victims)} {after} "
                         f"({', '.join(sorted({v.verdict.replace('_', ' ') for v in victims}))}).")
        parts.append(f"Remedy: {lead.remedy}")
        return JobVerdict(verdict, tuple(c.rank for c in culprits), " ".join(parts))
    worst = min(verdicts, key=lambda v: SEVERITY.index(v.verdict))
    away = _elsewhere(victims)
    if away and worst in victims:
        who = [v for v in victims if v.verdict == worst.verdict]
        return JobVerdict(worst.verdict, (), (
            f"The culprit is {away}: "
            f"{', '.join(_name(v) for v in who)} {'waits' if len(who) == 1 else 'wait'} on it "
            f"({worst.verdict.replace('_', ' ')}): {worst.evidence}. Remedy: {worst.remedy}"),
            away)
    if worst.verdict == "healthy":
        where = "" if any(v.remote for v in verdicts) else " local"
        summary = f"All {len(verdicts)}{where} rank(s) are making progress."
    else:
        who = [v for v in verdicts if v.verdict == worst.verdict]
        summary = (f"{', '.join(_name(v) for v in who)}: {worst.verdict.replace('_', ' ')}: "
                   f"{worst.evidence}. No local culprit: "
                   + ("the rank they wait for may be on another node. " if worst.verdict ==
                      "blocked_in_collective" else "") + f"Remedy: {worst.remedy}")
    return JobVerdict(worst.verdict, (), summary)
