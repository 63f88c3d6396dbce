"""Departures as the daemon runs it, for unit tests of its decisions: each
job's `Ends` kept beside it (the daemon's WatchedJobs hold them: watch/job.py),
and a job not judged on a tick forgotten with them, as the daemon forgets it."""
from __future__ import annotations

from ddpwatch.observe.jobs.departures import Departures, Ends


class Book(Departures):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.jobs: dict[str, Ends] = {}

    def update(self, live, exits, now, ranks_of=None, foreground=frozenset()):
        """`ranks_of`: owner key -> {pid: rank} as last judged (WatchedJob's `ends.ranks`)."""
        for key, ranks in (ranks_of or {}).items():
            self.jobs.setdefault(key, Ends()).ranks = ranks
        out = super().update(live, exits, now, self.jobs, foreground)
        judged = {key for key, _, _ in out}
        self.jobs = {k: e for k, e in self.jobs.items() if k in judged}
        return out

    def held(self) -> set[str]:
        return {key for key, ends in self.jobs.items() if ends.held is not None}
