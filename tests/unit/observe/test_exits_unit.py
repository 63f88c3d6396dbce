"""The exits probe's parsing (netlink process-event datagrams as the kernel sends
them), its bounds, the daemon's book of departed ranks and held jobs, and the
exits signals. Pure; plus one check that the connector works on this machine."""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time

from conftest import REPO, need, wait_until

from ddpwatch.judge import signals
from ddpwatch.observe.system import proc_events
from departures_book import Book as Departures
from ddpwatch.observe.probes import exits
from ddpwatch.observe.probes.exits import Exits, ProcessExit
from ddpwatch.observe.snapshot import Job

# Datagrams captured from this kernel (6.18): `sleep` SIGKILLed (pid 31792, wait
# status 9), `sh -c 'exit 1'` (31795, 0x100), a thread (31797 of group 31796,
# exit_signal -1), and the connector's answer to LISTEN (PROC_EVENT_NONE, err 0).
HEADER = bytes.fromhex("4c000000030000000100000000000000"  # nlmsghdr: 76 bytes, DONE
                       "01000000010000000000000000000000"  # cn_msg: idx 1, val 1
                       "2800" "0000")                      # len 40, flags
KILLED = HEADER + bytes.fromhex("00000080" "01000000" "40e2010000000000"
                                "307c0000307c00000900000011000000077c0000077c0000")
EXIT_1 = HEADER + bytes.fromhex("00000080" "00000000" "80f0fa0200000000"
                                "337c0000337c00000001000011000000fa7b0000fa7b0000")
THREAD = HEADER + bytes.fromhex("00000080" "00000000" "0000000000000000"
                                "357c0000347c000000000000ffffffff0000000000000000")
ACK = HEADER + bytes.fromhex("00000000" "00000000" "0000000000000000" + "00" * 24)


def test_parse_exit_datagrams():
    assert proc_events.parse_datagram(KILLED) == [(31792, 31792, 9, 31751, 123456)]
    assert proc_events.parse_datagram(EXIT_1) == [(31795, 31795, 256, 31738, 50000000)]
    assert proc_events.parse_datagram(THREAD)[0][:2] == (31797, 31796)
    assert proc_events.parse_datagram(ACK) == []
    assert proc_events.parse_ack(ACK) == 0 and proc_events.parse_ack(KILLED) is None
    # two messages in one datagram; the old kernels' exit data without the parent
    short = bytearray(KILLED[:-8])
    struct.pack_into("=I", short, 0, len(short))
    struct.pack_into("=H", short, 32, 32)
    assert proc_events.parse_datagram(EXIT_1 + bytes(short)) == [
        (31795, 31795, 256, 31738, 50000000), (31792, 31792, 9, -1, 123456)]


def test_parse_never_raises_on_garbage():
    for data in (b"", b"\x00" * 15, KILLED[:40], KILLED[:60], b"\xff" * 76,
                 struct.pack("=I", 8) + KILLED[4:], struct.pack("=I", 1 << 30) + KILLED[4:]):
        assert proc_events.parse_datagram(data) == [] or len(data) == 76
    wrong_group = bytearray(KILLED)
    struct.pack_into("=I", wrong_group, 16, 2)
    assert proc_events.parse_datagram(bytes(wrong_group)) == []
    too_short = bytearray(KILLED)
    struct.pack_into("=H", too_short, 32, 16)  # cn_msg says 16 bytes: no exit data
    assert proc_events.parse_datagram(bytes(too_short)) == []


def test_wait_status_decoded_as_waitpid_would():
    assert exits.decode_status(9) == (-1, 9, False)
    assert exits.decode_status(0x86) == (-1, 6, True)    # SIGABRT, core dumped
    assert exits.decode_status(0x100) == (1, 0, False)
    assert exits.decode_status(0) == (0, 0, False)
    e = exits.to_exit(5, 9, 1, 10.0, oom_kills=1)
    assert e.how == "was killed by SIGKILL (the kernel's OOM killer)" and e.abnormal
    assert exits.to_exit(5, 0x100, 1, 1.0).how == "exited with code 1"
    assert exits.to_exit(5, 15, 1, 1.0).asked_to_stop
    assert exits.to_exit(5, 0x86, 1, 1.0).how == "was killed by SIGABRT (core dumped)"
    assert exits.signal_name(99) == "signal 99"


