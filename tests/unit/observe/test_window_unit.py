"""The sampled window (observe/window/duty.py, judge/signals/window.py) and a rank's place
in its job (judge/signals/launch.py), on fixture text and hand-built snapshots."""
import dataclasses
import os

from ddpwatch.judge.signals.launch import measure as launch_signals, orphan as orphan_signals
from ddpwatch.judge.signals.launch import store_port
from ddpwatch.judge.signals.window import link as straggle_signals, measure as window_signals
from ddpwatch.observe.window import duty as D
from ddpwatch.observe.probes.process import ProcessObs, Processes
from ddpwatch.observe.probes.sockets import PidSockets, Sockets, TcpSocket
from ddpwatch.observe.snapshot import Job, Snapshot


def test_parse_state_and_cgroup_lines():
    assert D.parse_state("42 (py (x) T) T 1 2 3") == "T"
    assert D.parse_state("") == ""
    v1 = "12:cpu,cpuacct:/ddp/a\n4:memory:/m\n0::/user.slice\n"
    assert D.parse_cgroup(v1) == ("v1", "/ddp/a")
    assert D.parse_cgroup("0::/system.slice/x.service\n") == ("v2", "/system.slice/x.service")
    assert D.parse_cgroup("0::/../../etc\n") == ("", "")  # never a path out of the root
    assert D.parse_cgroup("junk") == ("", "")


def test_parse_cpu_stat_v1_and_v2_and_quota():
    v2 = "usage_usec 100\nnr_periods 50\nnr_throttled 40\nthrottled_usec 2500000\n"
    assert D.parse_cpu_stat(v2) == D.Throttle(50, 40, 2.5)
    v1 = "nr_periods 10\nnr_throttled 5\nthrottled_time 1500000000\n"
    assert D.parse_cpu_stat(v1) == D.Throttle(10, 5, 1.5)
    assert D.parse_cpu_stat("garbage") == D.Throttle(-1, -1, -1.0)
    assert D.parse_quota("v2", cpu_max="20000 100000\n") == 0.2
    assert D.parse_quota("v2", cpu_max="max 100000") == -1.0
    assert D.parse_quota("v1", quota_us="-1", period_us="100000") == -1.0
    assert D.parse_quota("v1", quota_us="50000\n", period_us="100000\n") == 0.5
    assert D.parse_quota("v2", cpu_max="") == -1.0


