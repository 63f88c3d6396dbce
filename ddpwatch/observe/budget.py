"""What one pass over the node may spend on one user's processes.

The daemon reads every user's ranks as root, so what a rank costs it is up to
whoever started the rank. Measured before these bounds (tests/hostile/test_hostile_second.py):
12 fake ranks of one unprivileged user, each in a user and network namespace
of its own, took the tick from about 10 ms to 550 ms: each namespace's
/proc/PID/net/tcp read walks the kernel's whole connection hash (about 5 ms),
twice a tick, and `nsenter ss` and `nsenter ip` ran for each.

A pass (sampler.survey to the next one) has one PassBudget. Per user but root
(the uid owning the rank's /proc entry: root's ranks are the operator's, a
Kubernetes node's pods among them) and in all it allows:
* `netns`: network namespaces other than the daemon's whose socket tables are
  read; past it, a table read within TABLE_MAX_AGE_S stands in;
* `helper_runs`: helper programs started (`ss`, `ip`, each under `nsenter`);
and counts what it refused under the same names, with `fds` and `threads`
(the caps of the sockets and process probes), for
`ddpwatch_left_out_total{what}`. Reads of one namespace are shared by every
job in it for the rest of the pass (`memo`). `diagnose` runs without one.
"""
from __future__ import annotations

import collections
import os

PER_UID = {"netns": 2, "helper_runs": 4}   # for every user but root
TOTAL = {"netns": 32, "helper_runs": 16}   # root's included
# A namespace's socket table read on an earlier pass stands this long for a user
# past their `netns` budget: their namespaces are read in turn, each every few
# seconds, rather than the same two every pass and the rest never.
TABLE_MAX_AGE_S = 5.0
MAX_FDS = 4096       # a rank's open files looked at for sockets (Gloo: a few hundred)
MAX_THREADS = 128    # a rank's threads read a pass (a rank has tens; see duty.py)
# a rank's children read a pass (probes/process.py WorkerObs): a DataLoader has
# num_workers of them, a few to tens
MAX_WORKERS = 16
# a process with more is not dumped: py-spy reads every thread (4 000 took it 3 s),
# and a big box's torch rank has a few hundred (intra- and inter-op pools)
MAX_DUMP_THREADS = 1024
MAX_ADDRESSES = 256  # addresses kept of one namespace's `ip addr`
MAX_OUTPUT = 1 << 20  # bytes kept of a helper program's output
MAX_JOBS_PER_UID = 8  # jobs watched per user but root (a node's 8 GPUs, one job each)
# Python processes and launchers a user but root may have read each pass
# (observe/jobs/proctable.py `set_aside`): 8 jobs of 64 ranks, each with a few
# DataLoader workers, fit
MAX_PYTHON_PER_UID = 512
# ddp_job label values per user but root: as many at once as jobs watched, one
# more each LABEL_REFILL_S (publish/label_budget.py)
MAX_LABELS_PER_UID = MAX_JOBS_PER_UID
LABEL_REFILL_S = 60.0


def left_out_kinds() -> dict[str, str]:
    """`what` -> what ddpwatch_left_out_total{what} counts, its limits read from
    the constants the code applies, so the metric's help cannot name others
    (tests/unit/publish/test_metrics.py)."""
    return {
        "jobs": f"a user's jobs past {MAX_JOBS_PER_UID} but root's, not watched",
        "netns": (f"a user's network namespaces past {PER_UID['netns']} a pass "
                  f"({TOTAL['netns']} in all) whose socket tables were not read"),
        "helper_runs": (f"ss/ip runs past {PER_UID['helper_runs']} per user a pass "
                        f"({TOTAL['helper_runs']} in all)"),
        "job_labels": (f"jobs published as uid<N>-overflow: past their user's "
                       f"{MAX_LABELS_PER_UID} ddp_job values, one more each "
                       f"{LABEL_REFILL_S:g} s"),
        "processes": (f"a user's Python processes and launchers past {MAX_PYTHON_PER_UID}, "
                      f"not read each pass (each counted once)"),
        "fds": f"a rank's open files past {MAX_FDS}",
        "threads": (f"a rank's threads past {MAX_THREADS} a pass, and those of a process "
                    f"of more than {MAX_DUMP_THREADS} not dumped"),
        "workers": f"a rank's child processes past {MAX_WORKERS} a pass, not read",
    }


def left_out_help() -> str:
    kinds = "; ".join(f"{what}: {meaning}" for what, meaning in left_out_kinds().items())
    return ("What the daemon's per-pass budgets left unread since it started, so that no "
            f"user's processes make its ticks long (observe/budget.py). {kinds}.")


class PassBudget:
    def __init__(self, per_uid: dict | None = None, total: dict | None = None):
        self.per_uid = dict(PER_UID, **(per_uid or {}))
        self.total = dict(TOTAL, **(total or {}))
        self._used: collections.Counter = collections.Counter()  # (what, uid) -> n
        self._used_total: collections.Counter = collections.Counter()
        self.left_out: collections.Counter = collections.Counter()  # what -> n refused
        self.memo: dict = {}  # (what, namespace) -> what was read: one read per pass

    def take(self, what: str, uid: int) -> bool:
        """One more `what` for `uid` this pass, if the budget allows; a refusal
        is counted."""
        if ((uid != 0 and self._used[what, uid] >= self.per_uid[what])
                or self._used_total[what] >= self.total[what]):
            self.left_out[what] += 1
            return False
        self._used[what, uid] += 1
        self._used_total[what] += 1
        return True

    def count(self, what: str, n: int = 1) -> None:
        """`n` of `what` left out by a cap (fds, threads)."""
        if n > 0:
            self.left_out[what] += n


def owner(procfs: str, pid: int) -> int:
    """The uid owning pid's /proc entry (its effective user); -1 if gone."""
    try:
        return os.stat(f"{procfs}/{pid}").st_uid
    except OSError:
        return -1


def per_user(jobs: list, key_of, uid_of, born_of, left_out) -> list:
    """The jobs watched: at most MAX_JOBS_PER_UID of each user but root, their
    oldest first, in `jobs`' order (discovery's): every job costs the tick its
    reads, and any user can start hundreds (tests/hostile/test_hostile_second.py).
    `key_of(job)`: its owner key (discovery.owner_key), `uid_of(key)` and
    `born_of(key)` read it (discovery.owner_uid, born_s); `left_out()` is called
    for each job left out (ddpwatch_left_out_total{what="jobs"})."""
    keyed = [(key_of(job), job) for job in jobs]
    kept, per_uid = set(), collections.Counter()
    for key, job in sorted(keyed, key=lambda kj: (born_of(kj[0]) or 0.0, kj[0])):
        uid = uid_of(key)
        if uid != 0 and per_uid[uid] >= MAX_JOBS_PER_UID:
            left_out()
            continue
        per_uid[uid] += 1
        kept.add(id(job))
    return [job for job in jobs if id(job) in kept]