def test_oom_kill_count_from_vmstat():
    assert exits.oom_kill_count("pgfault 12\noom_kill 3\nx 1\n") == 3
    assert exits.oom_kill_count("pgfault 12\n") is None
    assert exits.oom_kill_count("oom_kill many\n") is None


class _Sock:
    """Datagrams as recvfrom gives them: (data, (sender port, groups))."""

    def __init__(self, grams):
        self.grams = list(grams)

    def recvfrom(self, n):
        if not self.grams:
            raise BlockingIOError
        return self.grams.pop(0)


def _watch(grams, procfs="/nonexistent"):
    watch = exits.ExitWatch(_Sock(grams), lambda: 1000.0, procfs)
    return watch


def _gram(pid, status, stamp_ns=None):
    data = bytearray(KILLED)
    struct.pack_into("=iiI", data, proc_events.EXIT_AT, pid, pid, status)
    struct.pack_into("=Q", data, proc_events.EVENT_AT + 8,
                     time.monotonic_ns() if stamp_ns is None else stamp_ns)
    return bytes(data)


def test_watch_keeps_watched_pids_only_and_drops_forged_senders():
    grams = [(_gram(p, 9), (0, 1)) for p in range(100, 3100)]  # a fork bomb's exits
    grams.append((_gram(42, 9), (0, 1)))
    grams.append((_gram(43, 9), (4242, 0)))  # another process unicasting to us
    watch = _watch(grams)
    got = watch.snapshot(frozenset({42, 43, 150}))
    assert sorted(e.pid for e in got.exits) == [42, 150]


def test_watch_is_bounded():
    grams = [(_gram(p, 9), (0, 1)) for p in range(1, exits.MAX_KEPT + 101)]
    watch = _watch(grams)
    got = watch.snapshot(frozenset(range(1, exits.MAX_KEPT + 101)))
    assert len(got.exits) == exits.MAX_KEPT
    assert min(e.pid for e in got.exits) == 101  # the newest kept


def _exit(pid, at, status):
    return exits.to_exit(pid, status, 1, at)


SPAWN = Job(target_pid=11, launcher_pid=10, launcher_kind="spawn", rank_pids=(11, 12),
            run_id="", ranks=(0, 1), world_size=2)


def _exits(*items):
    return Exits(100.0, 0.0, tuple(items))


def test_a_job_gone_with_a_killed_rank_is_held_then_let_go():
    book = Departures(hold_s=30)
    assert book.update([("k", "job", SPAWN)], _exits(), 0.0) == [("k", "job", SPAWN)]
    ended = _exits(_exit(12, 50.0, 9), _exit(11, 50.02, 0x100), _exit(10, 50.5, 0x100))
    (key, label, held), = book.update([], ended, 1.0, {"k": {11: 0, 12: 1}})
    assert (key, label) == ("k", "job") and held.rank_pids == ()
    assert (held.departed_pids, held.departed_ranks) == ((11, 12), (0, 1))
    assert [k for k, _, _ in book.update([], ended, 30.0)] == ["k"]
    assert book.update([], ended, 31.5) == []


def test_survivors_found_under_a_new_key_are_the_same_job_with_its_dead_rank():
    """A job without a launcher is keyed by its lowest pid: when that rank dies
    (Ray Train's rank 1 had the lower pid: tests/thirdparty/test_ray_jobs.py) its survivor is
    found under another key. It is the same job: key, label and the dead rank kept."""
    wire = Job(target_pid=11, launcher_pid=-1, launcher_kind="wire", rank_pids=(11, 12),
               run_id="", ranks=(1, 0), world_size=2)
    book = Departures()
    book.update([("u0.p11", "pid11", wire)], _exits(), 0.0)
    alone = Job(target_pid=12, launcher_pid=-1, launcher_kind="wire", rank_pids=(12,),
                run_id="", ranks=(0,), world_size=2)
    (key, label, job), = book.update([("u0.p12", "pid12", alone)],
                                     _exits(_exit(11, 0.5, 9)), 1.0, {"u0.p11": {11: 1, 12: 0}})
    assert (key, label) == ("u0.p11", "pid11")
    assert (job.rank_pids, job.departed_pids, job.departed_ranks) == ((12,), (11,), (1,))
    # a job whose key is still live keeps its own: two jobs never merge
    book = Departures()
    book.update([("a", "a", wire)], _exits(), 0.0)
    assert [k for k, _, _ in book.update([("a", "a", wire), ("b", "b", alone)], _exits(),
                                         1.0)] == ["a", "b"]