def test_duty_watch_on_a_fixture_procfs(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    for tid, state in ((7, "T"), (8, "S")):
        (proc / "7" / "task" / str(tid)).mkdir(parents=True)
        (proc / "7" / "task" / str(tid) / "stat").write_text(f"{tid} (python) {state} 1")
    (proc / "7" / "stat").write_text("7 (python) T 1")
    (proc / "7" / "cgroup").write_text("3:cpu:/slow\n")
    (cg / "cpu" / "slow").mkdir(parents=True)
    (cg / "cpu" / "slow" / "cpu.stat").write_text("nr_periods 10\nnr_throttled 1\nthrottled_time 0\n")
    (cg / "cpu" / "slow" / "cpu.cfs_quota_us").write_text("10000")
    (cg / "cpu" / "slow" / "cpu.cfs_period_us").write_text("100000")
    clock = iter(range(100)).__next__
    watch = D.DutyWatch((7, 99), clock, str(proc), str(cg))
    for _ in range(3):
        watch.read()
    (proc / "7" / "stat").write_text("7 (python) S 1")
    (proc / "7" / "task" / "7" / "stat").write_text("7 (python) R 1")
    watch.read()
    (cg / "cpu" / "slow" / "cpu.stat").write_text(
        "nr_periods 20\nnr_throttled 9\nthrottled_time 500000000\n")
    duty = watch.freeze()
    mine, gone = duty.ranks
    assert (mine.samples, mine.stopped, mine.running, mine.asleep) == (4, 3, 1, 0)
    assert mine.cgroup == os.path.normpath(f"{cg}/cpu/slow") and mine.quota_cores == 0.1
    assert mine.throttle_last == D.Throttle(20, 9, 0.5)
    assert gone.samples == 0 and gone.cgroup == ""
    assert duty.seconds == 3


def test_a_window_nobody_reads_costs_no_cgroup_file_and_hands_on_what_it_knew(tmp_path):
    """DutyWatch reads a rank's cgroup at the window's first reading, not when
    the window is made: a daemon with readings off (reading_s: 0) makes one per
    job per tick. A window handed on without readings gives the next which
    cgroup and quota, and no cpu.stat from before that window's readings."""
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    (proc / "7" / "task" / "7").mkdir(parents=True)
    (proc / "7" / "stat").write_text("7 (python) S 1")
    (proc / "7" / "task" / "7" / "stat").write_text("7 (python) S 1")
    (proc / "7" / "cgroup").write_text("3:cpu:/slow\n")
    (cg / "cpu" / "slow").mkdir(parents=True)
    stat = cg / "cpu" / "slow" / "cpu.stat"
    stat.write_text("nr_periods 10\nnr_throttled 1\nthrottled_time 0\n")
    (cg / "cpu" / "slow" / "cpu.cfs_quota_us").write_text("10000")
    (cg / "cpu" / "slow" / "cpu.cfs_period_us").write_text("100000")
    clock = iter(range(100)).__next__
    unread = D.DutyWatch((7,), clock, str(proc), str(cg))
    (proc / "7" / "cgroup").write_text("3:cpu:/elsewhere\n")  # not read: nobody asked yet
    handed = unread.handed_on()
    assert unread.cgroups is None and handed == {}
    first = D.DutyWatch((7,), clock, str(proc), str(cg))
    (proc / "7" / "cgroup").write_text("3:cpu:/slow\n")
    first.read()
    stat.write_text("nr_periods 20\nnr_throttled 5\nthrottled_time 100000000\n")
    directory = os.path.normpath(f"{cg}/cpu/slow")
    assert first.freeze().ranks[0].throttle_first == D.Throttle(10, 1, 0.0)
    # a window without readings hands on the cgroup and quota, not its cpu.stat
    idle = D.DutyWatch((7,), clock, str(proc), str(cg), first.handed_on())
    assert idle.handed_on() == {7: (directory, 0.1, None)}
    (proc / "7" / "cgroup").write_text("3:cpu:/elsewhere\n")  # known: not read again
    stat.write_text("nr_periods 30\nnr_throttled 6\nthrottled_time 200000000\n")
    later = D.DutyWatch((7,), clock, str(proc), str(cg), idle.handed_on())
    later.read()
    rank = later.freeze().ranks[0]
    assert rank.cgroup == directory and rank.throttle_first == D.Throttle(30, 6, 0.2)


def snap(duty=None, job=None, procs=(), sockets=None):
    job = job or Job(1, -1, "spawn", (10, 11), "", (0, 1), 2)
    return Snapshot(1, 0.0, 0.0, job, Processes(0.0, 100.0, 100, tuple(procs)), sockets,
                    None, None, None, (), duty=duty)


def rank_duty(pid, samples, stopped, running, asleep, throttle=None):
    first, last = throttle or (None, None)
    return D.RankDuty(pid, samples, stopped, running, asleep, "/cg" if throttle else "",
                      0.1 if throttle else -1.0, first, last)


def test_window_signals_shares_and_throttling():
    duty = D.Duty(1.0, (rank_duty(10, 20, 14, 6, 0),
                        rank_duty(11, 20, 0, 2, 18, (D.Throttle(10, 0, 0.0),
                                                     D.Throttle(20, 8, 0.6)))))
    h = (snap(duty),)
    assert window_signals(h, 10) == {"duty_samples": 20, "stopped_share": 0.7,
                                     "running_share": 0.3, "asleep_share": 0.0,
                                     "duty_cycled": True}
    s11 = window_signals(h, 11)
    assert s11["throttled_share"] == 0.8 and s11["throttled_s"] == 0.6
    assert s11["cpu_quota"] == 0.1 and s11["cgroup"] == "/cg"
    few = D.Duty(0.1, (rank_duty(10, 2, 2, 0, 0),))
    assert window_signals((snap(few),), 10) == {"duty_samples": 2}  # no share from 2
    assert window_signals((snap(None),), 10) == {}


def test_straggles_part_stopped_or_throttled_not_fully_stopped():
    ranks = [{"alive": True, "stopped_share": 0.7}, {"alive": True, "stopped_share": 1.0},
             {"alive": True, "throttled_share": 0.5}, {"alive": True}]
    straggle_signals(ranks)
    assert [s["straggles"] for s in ranks] == [True, False, True, False]
    assert [s["peer_straggles"] for s in ranks] == [True, True, True, True]


def sock(state, local, peer):
    return TcpSocket(0, "ipv4", state, "127.0.0.1", local, "127.0.0.1" if peer else "*", peer,
                     0, 0, 0)


def proc(pid, env=None):
    return ProcessObs(pid, ppid=1, state="S", env=env or {})


def test_store_port_from_the_wire_when_no_rank_names_it():
    # rank 0 (pid 10) hosts the store on 5000 and is its own client; Gloo on 6000/6001
    socks = Sockets(0.0, (
        PidSockets(10, "", (sock("LISTEN", 5000, 0), sock("LISTEN", 6000, 0),
                            sock("ESTABLISHED", 40000, 5000), sock("ESTABLISHED", 5000, 40000),
                            sock("ESTABLISHED", 5000, 40001),
                            sock("ESTABLISHED", 6000, 40002))),
        PidSockets(11, "", (sock("LISTEN", 6001, 0), sock("ESTABLISHED", 40001, 5000),
                            sock("ESTABLISHED", 40002, 6000)))))
    s = snap(procs=(proc(10), proc(11)), sockets=socks)
    assert store_port(s) == 5000
    got = launch_signals((s,), 11, {"rank": -1, "world_size": -1, "alive": True,
                                    "all_ranks_local": False})
    assert got == {"rank": 1, "rank_source": "launch", "world_size": 2, "store_port": 5000,
                   "gloo_unconnected": 0, "all_ranks_local": True}
    # before Gloo connects: one peer still unconnected (the `starting` rule's evidence)
    early = dataclasses.replace(socks, pids=tuple(
        dataclasses.replace(p, sockets=tuple(k for k in p.sockets if 6000 not in (
            k.local_port, k.peer_port))) for p in socks.pids))
    got = launch_signals((snap(procs=(proc(10), proc(11)), sockets=early),), 10,
                         {"rank": -1, "world_size": -1})
    assert got["gloo_unconnected"] == 1
    # an environment's MASTER_PORT wins; junk there is no port
    assert store_port(snap(procs=(proc(10, {"MASTER_PORT": "7000"}), proc(11)))) == 7000
    assert store_port(snap(procs=(proc(10, {"MASTER_PORT": "99999"}), proc(11)),
                           sockets=Sockets(0.0, ()))) == -1


def test_rank_numbers_prefer_env_then_record_then_launch_then_unknown():
    h = (snap(job=Job(1, -1, "spawn", (10, 11), "", (0, -1), -1)),)
    assert launch_signals(h, 10, {"rank": 3})["rank_source"] == "env"
    assert launch_signals(h, 10, {"rank": -1, "hb_rank": 1}) == {"rank_source": "record"}
    assert launch_signals(h, 10, {"rank": -1})["rank"] == 0
    assert launch_signals(h, 11, {"rank": -1}) == {"rank_source": "unknown"}


def test_orphan_is_a_leftover_only():
    progressing = {"orphan": True, "cpu_ratio": 0.8, "gloo_unconnected": 0}
    assert orphan_signals(progressing)["orphan"] is False
    assert orphan_signals({"orphan": True, "hb_advanced": True})["orphan"] is False
    # stuck beside a live peer (stopped, hung): the job's hang, not a leftover
    stuck = {"orphan": True, "cpu_ratio": 0.0, "blocked": True, "peers_alive": 1}
    assert orphan_signals(stuck) == {"parent_gone": True, "progressing": False, "orphan": False}
    alone = {"orphan": True, "cpu_ratio": 0.0, "blocked": True, "peers_alive": 0}
    assert orphan_signals(alone) == {"parent_gone": True, "progressing": False, "orphan": True}
    assert orphan_signals({"orphan": True, "cpu_ratio": 0.0})["orphan"] is True  # no peers known
    assert orphan_signals({"orphan": False})["orphan"] is False


def test_ranks_of_one_cgroup_read_its_cpu_stat_once_a_window_end(tmp_path, monkeypatch):
    """A job's ranks mostly share one cgroup: DutyWatch.freeze reads each
    cgroup's cpu.stat once for all of them (256 ranks, one file), and ranks of
    another cgroup still get their own."""
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    for pid, group in ((7, "a"), (8, "a"), (9, "b")):
        (proc / str(pid) / "task" / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (python) S 1")
        (proc / str(pid) / "task" / str(pid) / "stat").write_text(f"{pid} (python) S 1")
        (proc / str(pid) / "cgroup").write_text(f"3:cpu:/{group}\n")
    for group, periods in (("a", 10), ("b", 70)):
        (cg / "cpu" / group).mkdir(parents=True)
        (cg / "cpu" / group / "cpu.stat").write_text(
            f"nr_periods {periods}\nnr_throttled 1\nthrottled_time 0\n")
    clock = iter(range(100)).__next__
    watch = D.DutyWatch((7, 8, 9), clock, str(proc), str(cg))
    watch.read()
    reads = []
    real = D._cpu_stat
    monkeypatch.setattr(D, "_cpu_stat", lambda d: reads.append(d) or real(d))
    duty = watch.freeze()
    both = sorted({os.path.normpath(f"{cg}/cpu/{g}") for g in "ab"})
    assert sorted(reads) == both
    assert [r.throttle_last.periods for r in duty.ranks] == [10, 10, 70]
    # a window handed on without a cpu.stat (its last had no readings) reads
    # them at its first reading, once per cgroup too (DutyWatch._start)
    idle = D.DutyWatch((7, 8, 9), clock, str(proc), str(cg), watch.handed_on())
    later = D.DutyWatch((7, 8, 9), clock, str(proc), str(cg), idle.handed_on())
    reads.clear()
    later.read()
    assert sorted(reads) == both
    assert [r.throttle_first.periods for r in later.freeze().ranks] == [10, 10, 70]
