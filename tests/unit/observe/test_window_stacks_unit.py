"""Stack dumps inside diagnose's window (observe/window/window_stacks.py) and what the
stack signals make of 4 samples where there were 2: a rank seen
waiting in some samples is training; in all of them, stuck."""
import os
import threading
import time

from ddpwatch.judge.signals import state as state_signals
from ddpwatch.judge.signals.lookup import stacks_of
from ddpwatch.judge.signals.stack import measure as stack_signals
from ddpwatch.observe.probes import ProbeContext, ProbeResult
from ddpwatch.observe.probes.stacks import PidStacks, Stacks, parse_dump
from ddpwatch.observe.snapshot import Job, Snapshot, load, save
from ddpwatch.observe.window.window_stacks import WindowStacks, dump_times

from conftest import REPO

PYSPY = os.path.join(REPO, "tests", "fixtures", "pyspy")


def threads(name):
    with open(os.path.join(PYSPY, name)) as f:
        return parse_dump(f.read())


WAIT = threads("allreduce_rank0_blocked.json")       # main thread in all_reduce's wait
ELSEWHERE = threads("allreduce_rank1_sleeping.json")  # main thread in time.sleep


def dump(pid, at, ts):
    return Stacks(at, "py-spy", (PidStacks(pid, "ok", "S", False, ts),))


def snap(at, stacks, middle=()):
    job = Job(1, -1, "spawn", (10, 11), "", (0, 1), 2)
    return Snapshot(1, at, at, job, None, None, stacks, None, None, (), window_stacks=middle)


def test_dump_times_between_the_ends():
    assert dump_times(10.0, 11.5) == (10.5, 11.0)
    assert dump_times(10.0, 11.0, 3) == (10.25, 10.5, 10.75)
    assert dump_times(10.0, 10.0) == () and dump_times(10.0, 11.0, 0) == ()


def test_stacks_of_in_time_order_window_dumps_first():
    history = (snap(0.0, dump(10, 0.0, WAIT)),
               snap(1.0, dump(10, 1.0, ELSEWHERE), (dump(10, 0.3, WAIT), dump(10, 0.6, WAIT))))
    assert [d.threads for d in stacks_of(history, 10)] == [WAIT, WAIT, WAIT, ELSEWHERE]
    assert stacks_of(history, 11) == []


def judged(kinds):
    """Signals of pid 10, idle (CPU 1%), without heartbeats, its dumps in order."""
    dumps = [dump(10, i / 3, WAIT if k == "wait" else ELSEWHERE) for i, k in enumerate(kinds)]
    history = (snap(0.0, dumps[0]), snap(1.0, dumps[-1], tuple(dumps[1:-1])))
    s = {"pid": 10, "alive": True, "hb": False, "cpu_ratio": 0.01,
         **stack_signals(history, 10)}
    state_signals.measure(s, history[-1])
    return s


def test_waiting_in_every_sample_is_blocked_in_some_is_not():
    stuck = judged(["wait"] * 4)
    assert (stuck["stack"], stuck["stack_samples"], stuck["stack_waits"]) == ("collective", 4, 4)
    assert stuck["blocked"] and stuck["in_collective"]
    # both ends of the window in the wait, the middle elsewhere: two dumps said stuck
    ends = judged(["wait", "sleep", "sleep", "wait"])
    assert (ends["stack"], ends["stack_waits"]) == ("mixed", 2)
    assert not ends["blocked"] and not ends["in_collective"]
    once = judged(["sleep", "wait", "sleep", "sleep"])
    assert once["stack_waits"] == 1 and not once["blocked"]


def test_the_window_dumps_roundtrip_and_old_snapshots_load(tmp_path):
    history = (snap(0.0, dump(10, 0.0, WAIT)),
               snap(1.0, dump(10, 1.0, WAIT), (dump(10, 0.5, ELSEWHERE),)))
    path = str(tmp_path / "h.json")
    save(history, path)
    assert load(path) == history
    # a fixture saved before the window's dumps: two samples, as then
    old = load(os.path.join(REPO, "tests", "fixtures", "snapshots", "thirdparty_spawn_hung.json"))
    assert all(s.window_stacks == () for s in old)