def test_jobs_that_ended_cleanly_or_were_stopped_are_not_held():
    for ends in ((_exit(12, 1.0, 0), _exit(11, 1.0, 0)),           # finished
                 (_exit(12, 1.0, 2), _exit(11, 1.01, 0x100)),       # Ctrl-C: SIGINT first
                 (_exit(10, 1.0, 15), _exit(12, 1.1, 15)),          # kill / scancel
                 # kill -9 of the whole process group: every one by SIGKILL at once
                 (_exit(11, 1.0, 9), _exit(12, 1.001, 9), _exit(10, 1.002, 9))):
        book = Departures()
        book.update([("k", "job", SPAWN)], _exits(), 0.0)
        assert book.update([], _exits(*ends), 1.0) == [], ends
    book = Departures()  # exits not watched: nothing is known, nothing held
    book.update([("k", "job", SPAWN)], None, 0.0)
    assert book.update([], None, 1.0) == []


def test_a_terminal_jobs_ctrl_c_is_a_stop_not_a_death():
    """Lightning catches Ctrl-C's KeyboardInterrupt, SIGKILLs its other ranks and
    exits 1: at a terminal, every rank ending within CTRL_C_S without a crash is
    a stop. Off a terminal, with a crash signal, an OOM kill, or a rank ending
    long after, the same ends are a death and held."""
    lightning_ctrl_c = (_exit(12, 50.0, 9), _exit(11, 50.4, 0x100))
    crash = (_exit(12, 50.0, 11), _exit(11, 50.4, 0x100))
    oom = (exits.to_exit(12, 9, 11, 50.0, oom_kills=1), _exit(11, 50.4, 0x100))
    late = (_exit(12, 50.0, 9), _exit(11, 58.0, 0x100))
    for ends, at_terminal, held in ((lightning_ctrl_c, True, False),
                                    (lightning_ctrl_c, False, True),
                                    (crash, True, True), (oom, True, True), (late, True, True)):
        book = Departures()
        book.update([("k", "job", SPAWN)], _exits(), 0.0,
                    foreground=frozenset({10, 11, 12}) if at_terminal else frozenset())
        assert bool(book.update([], _exits(*ends), 60.0)) == held, (ends, at_terminal)


def test_a_terminal_job_gone_before_its_last_rank_ended_is_decided_when_it_ends():
    """Lightning's rank 0 alone is no job to discovery: the job is gone from a tick
    while rank 0 still tears down. At a terminal the decision waits for it (up to
    CTRL_C_S after the first end): a Ctrl-C is then no death; a rank that never
    ends after its peer's SIGKILL is held."""
    terminal = frozenset({10, 11, 12})
    book = Departures()
    book.update([("k", "job", SPAWN)], _exits(), 0.0, foreground=terminal)
    assert book.update([], _exits(_exit(12, 50.0, 9)), 50.2) == []  # rank 0 still ending
    both = _exits(_exit(12, 50.0, 9), _exit(11, 50.8, 0x100))
    assert book.update([], both, 51.0) == [] and book.held() == set()
    assert book.update([], both, 60.0) == []
    book = Departures()
    book.update([("k", "job", SPAWN)], _exits(), 0.0, foreground=terminal)
    assert book.update([], _exits(_exit(12, 50.0, 9)), 50.2) == []
    (key, _, held), = book.update([], _exits(_exit(12, 50.0, 9)), 53.5)
    assert key == "k" and held.departed_pids == (11, 12)


def test_an_exit_from_before_the_job_is_another_process_with_that_pid():
    book = Departures()
    book.update([("k", "job", SPAWN)], _exits(), 10.0)
    assert book.update([], _exits(_exit(12, 5.0, 9)), 11.0) == []


def test_a_live_jobs_dead_rank_stays_in_it():
    book = Departures()
    book.update([("k", "job", SPAWN)], _exits(), 0.0)
    survivor = Job(11, 10, "spawn", (11,), "", (0,), 2)
    (_, _, job), = book.update([("k", "job", survivor)], _exits(_exit(12, 5.0, 9)), 1.0)
    assert job.rank_pids == (11,) and (job.departed_pids, job.departed_ranks) == ((12,), (1,))
    (_, _, job), = book.update([("k", "job", survivor)], _exits(_exit(12, 5.0, 9)), 2.0)
    assert job.departed_pids == (12,)  # kept, once


