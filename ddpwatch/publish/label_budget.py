"""How many `ddp_job` label values one user's jobs may give /metrics.

A job's label is its run id, which its owner chooses (up to
discovery.MAX_LABEL characters). Every value is a new set of series in
Prometheus and a new line in every dashboard, and a user who starts fake ranks
under fresh run ids every few seconds made ~100 values a minute
(tests/hostile/test_label_churn.py). So each user but root (root's jobs are the
operator's, a Kubernetes node's pods among them) has a bucket of label values,
like publish/limits.py's incidents: MAX_LABELS_PER_UID at once, one more each
LABEL_REFILL_S. A job takes a value from the bucket when it is first published
and holds it to its end (its `Grant`, forgotten with its WatchedJob); a job that finds the
bucket empty is published as `uid<N>-overflow`, shared by that user's other such
jobs, and takes a value of its own on a later tick when the bucket has one
again. A job counted past the bound once is counted in
ddpwatch_left_out_total{what="job_labels"}.

So one user adds at most MAX_LABELS_PER_UID + 1 values at once, and over an hour
at most MAX_LABELS_PER_UID + 3600 / LABEL_REFILL_S + 1 (each job's value may
also change once, from `pid<N>` to its run id once its ranks are read:
watch/job.py `name`). A real user's eight concurrent jobs, or a job restarted
every minute, keep their own labels.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..observe.budget import LABEL_REFILL_S, MAX_LABELS_PER_UID
from ..observe.jobs.discovery import owner_uid
from .limits import Buckets


def overflow_label(uid: int) -> str:
    return f"uid{uid}-overflow"


@dataclass
class Grant:
    """One job's standing with its user's bucket. Its WatchedJob holds it
    (watch/job.py), so a job that ends retires its value with it."""
    granted: bool = False     # holds a value of its own
    overflowed: bool = False  # counted past the bound (once)


class LabelBudget:
    def __init__(self, per_uid: int = MAX_LABELS_PER_UID, refill_s: float = LABEL_REFILL_S):
        self._buckets = Buckets(per_uid, refill_s)
        self.left_out = 0                   # jobs published under the overflow label

    def label(self, owner: str, label: str, now: float, grant: Grant) -> str:
        """What job `owner` (discovery.owner_key), called `label`, is published
        as; `grant`: the job's own standing (a new job's is a new Grant)."""
        uid = owner_uid(owner)
        if uid == 0 or grant.granted:
            return label
        if self._buckets.take(uid, now):
            grant.granted = True
            return label
        if not grant.overflowed:
            grant.overflowed = True
            self.left_out += 1
        return overflow_label(uid)