def fake_run(calls, delay=0.0):
    def run(probe, ctx, this_pass, pids):
        calls.append((probe.name, probe.options.get("native", False), pids, time.monotonic()))
        time.sleep(delay)
        return ProbeResult(probe.name, True, delay, dump(pids[0], time.monotonic(), WAIT))
    return run


def test_window_stacks_dump_on_time_without_native_frames():
    calls = []
    now = time.monotonic()
    ctx = ProbeContext()  # diagnose --native or not: the window's stacks probe is its own
    dumps = WindowStacks(ctx, (10, 11), (now + 0.05, now + 0.1), run=fake_run(calls))
    time.sleep(0.3)
    got = dumps.stop()
    assert len(got) == 2 and [c[:3] for c in calls] == [("stacks", False, (10, 11))] * 2
    assert calls[0][3] >= now + 0.05 and calls[1][3] >= now + 0.1


def test_stop_skips_dumps_not_yet_due_and_waits_for_one_under_way():
    calls = []
    now = time.monotonic()
    dumps = WindowStacks(ProbeContext(), (10,), (now, now + 60), run=fake_run(calls, 0.2))
    time.sleep(0.05)  # the first dump is under way
    started = time.monotonic()
    got = dumps.stop()
    assert len(got) == 1 and len(calls) == 1
    assert time.monotonic() - started < 5  # not the 60 s of the second
    assert not any(t.name == "ddpwatch-window-stacks" and t.is_alive()
                   for t in threading.enumerate())


def test_failed_dumps_are_left_out_and_no_pids_no_thread():
    def failing(probe, ctx, this_pass, pids):
        return ProbeResult(probe.name, False, 0.0, None, "FileNotFoundError: py-spy not found")
    now = time.monotonic()
    assert WindowStacks(ProbeContext(), (10,), (now,), run=failing).stop() == ()
    assert WindowStacks(ProbeContext(), (), (now,), run=failing).stop() == ()


def test_a_job_seen_in_backward_with_every_rank_connected_is_no_longer_starting():
    from ddpwatch.judge.signals.window import link

    def ranks(backward, unconnected=0):
        return [{"alive": True, "rank_age_s": 8.0, "gloo_unconnected": unconnected,
                 "stack_backward": backward, "runqueue_wait_ratio": 0.6, "cpu_ratio": 0.2,
                 "runqueue_wait_vs_peers": 12.0},
                {"alive": True, "rank_age_s": 8.0, "gloo_unconnected": 0,
                 "stack_backward": 0, "runqueue_wait_ratio": 0.05, "cpu_ratio": 0.1}]
    young = ranks(0)
    link(young)
    assert young[0]["job_starting"] and not young[0]["straggles"]
    trained = ranks(1)
    link(trained)
    assert not trained[0]["job_starting"] and trained[0]["straggles"]
    # a rank still connecting to its peers: a backward elsewhere is no evidence yet
    connecting = ranks(1, unconnected=1)
    link(connecting)
    assert connecting[0]["job_starting"]


def test_stack_backward_counts_samples_in_autograds_backward():
    from ddpwatch.observe.probes.stacks import Frame, ThreadStack
    backward = (ThreadStack(1, 10, "MainThread", False, False, (
        Frame("_engine_run_backward", "torch/autograd/graph.py", "", "graph.py", 829),
        Frame("backward", "torch/autograd/__init__.py", "", "__init__.py", 347),
        Frame("demo_basic", "spawn_ddp.py", "", "spawn_ddp.py", 66))),)
    history = (snap(0.0, dump(10, 0.0, ELSEWHERE)),
               snap(1.0, dump(10, 1.0, ELSEWHERE), (dump(10, 0.5, backward),)))
    s = stack_signals(history, 10)
    assert (s["stack_backward"], s["stack_samples"]) == (1, 3)
    assert stack_signals(history[:1], 10)["stack_backward"] == 0
