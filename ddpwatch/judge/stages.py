"""The order verdict rules are tried in: by stage, then within a stage by file
order, a rule that `overrides` others tried just before them. The first verdict
rule that matches decides a rank's verdict (classify.py); finding rules all apply.

Stages go from what settles a rank whatever else is measured (its process is
gone) to what is left when nothing is wrong (healthy); before them all, the
job's past (over-time), whose signals the daemon's watch gives only to the ranks
whose verdict in this window they refine (watch/overtime.py). Within a stage the rules
are tried in the order the files list them: the shipped file's, then each
`--rules` file's new rules after them; a rule that replaces another (same id)
takes its place, or joins its own stage last if it names another
(rules.merge). A rule with `overrides: [a, b]` is tried just before the first of
a and b instead, which must be of its own stage (a rule of an earlier stage is
tried first anyway). The loader refuses an unknown stage, an override of an
unknown rule or of another stage's, and overrides that go round in a circle,
with file, line and rule id.

Rules of the old format (`priority:`, or no stage) are placed among them as their
priority placed them (legacy.py)."""
from __future__ import annotations

from ..errors import ConfigError
from . import legacy

STAGES = (
    ("over-time", "What the job's past makes of this window's verdict, from signals only the "
                  "daemon's per-job watch gives (family overtime; absent in diagnose), and only "
                  "to the ranks it concerns: a pause that lasted past its bound is a hang, a "
                  "rank slow for less than straggler_after_s is not yet a straggler, and a "
                  "confirmed straggler judged healthy for one window stays one. Tried first: "
                  "the watch gives them from this window's verdicts, which they refine."),
    ("gone", "The rank's process is not running: it ended (how, and which of the job's "
             "ranks ended first, from the kernel's process events) or a rank the job needs "
             "never started. What ended first is the culprit; nothing else measured of a "
             "gone rank is current."),
    ("stopped", "The process exists but is stopped (SIGSTOP, Ctrl-Z, a debugger) for the "
                "whole window or a part of it: it does nothing the later stages could read."),
    ("desync", "Ranks stuck past their bounds wait in different collectives: one left the "
               "path its peers are on. Waiting longer never ends it, so it is named before "
               "any other wait."),
    ("wait", "Ranks wait for one another, or cannot connect. First whether the rank waited "
             "for is busy for a reason (meeting its peers at start-up, pausing, throttled by "
             "a quota, compiling) or the network drops or misroutes the connects, then the "
             "rank idling outside the collectives (a hang), and last the waiting ranks: "
             "victims of a pause, a straggler or a dead peer, or blocked."),
    ("start-up", "Not training yet and nobody stuck: at rendezvous, in the first steps or "
                 "compiling, importing and setting up."),
    ("pace", "Training advances at the pace of a slow rank or a slow link: stragglers, the "
             "ranks that wait on them, collectives slowed by the network."),
    ("healthy", "Progress: steps advance or the rank computes; a torchrun agent watching "
                "its workers."),
)
NAMES = tuple(name for name, _ in STAGES)


def order(rules) -> list:
    """The verdict rules of `rules` (a merged list: load_default) in the order
    they are tried. ConfigError for an override that names no rule or a rule
    of another stage, and for overrides that go round in a circle. Cheap where nothing overrides:
    classify.judge orders the rules at every judgement."""
    verdict = [r for r in rules if r.verdict]
    by_stage: dict[str, list] = {name: [] for name in NAMES}
    old = []
    for r in verdict:
        (by_stage[r.stage] if r.stage else old).append(r)
    overriding = [r for r in verdict if r.overrides]
    if overriding:
        _check_overrides(overriding, {r.id: r for r in verdict})
    staged = [r for name in NAMES for r in _within(by_stage[name])]
    if not old:
        return staged
    return legacy.place(old, staged, {r.id: i for i, r in enumerate(verdict)})


def _check_overrides(overriding: list, by_id: dict) -> None:
    for r in overriding:
        for target in r.overrides:
            other = by_id.get(target)
            if other is None:
                raise ConfigError(f"{r.source}: rule {r.id!r}: overrides {target!r}, which is "
                                  f"no verdict rule")
            if not other.stage:
                raise ConfigError(f"{r.source}: rule {r.id!r}: overrides {target!r}, which "
                                  f"has no stage (the old format: priority)")
            if other.stage != r.stage:
                raise ConfigError(f"{r.source}: rule {r.id!r}: overrides {target!r} of stage "
                                  f"{other.stage!r}, not of its own stage {r.stage!r} (a rule "
                                  f"overrides rules of its stage: give it stage "
                                  f"{other.stage!r})")


def _within(rules: list) -> list:
    """One stage's rules in file order, each rule with overrides inserted just
    before the first (in the order so far) of those it overrides; rules that
    override the same one keep their file order."""
    out = [r for r in rules if not r.overrides]
    pending = [r for r in rules if r.overrides]
    while pending:
        placed = {r.id for r in out}
        # the first in file order whose targets are placed
        ready = next((r for r in pending if placed.issuperset(r.overrides)), None)
        if ready is None:
            raise _circle(pending)
        first = min(i for i, o in enumerate(out) if o.id in ready.overrides)
        out.insert(first, ready)  # after any rule inserted there before it: file order
        pending.remove(ready)
    return out


def _circle(pending: list) -> ConfigError:
    """Rules of one stage none of which can go first: each overrides another of
    them (its targets exist there: _check_overrides). Following the overrides
    from the first comes back to one of them: that circle is the error."""
    by_id = {r.id: r for r in pending}
    path = [pending[0]]
    while True:
        after = by_id[next(t for t in path[-1].overrides if t in by_id)]
        if after in path:
            circle = path[path.index(after):] + [after]
            return ConfigError(f"{circle[0].source}: rule {circle[0].id!r}: overrides go round "
                               f"in a circle: {' -> '.join(r.id for r in circle)}")
        path.append(after)


def deprecations(rules) -> list[str]:
    """What in `rules` is of the old format, each with what says the same now:
    for a verdict rule, the stage and override that put it where its priority did."""
    tried = order(rules)
    out = [f"{r.source}: rule {r.id!r}: 'priority' means nothing on a finding rule (every "
           f"finding rule applies): leave it out" for r in rules if r.finding
           and r.priority is not None]
    for i, rule in enumerate(tried):
        if rule.stage:
            continue
        after = next((o for o in tried[i + 1:] if o.stage), None)
        said = f"'priority: {rule.priority}'" if rule.priority is not None else "no 'stage'"
        where = (f"tried before {after.id!r}: write 'stage: {after.stage}' and "
                 f"'overrides: [{after.id}]' instead" if after else
                 f"tried after every other rule: write 'stage: {NAMES[-1]}' instead")
        out.append(f"{rule.source}: rule {rule.id!r}: {said} is the old way to order verdict "
                   f"rules; {where} (docs/rules.md)")
    return out
