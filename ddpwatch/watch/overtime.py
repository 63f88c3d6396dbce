"""The job's past as signals (judge/signals/overtime.py): what its pause in
progress (watch/pauses.py) and its spell of slowness (watch/slow.py) say of the
ranks of this window's judgement, given to those ranks only. classify.again
then applies the same rules to them (stage over-time, rules/default.yaml):

    pause past its bound     the working rank pause-past-bound (a hang, culprit),
                             the ranks waiting for it waits-past-pause-bound
    spell under straggler_after_s   its stragglers and their waiting peers
                             slowing-briefly (calm)
    confirmed spell          a rank judged healthy in this window that was slow
                             within the spell's gap: straggler-held,
                             waiting-on-straggler-held (the windows of a rank held to
                             a fraction of a core alternate slow and healthy:
                             tests/nodes/test_two_nodes.py asks six ticks in a row)

A rank this window judged otherwise gets none: a worse verdict (dead, hung) is
never held back, and a rank no longer pausing is not escalated. Pure.
"""
from __future__ import annotations

from .pauses import Pause
from .slow import SLOW, Slow

WHAT = {"straggler": "falls behind its peers", "waiting_on_peer": "waits for a slower peer"}


def signals(judgement, pause: Pause | None, slow: Slow | None) -> dict[tuple, dict]:
    """RankVerdict.key -> the signals over time of that rank of `judgement` (the
    window's, as the classifier gave it)."""
    out: dict[tuple, dict] = {}
    if pause is not None:
        facts = _pause_facts(pause)
        for r in judgement.ranks:
            if r.verdict != "paused":
                continue
            works = r.pid == pause.pid and not r.remote
            out[r.key] = {**facts, "pause_works": works, "pause_waits": not works}
    if slow is None:
        return out
    if slow.confirmed:
        then = {r.key: (r, age) for r, age in slow.held}
        for r in judgement.ranks:
            if r.verdict == "healthy" and r.key in then:
                was, age = then[r.key]
                out.setdefault(r.key, {}).update(_slow_facts(was, slow), slow_held=True,
                                                 slow_seen_s=age)
    else:
        for r in judgement.ranks:
            if r.verdict in SLOW:
                out.setdefault(r.key, {}).update(_slow_facts(r, slow), slow_held=False)
    return out


def _pause_facts(p: Pause) -> dict:
    facts = {"pause_rank": p.rank, "pause_s": p.elapsed_s, "pause_bound_s": round(p.bound_s, 1),
             "pause_over": p.over, "pause_doing": p.doing(), "pause_why": p.why(),
             "pause_backend": p.backend or "collective", "pause_timeout_s": p.timeout_s}
    if p.near_timeout:
        facts["pause_timeout_left_s"] = p.left_s
    return facts


def _slow_facts(r, slow: Slow) -> dict:
    return {"slow_as": r.verdict, "slow_rule": r.rule, "slow_evidence": r.evidence,
            "slow_remedy": r.remedy, "slow_what": WHAT.get(r.verdict, "is slow"),
            "slow_s": slow.elapsed_s, "slow_share": slow.share, "slow_after_s": slow.after_s}
