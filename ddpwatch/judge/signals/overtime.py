"""Overtime family: what the job's past makes of this window, given by the
daemon's per-job watch (ddpwatch/watch/overtime.py) to the ranks of this
window's judgement it concerns, and judged by the rules of stage `over-time`
(docs/judgement-over-time.md). Nothing here measures: `diagnose` has no past,
so these signals are absent there and those rules do not fire; a replay file
may carry them (observe/snapshot.py `load_over_time`), as an incident bundle's
snapshots.json does.

A pause in progress (watch/pauses.py): the rank that works while its peers
wait (`pause_works`) and the ranks judged paused waiting for it (`pause_waits`)
carry its age, its bound and whether it lasted past it. A spell of slowness
(watch/slow.py): while it is shorter than straggler_after_s the ranks judged
stragglers or waiting on one carry the verdict they would have (`slow_as`);
once confirmed, a rank judged healthy in one window carries the slow verdict it
had a moment ago (`slow_held`)."""
from __future__ import annotations

from .spec import NUMBER, declare, one_of

SIGNALS = declare(
    ("pause_works", bool, "this rank works outside the collectives in the job's pause in "
                          "progress (judged paused in this window: pausing, or compiling "
                          "while its peers wait), the rank the others wait for"),
    ("pause_waits", bool, "this rank is judged paused in this window waiting in a collective "
                          "for the rank that works in the job's pause in progress"),
    ("pause_rank", int, "the rank that works in the job's pause in progress"),
    ("pause_s", NUMBER, "how long the job's pause in progress has lasted: since the first "
                        "tick that saw it, or earlier by the waiting peers' time inside their "
                        "collective", "s"),
    ("pause_bound_s", NUMBER, "how long the pause may last before it is a hang: min(max("
                              "pause_floor_s, pause_factor x the longest earlier pause of this "
                              "job at its site), the collective timeout less a margin)", "s"),
    ("pause_over", bool, "the job's pause in progress lasted past its bound (pause_bound_s)"),
    ("pause_doing", str, "what the working rank does in the pause and where (\"evaluates at "
                         "estimate_loss <- train.py:260\"), for evidence"),
    ("pause_why", str, "what the pause's bound is made of (the earlier pauses at its site, "
                       "the floor, the timeout), for evidence"),
    ("pause_backend", str, "the backend whose collective timeout bounds the pause (gloo, "
                           "nccl)"),
    ("pause_timeout_s", NUMBER, "the collective timeout that would end the job", "s"),
    ("pause_timeout_left_s", NUMBER, "seconds before the collective timeout ends the job, "
                                     "given once the pause is within the timeout's margin",
                                     "s"),
    ("slow_as", one_of("straggler", "waiting_on_peer"),
     "the verdict this rank had in the job's spell of slowness: this window's while the "
     "spell is shorter than straggler_after_s, or the one it had a moment ago (slow_held)"),
    ("slow_rule", str, "the rule that gave it that verdict"),
    ("slow_evidence", str, "that verdict's evidence"),
    ("slow_remedy", str, "that verdict's remedy"),
    ("slow_what", str, "what the slow rank does, in words (\"falls behind its peers\", "
                       "\"waits for a slower peer\")"),
    ("slow_s", NUMBER, "how long the job's spell of slowness has lasted, from its first slow "
                       "tick", "s"),
    ("slow_share", NUMBER, "the share of the spell's ticks judged slow", "share"),
    ("slow_after_s", NUMBER, "straggler_after_s: how long a spell lasts before its stragglers "
                             "are named", "s"),
    ("slow_held", bool, "the spell is confirmed and this rank, judged healthy in this window, "
                        "was judged slow (slow_as) within the spell's gap: the windows of a "
                        "slow rank alternate slow and healthy"),
    ("slow_seen_s", NUMBER, "seconds since this rank was last judged slow (slow_held)", "s"),
)
