"""CPU contention evidence, pure parts: the share of wanted CPU time spent
waiting (schedstat), the CPUs a rank may use, and the processes competing there."""
from __future__ import annotations

from ddpwatch.judge.signals.process import competing, cpu_list, wait_share
from ddpwatch.observe.probes.competitors import Competitor, Competitors, pick
from ddpwatch.observe.probes.process import SchedStat, StatFields, ThreadObs


def thread(tid, run, wait):
    return ThreadObs(tid, "python", "R", "", -1.0, 1, SchedStat(run, wait, 0))


def test_wait_share_over_threads_seen_at_both_ends():
    before = (thread(1, 10.0, 1.0), thread(2, 5.0, 5.0))
    now = (thread(1, 10.5, 2.5), thread(2, 5.0, 5.0), thread(3, 9.0, 9.0))  # 3 is new
    assert wait_share(before, now) == 0.75  # 1.5 s waited for 0.5 s run
    assert wait_share(before, before) is None  # nothing ran or waited
    unreadable = (ThreadObs(1, "", "", "", -1.0, -1, SchedStat(-1.0, -1.0, -1)),)
    assert wait_share(unreadable, unreadable) is None


def test_cpu_list():
    assert cpu_list((0, 1, 2, 5)) == "0-2,5"
    assert cpu_list((1,)) == "1"


def st(pid, state, cpu_s, processor, ppid=100, comm="python"):
    return StatFields(pid=pid, comm=comm, state=state, ppid=ppid, pgrp=pid, session=pid,
                      cpu_seconds=cpu_s, num_threads=1, start_time_s=0.0, processor=processor)


def test_pick_running_others_on_the_ranks_cpus():
    stats = [st(10, "R", 5.0, 1), st(11, "S", 9.0, 1), st(12, "R", 9.0, 0),
             st(13, "R", 1.0, 1, ppid=2, comm="kworker/1:1"), st(20, "R", 7.0, 1),
             st(14, "R", 8.0, 1, comm="evil\x1b[31m")]
    got = pick(stats, {1}, job={20})
    assert [c.pid for c in got] == [14, 10]  # busiest first; the job's own rank left out
    assert got[0].comm == "evil?[31m"


def test_competing_names_the_busy_ones_of_the_window():
    first = Competitors(1.0, (1,), (Competitor(10, "python", 5.0, 1),
                                    Competitor(11, "yes", 3.0, 1),
                                    Competitor(12, "idle", 3.0, 1)))
    last = Competitors(3.0, (1,), (Competitor(10, "python", 5.8, 1),
                                   Competitor(11, "yes", 3.4, 1),
                                   Competitor(12, "idle", 3.01, 1),
                                   Competitor(13, "new", 9.0, 1)))
    assert competing(first, last, {1}) == "2 processes: python pid 10 40%, yes pid 11 20%"
    assert competing(first, last, {0}) is None  # none on the rank's CPUs
    assert competing(None, last, {1}) is None


def test_replayed_contention_names_the_rank_its_cpu_and_competitors():
    """Saved from tests/thirdparty/test_thirdparty_contention.py: rank 1 pinned to CPU 1 beside
    8 busy processes, each in a session of its own."""
    import os

    from conftest import REPO

    from ddpwatch.judge import classify, rules
    from ddpwatch.observe.snapshot import load
    path = os.path.join(REPO, "tests", "fixtures", "snapshots",
                        "thirdparty_spawn_contended.json")
    j = classify.judge(load(path), rules.load(os.path.join(REPO, "rules", "default.yaml")))
    one = next(v for v in j.ranks if v.rank == 1)
    assert one.rule == "straggler-starved"
    assert "on CPU 1" in one.evidence and "beside 8 processes: python pid" in one.evidence


# --- when the pass over /proc is made (probes/competitors.py others_may_run) ---

def _stat_line(pid: int, state: str, cpu_ticks: int = 500, processor: int = 1) -> str:
    # fields 3.. of proc(5): state ppid pgrp session tty tpgid flags minflt cminflt
    # majflt cmajflt utime stime ... processor is field 39
    rest = [state, "100", str(pid), str(pid), "0", "-1", "0", "0", "0", "0", "0",
            str(cpu_ticks), "0"] + ["0"] * 23 + [str(processor)] + ["0"] * 10
    return f"{pid} (python) " + " ".join(rest) + "\n"


def _fake_node(tmp_path, running: str, job: dict, outsiders: dict) -> str:
    """A /proc with /proc/loadavg's runnable count `running`, the job's ranks
    (pid -> their threads' states) and other processes (pid -> state)."""
    root = tmp_path / "proc"
    root.mkdir()
    if running:
        (root / "loadavg").write_text(f"1.00 1.00 1.00 {running}/300 4000\n")
    for pid, states in job.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "status").write_text("Name:\tpython\nCpus_allowed_list:\t0-1\n")
        (root / str(pid) / "stat").write_text(_stat_line(pid, states[0]))
        for i, state in enumerate(states):
            tid = pid if i == 0 else pid * 10 + i
            (root / str(pid) / "task" / str(tid)).mkdir(parents=True)
            (root / str(pid) / "task" / str(tid) / "stat").write_text(_stat_line(tid, state))
    for pid, state in outsiders.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "stat").write_text(_stat_line(pid, state))
    return str(root)


def test_loadavg_running_and_the_gate():
    from ddpwatch.observe.probes.competitors import others_may_run, parse_loadavg_running
    assert parse_loadavg_running("0.65 1.72 2.22 2/85 1916\n") == 2
    assert not others_may_run(1, 0)   # only this reader runs
    assert not others_may_run(3, 2)   # the reader and two of the job's threads
    assert others_may_run(4, 2)       # one more: someone else's
    assert others_may_run(None, 0)    # unknown: look


def _competitors(procfs, pids):
    from ddpwatch.observe.probes import Pass, ProbeContext
    from ddpwatch.observe.probes.competitors import run
    return run(ProbeContext(procfs=procfs, clock=lambda: 5.0), Pass(), pids)


def test_a_busy_job_alone_on_a_quiet_node_costs_no_pass(tmp_path):
    # The reader and the job's two running threads are all the kernel counts:
    # the outsider in state R on file is not read (a pass would name it).
    procfs = _fake_node(tmp_path, "3", {10: "RS", 20: "SR"}, {30: "R", 31: "S"})
    got = _competitors(procfs, (10, 20))
    assert got.procs == () and got.cpus == (0, 1)


def test_one_runnable_task_more_than_the_job_makes_the_pass(tmp_path):
    procfs = _fake_node(tmp_path, "4", {10: "RS", 20: "SR"}, {30: "R", 31: "S"})
    assert [c.pid for c in _competitors(procfs, (10, 20)).procs] == [30]


def test_a_sleeping_job_on_a_busy_node_makes_the_pass(tmp_path):
    procfs = _fake_node(tmp_path, "2", {10: "S", 20: "S"}, {30: "R"})
    assert [c.pid for c in _competitors(procfs, (10, 20)).procs] == [30]


def test_no_loadavg_makes_the_pass(tmp_path):
    procfs = _fake_node(tmp_path, "", {10: "R"}, {30: "R"})
    assert [c.pid for c in _competitors(procfs, (10,)).procs] == [30]
