"""What the daemon's journal says of its jobs and incidents: a job's way into
and out of trouble, and each incident's events. Not a healthy job's every
pause and slow spell (seconds apart on a busy node: judge/vocabulary.py CALM
and HELD are quiet to each other)."""
from __future__ import annotations

import logging

from ..judge.vocabulary import CALM, HELD

log = logging.getLogger("ddpwatch")
QUIET = CALM | HELD


def transitions(by_key: dict, watched) -> None:
    """by_key: owner key -> this tick's JobView; `watched`: owner key ->
    WatchedJob (watch/job.py), whose `logged` is the verdict last told."""
    for key, view in by_key.items():
        job = view.judgement.job
        w = watched[key]
        was, w.logged = w.logged, job.verdict
        if was != job.verdict and not (was in QUIET | {"none"} and job.verdict in QUIET):
            log.info("job %s: %s -> %s culprits=%s", view.key, was, job.verdict,
                     list(job.culprits))


def incident(event) -> None:
    """One of publish/incidents.py's Events."""
    i = event.incident
    log.warning("incident %s %s: %s culprits=%s", i.id, event.kind, i.verdict,
                list(i.culprits))
