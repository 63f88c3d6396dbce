"""Stack dumps inside a window, between its first and last snapshot.

Two dumps are no evidence: a healthy DDP rank spends 20-40% of its time in the
same reducer wait as a blocked one, so both ends of a window land there for one
healthy rank in about ten; with two dumps in between as well, one in a hundred
or fewer. A rank seen waiting in every dump of the window is stuck; one seen
waiting in some is waiting now and then, as every rank of a training job does.

The dumps are py-spy --nonblocking whatever the window's own snapshots ask
(--native pauses a rank for up to a second per dump: a window of them would
pause it most of the time). They run on a thread of their own, so the duty
readings of the window (observe/window/duty.py) go on meanwhile; py-spy runs over the
ranks in parallel (probes/stacks.py run_dumps).
"""
from __future__ import annotations

import threading
from typing import Callable

from ..probes import Pass, ProbeContext, make, run_probe

MIDDLE_DUMPS = 2  # besides the window's two ends: 4 stack samples per window


def dump_times(start: float, end: float, count: int = MIDDLE_DUMPS) -> tuple[float, ...]:
    """When to dump between `start` and `end`: evenly spaced, ends excluded
    (the window's snapshots take those)."""
    if count <= 0 or end <= start:
        return ()
    step = (end - start) / (count + 1)
    return tuple(start + step * i for i in range(1, count + 1))


class WindowStacks:
    """Dumps `pids` at each of `times` (ctx.clock's) on a thread; `stop()` waits
    for the dump under way (bounded by the probe's timeout), skips those not yet
    due, and returns the dumps taken, oldest first. A failed dump is left out:
    the window's ends still say what the probe could not. The stacks probe is
    its own, made without native frames."""

    def __init__(self, ctx: ProbeContext, pids: tuple[int, ...], times: tuple[float, ...],
                 run: Callable = run_probe):
        self._ctx, self._probe = ctx, make("stacks")
        self._pids, self._times, self._run = pids, times, run
        self._stop = threading.Event()
        self._taken: list = []
        self._thread = threading.Thread(target=self._loop, name="ddpwatch-window-stacks",
                                        daemon=True)
        if pids and times:
            self._thread.start()

    def _loop(self) -> None:
        for at in self._times:
            # Event.wait returns early on stop(): a window cut short takes no more
            if self._stop.wait(max(at - self._ctx.clock(), 0.0)):
                return
            result = self._run(self._probe, self._ctx, Pass(), self._pids)
            if result.ok and result.data is not None:
                self._taken.append(result.data)

    def stop(self) -> tuple:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return tuple(self._taken)
