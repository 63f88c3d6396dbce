"""Competitors probe: the other processes running on the CPUs a job's ranks may
use, so a rank starved of CPU (its run-queue wait, straggler-starved) is shown
with what it shares its core with ("the competing processes, if cheap
to name"). One pass over /proc/*/stat: a process is a competitor when it is
running or runnable (state R) now, on a CPU one of the ranks may run on; the
judge keeps those seen at both ends of a window whose CPU time grew.

Only on a closer look (Look.DETAIL: a job not healthy, or a person's request).
Command names come from another user's processes: labels, bounded, never paths.

The pass over /proc costs what the node runs (5 000 idle processes: ~50 ms), so
it is made only when something outside the job may be runnable: the kernel's
count of runnable tasks (/proc/loadavg) less this reader and the job's own
running threads (`others_may_run`). A job that hangs sleeps, and a healthy busy
job on a quiet node accounts for every runnable task: no pass, whatever else
sleeps beside it (benchmarks/daemon.py --only flat).
READ: `run`, `_runnable_now`, `_running_threads`. PARSE (pure): `pick`,
`parse_loadavg_running`, `others_may_run`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ... import codec
from . import Look, Pass, ProbeContext, register
from ..budget import MAX_THREADS
from .process import StatFields, parse_cpu_list, parse_stat, parse_status, read_state

MAX_COMPETITORS = 32   # kept per snapshot, the busiest first
MAX_COMM = 32


@dataclass(frozen=True)
class Competitor:
    pid: int
    comm: str
    cpu_seconds: float   # cumulative user + system
    processor: int       # the CPU it last ran on


@dataclass(frozen=True)
class Competitors:
    taken_at: float
    cpus: tuple[int, ...]          # the CPUs the job's ranks may run on (union)
    procs: tuple[Competitor, ...]  # running elsewhere than the job, on those CPUs


def pick(stats: list[StatFields], cpus: set[int], job: set[int]) -> tuple[Competitor, ...]:
    """Processes in state R on one of `cpus`, not of the job, not kernel threads."""
    found = [Competitor(st.pid, "".join(c if c.isprintable() else "?"
                                        for c in st.comm[:MAX_COMM]),
                        st.cpu_seconds, st.processor)
             for st in stats if st.state == "R" and st.pid not in job
             and st.ppid != 2 and st.pid != 2 and st.processor in cpus]
    found.sort(key=lambda c: -c.cpu_seconds)
    return tuple(found[:MAX_COMPETITORS])


def parse_loadavg_running(text: str) -> int:
    """/proc/loadavg's runnable tasks now ("0.65 1.72 2.22 2/85 1916" -> 2)."""
    return int(text.split()[3].split("/")[0])


def others_may_run(runnable: int | None, job_running: int) -> bool:
    """Whether a task outside the job may be runnable: the kernel counted
    `runnable` tasks (None: unknown), one of them this reader, `job_running` of
    them the job's. Read a moment apart, so a job thread that started running
    in between hides an outsider for this reading only."""
    return runnable is None or runnable - 1 - job_running > 0


def _runnable_now(procfs: str) -> int | None:
    try:
        return parse_loadavg_running(_read(f"{procfs}/loadavg"))
    except (OSError, ValueError, IndexError):
        return None


def _running_threads(procfs: str, pids: tuple[int, ...], enough: int) -> int:
    """The job's threads in state R, counted until `enough` (no need for more).
    At most MAX_THREADS of a rank's threads: a rank that starts more is seen by
    the budget elsewhere, and an uncounted thread only makes a pass happen."""
    running = 0
    if enough <= 0:
        return running
    for pid in pids:
        try:
            with os.scandir(f"{procfs}/{pid}/task") as entries:
                tids = [int(e.name) for _, e in zip(range(MAX_THREADS), entries)
                        if e.name.isdigit()]
        except OSError:
            continue
        for tid in tids:  # a thread gone meanwhile reads "": not running
            running += read_state(f"{procfs}/{pid}/task", tid) == "R"
            if running >= enough:
                return running
    return running


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read(65536)


# other processes running on the ranks' CPUs (state R, one /proc pass)
@register("competitors", look=Look.DETAIL)
def run(ctx: ProbeContext, seen: Pass, pids: tuple[int, ...]) -> Competitors:
    taken_at = ctx.clock()
    cpus: set[int] = set()
    for pid in pids:
        try:
            cpus |= set(parse_cpu_list(parse_status(_read(f"{ctx.procfs}/{pid}/status"))
                                       .get("Cpus_allowed_list", "")))
        except OSError:
            continue
    runnable = _runnable_now(ctx.procfs)  # unknown: no threads counted, the pass made
    if not others_may_run(runnable, _running_threads(ctx.procfs, pids, (runnable or 0) - 1)):
        return Competitors(taken_at, tuple(sorted(cpus)), ())
    stats = []
    me = os.getpid()
    for name in os.listdir(ctx.procfs):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            stats.append(parse_stat(_read(f"{ctx.procfs}/{name}/stat")))
        except (OSError, ValueError, IndexError):
            continue  # gone, or not a process entry
    return Competitors(taken_at, tuple(sorted(cpus)), pick(stats, cpus, set(pids)))


def from_json(obj) -> Competitors:
    return codec.from_json(Competitors, obj)