def test_first_to_die_is_the_culprit_the_rest_its_victims():
    from ddpwatch.judge import classify
    from ddpwatch.judge import rules as rules_mod
    from ddpwatch.observe.snapshot import Snapshot
    rules = rules_mod.load_default(None)
    gone = Job(11, 10, "spawn", (), "", (), 2, departed_pids=(11, 12), departed_ranks=(0, 1))
    ended = _exits(_exit(12, 50.0, 9), _exit(11, 50.03, 0x100), _exit(10, 50.5, 0x100))
    snap = Snapshot(1, 100.0, 0.0, gone, None, None, None, None, None, (), exits=ended)
    j = classify.judge((snap, snap), rules)
    by_rank = {v.rank: v for v in j.ranks}
    assert j.job.culprits == (1,) and j.job.verdict == "dead"
    assert (by_rank[1].rule, by_rank[1].role) == ("died-first", "culprit")
    assert "rank 1 (pid 12, launched by spawn) was killed by SIGKILL" in by_rank[1].evidence
    assert "the launcher then exited with code 1" in by_rank[1].evidence
    assert (by_rank[0].rule, by_rank[0].role) == ("ended-after-peer", "victim")
    assert "exited with code 1 0.03s after rank 1 was killed by SIGKILL" in by_rank[0].evidence
    from ddpwatch.publish.report import as_text
    text = as_text(j, snap)  # a held job has no process left to count
    assert "(no local rank process left, 2 ended while watched" in text, text
    oom = _exits(exits.to_exit(12, 9, 1, 50.0, oom_kills=1), _exit(11, 50.03, 0x100))
    snap = Snapshot(1, 100.0, 0.0, gone, None, None, None, None, None, (), exits=oom)
    j = classify.judge((snap, snap), rules)
    assert {v.rank: v.rule for v in j.ranks}[1] == "oom-killed-first"
    # without the exits probe a gone rank is judged as before (no exit signals)
    s = signals.measure((snap.__class__(**{**snap.__dict__, "exits": None}),) * 2)
    assert not any(r.get("exit_seen") for r in s)


def test_a_rank_that_exits_0_after_an_outside_sigterm_is_the_culprit():
    """Lightning's rank 1 SIGTERMed alone from outside exits 0 at its next step
    (SIGTERMException); rank 0, its parent, fails with code 1 a second later.
    Rank 1 died first, not rank 0 (a run of benchmarks/faults.yaml
    terminate/lightning named rank 0 before stopped_from_outside). With the
    sender unseen, rank 0's code is the only abnormal end."""
    from ddpwatch.judge import classify
    from ddpwatch.judge import rules as rules_mod
    from ddpwatch.observe.snapshot import Snapshot
    from ddpwatch.observe.system.tracefs import SignalSent
    rules = rules_mod.load_default(None)
    gone = Job(11, -1, "lightning", (), "", (), 2, departed_pids=(11, 12),
               departed_ranks=(0, 1))
    ends = (exits.to_exit(12, 0, 11, 50.3), exits.to_exit(11, 0x100, 1, 51.2))
    sent = (SignalSent(50.0, 15, 12, 4242, "earlyoom"),)
    culprits = {}
    for traced in (True, False):
        ended = Exits(100.0, 0.0, ends, sent=sent if traced else (), traced=traced)
        snap = Snapshot(1, 100.0, 0.0, gone, None, None, None, None, None, (), exits=ended)
        j = classify.judge((snap, snap), rules)
        culprits[traced] = (j.job.verdict, j.job.culprits)
        if traced:
            first = {v.rank: v for v in j.ranks}[1]
            assert (first.rule, first.role) == ("died-first", "culprit"), first
            assert "after SIGTERM from pid 4242 (earlyoom)" in first.evidence, first.evidence
    assert culprits == {True: ("dead", (1,)), False: ("dead", (0,))}


def test_the_connector_reports_a_killed_child_here():
    need(os.geteuid() == 0, "the process-events connector needs CAP_NET_ADMIN")
    watch = exits.open_watch(time.monotonic)
    need(isinstance(watch, exits.ExitWatch), getattr(watch, "why", ""))
    try:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        got = wait_until(lambda: [e for e in watch.snapshot({child.pid}).exits], 5,
                         interval=0.05, what="the child's exit event")
        assert got[0].signal == signal.SIGKILL and got[0].ppid == os.getpid()
        assert abs(got[0].at - time.monotonic()) < 5
    finally:
        watch.close()


