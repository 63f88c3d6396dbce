"""A user's ddp_job label values are bounded (ddpwatch/publish/label_budget.py):
a bucket per uid, held by a job to its end, the rest of the user's jobs
published under one overflow value; root's jobs are never bounded."""
from __future__ import annotations

from ddpwatch.observe.budget import LABEL_REFILL_S, MAX_LABELS_PER_UID
from ddpwatch.publish.label_budget import Grant, LabelBudget as Budget, overflow_label


def key(uid: int, pid: int) -> str:
    return f"u{uid}.p{pid}.s{pid * 10}"


class LabelBudget(Budget):
    """The budget with each job's Grant kept here, as its WatchedJob keeps it."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.grants: dict[str, Grant] = {}

    def label(self, owner, label, now):
        return super().label(owner, label, now, self.grants.setdefault(owner, Grant()))

    def forget(self, owners):
        for owner in owners:
            self.grants.pop(owner, None)


def test_churning_run_ids_make_a_bounded_number_of_values():
    budget, seen = LabelBudget(), set()
    for i in range(200):  # a fresh job every 3 s for 10 minutes, each gone after 6 s
        now = 3.0 * i
        seen.add(budget.label(key(65534, 1000 + i), f"fake-{i}", now))
        if i >= 2:
            budget.forget([key(65534, 1000 + i - 2)])
    bound = MAX_LABELS_PER_UID + 600 / LABEL_REFILL_S + 1
    assert overflow_label(65534) in seen and len(seen) <= bound, len(seen)
    assert budget.left_out == 200 - (len(seen) - 1)


def test_a_job_keeps_its_value_to_its_end_and_overflowed_jobs_get_one_later():
    budget = LabelBudget(per_uid=2, refill_s=60.0)
    assert budget.label(key(7, 1), "a", 0.0) == "a"
    assert budget.label(key(7, 2), "b", 0.0) == "b"
    assert budget.label(key(7, 3), "c", 0.0) == "uid7-overflow"
    assert budget.label(key(7, 3), "c", 30.0) == "uid7-overflow"
    assert budget.label(key(7, 1), "a", 30.0) == "a"     # held, not taken again
    assert budget.label(key(8, 9), "other", 30.0) == "other"  # another user's bucket
    assert budget.label(key(7, 3), "c", 61.0) == "c"     # refilled
    assert budget.left_out == 1                          # counted once, not per tick
    budget.forget([key(7, 1)])
    assert budget.label(key(7, 4), "d", 62.0) == "uid7-overflow"  # an end adds no value


def test_root_is_never_bounded():
    budget = LabelBudget(per_uid=1, refill_s=3600.0)
    assert [budget.label(key(0, i), f"r{i}", 0.0) for i in range(20)] == [
        f"r{i}" for i in range(20)]
