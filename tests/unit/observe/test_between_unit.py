"""The daemon's window evidence (observe/window/between.py, observe/window/duty.py merge and
switches, judge/signals/window.py duty_cycled), on a fixture procfs and a fake
clock."""
import threading

from ddpwatch.judge.signals.window import link as straggle_signals, measure as window_signals
from ddpwatch.observe.window import duty as D
from ddpwatch.observe.window.between import CLOSE_INTERVAL_S, GLANCE_INTERVAL_S, BetweenTicks
from ddpwatch.observe.snapshot import Job, Snapshot


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def procfs(tmp_path, states: dict[int, str], threads=("S",)):
    proc = tmp_path / "proc"
    for pid, state in states.items():
        (proc / str(pid) / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (py) {state} 1")
        (proc / str(pid) / "task" / str(pid) / "stat").write_text(f"{pid} (py) {state} 1")
        for i, t in enumerate(threads):
            (proc / str(pid) / "task" / str(pid + 1000 + i)).mkdir(exist_ok=True)
            (proc / str(pid) / "task" / str(pid + 1000 + i) / "stat").write_text(f"x (py) {t} 1")
    return proc


def set_state(proc, pid, state):
    (proc / str(pid) / "stat").write_text(f"{pid} (py) {state} 1")


def test_switches_count_stops_and_resumes_not_stopped_readings(tmp_path):
    proc = procfs(tmp_path, {7: "R", 8: "R"})
    watch = D.DutyWatch((7, 8), Clock(), str(proc), str(tmp_path / "cg"))
    for s7, s8 in (("R", "R"), ("T", "R"), ("R", "T"), ("T", "T"), ("R", "T")):
        set_state(proc, 7, s7)
        set_state(proc, 8, s8)
        watch.read(threads=False)
    r7, r8 = watch.freeze().ranks
    assert (r7.samples, r7.stopped, r7.switches) == (5, 2, 4)  # cycled
    assert (r8.samples, r8.stopped, r8.switches) == (5, 3, 1)  # stopped once, stays so
    assert r7.main_only and r8.main_only


def test_main_only_readings_take_the_main_threads_state(tmp_path):
    # a thread computing while the main thread sleeps: running only when read in full
    proc = procfs(tmp_path, {7: "S"}, threads=("R",))
    glance = D.DutyWatch((7,), Clock(), str(proc), str(tmp_path / "cg"))
    glance.read(threads=False)
    full = D.DutyWatch((7,), Clock(), str(proc), str(tmp_path / "cg"))
    full.read(threads=True)
    assert glance.freeze().ranks[0].asleep == 1
    r = full.freeze().ranks[0]
    assert r.running == 1 and not r.main_only


def rd(pid, samples, stopped, switches, first=None, last=None, cgroup="/cg", main_only=True):
    return D.RankDuty(pid, samples, stopped, samples - stopped, 0, cgroup, 0.1, first, last,
                      switches, main_only)


def test_merge_sums_windows_and_spans_the_throttling():
    a = D.Duty(1.0, (rd(7, 4, 3, 2, D.Throttle(10, 0, 0.0), D.Throttle(20, 5, 0.3)),))
    b = D.Duty(1.1, (rd(7, 5, 3, 3, D.Throttle(20, 5, 0.3), D.Throttle(30, 12, 0.8)),
                     rd(8, 5, 0, 0)))
    m = D.merge([a, None, b])
    r7, r8 = m.ranks
    assert m.seconds == 2.1
    assert (r7.samples, r7.stopped, r7.running, r7.switches) == (9, 6, 3, 5)
    assert r7.throttle_first == D.Throttle(10, 0, 0.0) and r7.throttle_last.periods == 30
    assert r8.samples == 5
    assert D.merge([None]) is None and D.merge([a]) is a
    old = D.Duty(1.0, (rd(7, 4, 3, -1),))  # snapshots of older versions: not counted
    assert D.merge([old, b]).ranks[0].switches == -1


def snap(duty):
    return Snapshot(1, 0.0, 0.0, Job(1, -1, "spawn", (7,), "", (0,), 1), None, None, None,
                    None, None, (), duty=duty)


def test_stopped_once_in_the_window_is_no_duty_cycle():
    """A SIGSTOP during the daemon's window leaves the rank stopped half the
    window: that rank is stopped (its state says so), not a straggler."""
    just_stopped = window_signals((snap(D.Duty(2.0, (rd(7, 10, 5, 1),))),), 7)
    cycled = window_signals((snap(D.Duty(2.0, (rd(7, 10, 7, 4),))),), 7)
    old = window_signals((snap(D.Duty(2.0, (rd(7, 10, 7, -1),))),), 7)
    assert just_stopped["duty_cycled"] is False and just_stopped["stop_switches"] == 1
    assert cycled["duty_cycled"] is True and old["duty_cycled"] is True
    assert "stop_switches" not in old
    ranks = [dict(just_stopped, alive=True), dict(cycled, alive=True)]
    straggle_signals(ranks)
    assert [s["straggles"] for s in ranks] == [False, True]


def test_glance_reads_main_threads_seldom_suspicion_every_thread_often(tmp_path):
    proc = procfs(tmp_path, {7: "R", 8: "R"}, threads=("S", "S"))
    clock = Clock()
    between = BetweenTicks(clock, str(proc), str(tmp_path / "cg"), rand=lambda: 0.5)
    calm_job, odd_job = between.open(), between.open()
    assert calm_job.take((7,)) is None  # nothing read yet
    assert odd_job.take((8,)) is None
    calm_job.watch(closely=False)
    odd_job.watch(closely=True)
    stop = threading.Event()
    for _ in range(100):  # 1 s in steps of 10 ms
        between.read_due()
        clock.now += 0.01
    calm, odd = calm_job.take((7,)), odd_job.take((8,))
    assert calm.ranks[0].samples == round(1 / GLANCE_INTERVAL_S)
    assert calm.ranks[0].main_only
    assert odd.ranks[0].samples == round(1 / CLOSE_INTERVAL_S)
    assert not odd.ranks[0].main_only
    # a new window from each take; a job whose ranks changed starts afresh
    assert calm_job.take((7, 9)) is None
    between.close(calm_job)
    between.close(odd_job)
    assert between.jobs == [] and calm_job.duty is None
    stop.set()
    between.wait(clock.now + 10, stop)  # returns at once when stopped


def test_readings_are_spread_not_in_step_with_a_duty_cycle(tmp_path):
    """A rank stopped and resumed with the period of the readings is still seen
    in both states: the intervals vary."""
    proc = procfs(tmp_path, {7: "R"})
    clock = Clock()
    between = BetweenTicks(clock, str(proc), str(tmp_path / "cg"))
    job = between.open()
    job.take((7,))
    period = GLANCE_INTERVAL_S
    state = "R"
    for _ in range(4000):  # 40 s, stopped 70% of each period of the glance interval
        phase = (clock.now % period) / period
        if ("T" if phase < 0.7 else "R") != state:  # rewritten only when it changes
            state = "T" if phase < 0.7 else "R"
            set_state(proc, 7, state)
        between.read_due()
        clock.now += 0.01
    r = job.take((7,)).ranks[0]
    assert 0.55 < r.stopped / r.samples < 0.85, (r.stopped, r.samples)
    assert r.switches >= 10


def test_the_reading_thread_reads_during_ticks_and_stops(tmp_path):
    """The daemon's readings run in their own thread (a long tick on a crowded
    node left two or three readings a window)."""
    import time
    proc = procfs(tmp_path, {7: "R"})
    between = BetweenTicks(time.monotonic, str(proc), str(tmp_path / "cg"))
    job = between.open()
    job.take((7,))
    stop = threading.Event()
    between.start(stop, on_error=lambda: None)
    deadline = time.monotonic() + 30
    while between.readings < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    between._thread.join(timeout=5)
    assert not between._thread.is_alive()
    assert job.take((7,)).ranks[0].samples >= 3


def test_a_crowded_node_slows_every_rank_alike_no_straggler():
    """4 jobs x 2 ranks on 2 cores (seen in the 2-minute watch): rank 1 waited
    1.44 cores for a CPU, rank 0 0.38; both are starved, neither straggles."""
    crowded = [{"alive": True, "cpu_ratio": 0.12, "runqueue_wait_ratio": 0.379,
                "runqueue_wait_vs_peers": 0.26},
               {"alive": True, "cpu_ratio": 0.157, "runqueue_wait_ratio": 1.443,
                "runqueue_wait_vs_peers": 3.81}]
    straggle_signals(crowded)
    assert [s["peers_starved"] for s in crowded] == [True, True]
    assert not any(s["straggles"] for s in crowded)
    assert crowded[1]["cpu_wanted"] == 1.6
    # another process on rank 1's core only: its peer waits little, rank 1 straggles
    alone = [{"alive": True, "runqueue_wait_ratio": 0.05, "runqueue_wait_vs_peers": 0.1},
             {"alive": True, "runqueue_wait_ratio": 0.6, "runqueue_wait_vs_peers": 12.0}]
    straggle_signals(alone)
    assert [s["straggles"] for s in alone] == [False, True]
    # its peer waits too (beside the daemon), but it waits 5x as long: its own core
    # holds it back (nanoGPT's rank 1 beside two busy loops,
    # tests/thirdparty/test_thirdparty_contention.py)
    pinned = [{"alive": True, "runqueue_wait_ratio": 0.27, "runqueue_wait_vs_peers": 0.2},
              {"alive": True, "runqueue_wait_ratio": 1.35, "runqueue_wait_vs_peers": 5.0}]
    straggle_signals(pinned)
    assert [s["peers_starved"] for s in pinned] == [True, False]
    assert [s["straggles"] for s in pinned] == [False, True]


def test_a_rank_compiling_while_its_peer_waits_is_no_straggler():
    """torch.compile on 2 cores (a CI run, 40 s in): rank 0 compiles with every
    thread wanting a CPU, 2.5x the run-queue wait of rank 1, which already waits
    at the first collective. Rank 0 is warming up, so rank 1 waits for no
    straggler; once past its first steps, the same wait makes rank 0 one."""
    def ranks(warming):
        return [{"alive": True, "rank_age_s": 40.0, "warming_up": warming, "hb_step": 0,
                 "runqueue_wait_ratio": 0.6, "runqueue_wait_vs_peers": 6.0},
                {"alive": True, "rank_age_s": 40.0, "warming_up": warming, "hb_step": 0,
                 "runqueue_wait_ratio": 0.1, "runqueue_wait_vs_peers": 0.17}]
    compiling = ranks(True)
    straggle_signals(compiling)
    assert not compiling[0]["straggles"] and not compiling[1]["peer_straggles"]
    trained = ranks(False)
    straggle_signals(trained)
    assert trained[0]["straggles"] and trained[1]["peer_straggles"]


def test_a_job_in_its_first_seconds_without_steps_has_no_starved_straggler():
    """Lightning's rank 0 in a set-up collective while the rank it re-executed
    still imports, 17 s after launch (seen in the 2-minute watch)."""
    def ranks(age, hb_step=None):
        return [{"alive": True, "rank_age_s": age + 10, "runqueue_wait_ratio": 0.15,
                 "runqueue_wait_vs_peers": 0.2, "hb_step": hb_step},
                {"alive": True, "rank_age_s": age, "runqueue_wait_ratio": 0.75,
                 "runqueue_wait_vs_peers": 5.0, "hb_step": hb_step}]
    young = ranks(8.0)
    straggle_signals(young)
    assert young[1]["job_starting"] and not young[1]["straggles"]
    later = ranks(60.0)
    straggle_signals(later)
    assert not later[1]["job_starting"] and later[1]["straggles"]
    stepping = ranks(4.0, hb_step=118)  # heartbeats say it trains already
    straggle_signals(stepping)
    assert not stepping[1]["job_starting"]