def test_a_held_jobs_rank_that_ends_later_is_seen_ending():
    """A held job's ranks are departed, not live (observe/jobs/departures.py), yet one
    may still be ending: Lightning's rank 0 alone is no job to discovery and may end
    seconds after its peer's death. The sampler keeps watching a departed rank's
    pid, tick after tick, so its end is seen and the job's first death known."""
    from ddpwatch.observe.probes import Look, ProbeContext
    from ddpwatch.observe.sampler import Sampler
    need(os.geteuid() == 0, "the process-events connector needs CAP_NET_ADMIN")
    sampler = Sampler(ProbeContext(clock=time.monotonic), lambda name: name == "exits")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        need(sampler.survey().exits is not None, "no process events on this machine")
        held = Job(child.pid, -1, "spawn", (), "held", departed_pids=(child.pid,),
                   departed_ranks=(0,))
        for _ in range(4):  # more passes than the sampler remembers a pid unsampled
            survey = sampler.survey()
            sampler.sample(held, survey, Look.GLANCE)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()

        def tick():  # as the daemon's tick: a survey, then the held job sampled
            survey = sampler.survey()
            sampler.sample(held, survey, Look.GLANCE)
            return [e for e in survey.exits.exits if e.pid == child.pid]
        got = wait_until(tick, 5, interval=0.05, what="the departed rank's exit")
        assert got[0].signal == signal.SIGKILL
    finally:
        child.kill()
        child.wait()
        sampler.close()


def test_a_rank_dying_in_a_window_is_named_beside_its_lingering_peer(tmp_path):
    """`diagnose`'s shape: the job found with both ranks, rank 1 gone by the
    window's end with its exit seen, rank 0 still waiting in its collective. Made
    from the real mp.spawn fixture with rank 1 stopped (rank 0 blocked): rank 1's
    process marked gone and its SIGKILL added, as the exits probe reports it."""
    import json

    from conftest import REPO

    from ddpwatch.judge import classify
    from ddpwatch.judge import rules as rules_mod
    from ddpwatch.observe.snapshot import load
    src = os.path.join(REPO, "tests", "fixtures", "snapshots", "thirdparty_spawn_stopped.json")
    with open(src) as f:
        data = json.load(f)
    last = data["history"][-1]
    rank1 = last["job"]["rank_pids"][1]
    for proc in last["processes"]["procs"]:
        if proc["pid"] == rank1:
            proc["error"] = "gone"
    last["exits"] = {"taken_at": last["taken_at"], "since": data["history"][0]["taken_at"],
                     "exits": [{"pid": rank1, "at": last["taken_at"] - 0.5, "status": 9,
                                "code": -1, "signal": 9, "core": False, "ppid": 1,
                                "oom_kills": 0}], "lost": 0, "last_loss_s": -1.0}
    path = tmp_path / "died_in_window.json"
    path.write_text(json.dumps(data))
    j = classify.judge(load(str(path)), rules_mod.load_default(None))
    by_rank = {v.rank: v for v in j.ranks}
    assert j.job.culprits == (1,) and by_rank[1].rule == "died-first"
    assert (by_rank[0].verdict, by_rank[0].role) == ("blocked_in_collective", "victim")
    assert f"rank 1 (pid {rank1}) was killed by SIGKILL" in by_rank[0].evidence


def test_where_the_kernel_gives_no_events_the_probe_says_what_cannot_be_seen():
    """In a network namespace of its own (a container's) there is no connector:
    the watch is not opened, the probe fails saying why, and the survey goes on."""
    import shutil
    need(os.geteuid() == 0 and shutil.which("unshare") is not None,
         "needs root and unshare (util-linux) for a network namespace")
    code = ("from ddpwatch.observe.probes import ProbeContext\n"
            "from ddpwatch.observe.sampler import Sampler\n"
            "s = Sampler(ProbeContext(), lambda name: name != 'traffic')\n"
            "v = s.survey()\n"
            "st = next(p for p in v.probes if p.name == 'exits')\n"
            "print(v.exits is None, st.ok, st.error)\n")
    out = subprocess.run(["unshare", "--net", sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("True False RuntimeError: cannot listen to the kernel's "
                                 "process events"), out.stdout
    assert "host's network namespace only" in out.stdout and "only that it is gone" in out.stdout
