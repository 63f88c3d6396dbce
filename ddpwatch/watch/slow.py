"""A job's spells of slowness: how long its ranks have been judged stragglers
(or waiting on one), so that a straggler is named only once it has been slow
over many steps (straggler_after_s), not for one window: watch/overtime.py
gives the spell to its ranks as signals (rules slowing-briefly, straggler-held,
waiting-on-straggler-held).

A spell begins on the first tick a rank is judged slow and ends once none has
been for GAP_S: a contended rank's windows alternate slow and healthy, and that
is one spell (confirmed when slow in most of its ticks). States: calm -> slow
(spell open) -> calm. Each rank's last slow verdict in the spell is kept, and
handed on while it is younger than GAP_S: a confirmed spell shows a rank judged
healthy in one window as it was (rules straggler-held, waiting-on-straggler-held)."""
from __future__ import annotations

from dataclasses import dataclass

GAP_S = 10.0       # no slow tick for this long: the spell is over
SLOW = frozenset({"straggler", "waiting_on_peer"})  # the verdicts a spell is made of
SLOW_SHARE = 0.5   # slow in at least this share of the ticks since it began


@dataclass(frozen=True)
class Slow:
    """A spell of slowness in progress, as the job's watch has followed it."""
    elapsed_s: float   # since the first slow tick of the spell
    share: float       # of the spell's ticks judged slow
    after_s: float     # straggler_after_s
    # each rank's last slow verdict in the spell and the seconds since, for the
    # ranks slow within GAP_S: what a confirmed spell holds
    held: tuple[tuple[object, float], ...] = ()

    @property
    def confirmed(self) -> bool:
        return self.elapsed_s >= self.after_s and self.share >= SLOW_SHARE


class SlowTracker:
    def __init__(self):
        self._since: float | None = None
        self._last_slow = 0.0
        self._ticks = self._slow_ticks = 0  # of the spell in progress
        self._held: dict = {}  # RankVerdict.key -> (its last slow RankVerdict, when)

    def update(self, judgement, now: float, after_s: float) -> Slow | None:
        """Follow this tick's judgement (this window's, before the signals over
        time); the spell in progress, if any."""
        slow = any(r.verdict in SLOW for r in judgement.ranks)
        if slow:
            if self._since is None:
                self._since = now
                self._ticks = self._slow_ticks = 0
                self._held = {}
            self._last_slow = now
            self._held.update((r.key, (r, now)) for r in judgement.ranks
                              if r.verdict in SLOW)
        elif self._since is not None and now - self._last_slow >= GAP_S:
            self._since = None
        if self._since is None:
            self._held = {}
            return None
        self._ticks += 1
        self._slow_ticks += slow
        share = self._slow_ticks / self._ticks
        self._held = {k: (r, at) for k, (r, at) in self._held.items() if now - at < GAP_S}
        return Slow(elapsed_s=round(now - self._since, 1), share=round(share, 2),
                    after_s=after_s,
                    held=tuple((r, round(now - at, 1)) for r, at in self._held.values()))
