"""A kept stack dump and what it still says (judge/signals/stack.py `measure`,
judge/signals/lookup.py `stacks_of`), over hand-built snapshots.

py-spy runs at most every stacks_min_interval_s per job, and looks in between
carry the last dump (observe/sampler.py still_current). The job behind the
numbers: tests/daemon/test_soak.py's DataLoader job, whose ranks wait 3 s for
each epoch's new workers. A dump of DDP's backward taken before such a wait,
carried by both snapshots of the window, was "in 2 of 2 stack samples" beside
0% CPU and idle links: `blocked_in_collective` on two ticks, and a page in CI."""
from __future__ import annotations

import os

from conftest import REPO

from ddpwatch.judge import classify, rules as rules_mod
from ddpwatch.judge.signals.stack import measure
from ddpwatch.observe.probes.process import ProcessObs, Processes, SchedStat, ThreadObs
from ddpwatch.observe.probes.sockets import PidSockets, Sockets, TcpSocket
from ddpwatch.observe.probes.stacks import PidStacks, Stacks, parse_dump
from ddpwatch.observe.snapshot import Job, Snapshot

R0, R1, MASTER = 10, 11, 29500
ENV = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(MASTER), "WORLD_SIZE": "2"}
PYSPY = os.path.join(REPO, "tests", "fixtures", "pyspy")


def dump_of(name):
    with open(os.path.join(PYSPY, name)) as f:
        return parse_dump(f.read())


BACKWARD = dump_of("ddp_backward_rank0_reducer_wait.json")  # DDP's backward, waiting
SLEEPING = dump_of("allreduce_rank1_sleeping.json")          # time.sleep outside any collective


def proc(pid, rank, main_run_s):
    """A rank whose main thread has run `main_run_s` and used as much CPU."""
    main = ThreadObs(pid, "python", "S", "", main_run_s, 0, SchedStat(main_run_s, 0.0, 1))
    return ProcessObs(pid, ppid=1000, state="S", cpu_seconds=main_run_s, threads=(main,),
                      env=dict(ENV, RANK=str(rank)), start_time_s=1.0)


def pair(idle_ms):
    def tcp(local, peer):
        return TcpSocket(1, "tcp", "ESTABLISHED", "127.0.0.1", local, "127.0.0.1", peer, 0, 0, 0,
                         last_send_ms=idle_ms, last_recv_ms=idle_ms)
    return Sockets(0.0, (PidSockets(R0, sockets=(tcp(41000, 50000),)),
                         PidSockets(R1, sockets=(tcp(50000, 41000),))))


def kept(ran_then, dump=BACKWARD, taken_at=-2.0):
    """One py-spy reading of both ranks, taken at `taken_at` with their main
    threads' run time then `ran_then`."""
    return Stacks(taken_at, "py-spy", tuple(
        PidStacks(pid, "ok", "S", False, dump, main_run_s=ran_then) for pid in (R0, R1)))


def snap(at, main_run_s, stacks, idle_ms):
    procs = Processes(at, 1000.0 + at, 100, (proc(R0, 0, main_run_s), proc(R1, 1, main_run_s)))
    job = Job(1000, -1, "torchrun", (R0, R1), "", (0, 1), 2)
    return Snapshot(1, at, at, job, procs, pair(idle_ms), stacks, None, None, (),
                    seen_training=True)


def window(ran_then, ran_now, stacks=None):
    """Two looks 3 s apart carrying the same kept reading; 0.3% CPU in between,
    the ranks' link idle for 3 s at the end."""
    stacks = stacks or kept(ran_then)
    return (snap(0.0, ran_now - 0.01, stacks, 100), snap(3.0, ran_now, stacks, 3000))


RULES = rules_mod.load(os.path.join(REPO, "rules", "default.yaml"))


def test_a_kept_wait_whose_main_thread_ran_since_is_no_evidence_and_no_hang():
    history = window(ran_then=10.0, ran_now=10.09)  # a step's end, workers forked
    s = measure(history, R0)
    assert (s["stack"], s["stack_samples"], s["stack_moved_on"]) == (None, 0, 1)
    judged = classify.judge(history, RULES)
    assert "blocked_in_collective" not in {v.verdict for v in judged.ranks}, [
        (v.verdict, v.rule, v.evidence) for v in judged.ranks]
    assert judged.job.verdict != "blocked_in_collective"
    # no rule for a rank seen idle with no stack of now: said as such, not as a
    # daemon without access to the ranks
    unknown = [v for v in judged.ranks if v.verdict == "unknown"]
    assert unknown and all("dump showed a collective wait that its main thread has left since"
               in v.evidence and "ptrace" not in v.remedy for v in unknown), [
        (v.evidence, v.remedy) for v in unknown]


def test_a_main_thread_still_asleep_in_the_wait_keeps_its_dump_and_is_blocked():
    history = window(ran_then=10.0, ran_now=10.0)
    s = measure(history, R0)
    assert (s["stack"], s["stack_samples"], s["stack_moved_on"]) == ("ddp_backward", 1, 0)
    judged = classify.judge(history, RULES)
    assert {v.verdict for v in judged.ranks} == {"blocked_in_collective"}, [
        (v.verdict, v.rule) for v in judged.ranks]
    assert "in 1 of 1 stack samples" in judged.ranks[0].evidence


def test_one_reading_carried_by_two_looks_is_one_sample():
    history = window(ran_then=10.0, ran_now=10.0)
    assert measure(history, R0)["stack_samples"] == 1
    fresh = (snap(0.0, 10.0, kept(10.0, taken_at=0.0), 100),
             snap(3.0, 10.0, kept(10.0, taken_at=3.0), 3000))
    assert measure(fresh, R0)["stack_samples"] == 2


def test_only_waits_are_dropped_and_an_unknown_run_time_changes_nothing():
    # outside any collective (a sleep, a compile): where it was is still the news
    busy = measure(window(10.0, 11.0, kept(10.0, SLEEPING)), R0)
    assert (busy["stack_samples"], busy["stack_moved_on"]) == (1, 0)
    # a dump without the run time (older snapshots, replay fixtures): as before
    old = measure(window(10.0, 11.0, kept(-1.0)), R0)
    assert (old["stack"], old["stack_moved_on"]) == ("ddp_backward", 0)
