"""Rule files of the old format, ordered by `priority:` (higher tried first,
ties in file order) instead of by stage. They keep working: a rule that says
`priority: P` and no stage is tried where the old order tried it, among the
shipped rules as they stood then (PRIORITY: their priorities when stages
replaced them, frozen; tests/unit/judge/test_rules_order_unit.py proves that the stages
order the shipped rules as these priorities did). A verdict rule with neither
stage nor priority had priority 0: tried after every shipped rule.

`ddpwatch rules check` and `diagnose` say, for each such rule, which stage and
overrides would put it in the same place (stages.deprecations)."""
from __future__ import annotations

PRIORITY = {
    # gone
    "oom-killed-first": 103, "died-first": 102, "ended-after-peer": 101, "dead": 100,
    "exited-at-start-loopback-peer": 100, "exited-at-start": 99, "exited-early": 98,
    "missing-not-joined": 98, "missing-rank": 97,
    # stopped
    "straggler-part-stopped": 96, "stopped": 95,
    # desync
    "desync-left-loop": 93, "desync-stack-deviant": 92, "desync-stack": 91,
    "desync-deviant": 90, "desync": 89,
    # wait
    "starting-ddp-setup": 88, "paused-for-data": 87, "paused-working": 87,
    "straggler-throttled": 87, "waits-for-compiling-peer": 86,
    "compiling-while-peers-wait": 86, "dropped-inbound": 86,
    "unreachable-peer-dropped-there": 86, "hung-outside-idle": 85,
    "unreachable-loopback-address": 84, "unreachable-gloo-address": 83,
    "unreachable-peer-off-route": 82, "unreachable-peer-data": 81,
    "waits-for-paused-peer": 80, "unreachable-peer": 80, "waiting-on-straggler": 78,
    "exiting-after-peer-death": 77, "blocked-on-dead-peer": 76, "blocked": 75,
    "survivor-of-dead-peer": 74,
    # start-up
    "rendezvous-launcher": 71, "rendezvous": 70, "rendezvous-heartbeat": 69,
    "warming-up": 60, "starting": 59, "starting-alone": 58,
    # pace
    "straggler-across-nodes": 57, "slow-link": 56, "straggler-starved": 55,
    "straggler-starved-across-nodes": 55, "straggler": 54, "straggler-cpu": 53,
    "waiting-on-peer": 52, "waiting-on-peer-cpu": 51, "waiting-on-unseen-node": 50,
    "waiting-on-unseen-node-window": 49,
    # healthy
    "healthy-heartbeat": 20, "healthy-cpu": 19, "agent": 18,
}


def _old_priority(rule) -> int | None:
    if not rule.stage:
        return rule.priority or 0
    return PRIORITY.get(rule.id)


def place(old: list, ordered: list, position: dict) -> list:
    """`ordered` (the staged rules in order) with each rule of `old` inserted
    where the old order put it: before the first rule that the old order tried
    after it (a lower priority, or the same and later in the merged list
    `position`). Rules the old order never knew (new ids with a stage) are
    stepped over."""
    out = list(ordered)
    for rule in sorted(old, key=lambda r: position[r.id]):
        mine = _old_priority(rule)
        at = next((i for i, o in enumerate(out) if _old_priority(o) is not None and (
            _old_priority(o) < mine or (_old_priority(o) == mine
                                        and position[o.id] > position[rule.id]))), len(out))
        out.insert(at, rule)
    return out

