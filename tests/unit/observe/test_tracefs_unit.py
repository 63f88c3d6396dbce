"""Who sent a stop signal (observe/system/tracefs.py) and what it decides
(observe/jobs/departures.py _stopped_by_request): a rank sent SIGTERM alone is a
death; the same signal to the launcher or to every rank at once is its job
stopped. Lines captured from this kernel's (6.18) trace_pipe."""
from __future__ import annotations

import os
import signal
import subprocess
import time

from conftest import need, wait_until

from departures_book import Book as Departures
from ddpwatch.observe.probes import exits
from ddpwatch.observe.probes.exits import Exits
from ddpwatch.observe.snapshot import Job
from ddpwatch.observe.system import tracefs
from ddpwatch.observe.system.tracefs import SignalSent

LINE = ("            bash-11634   [001] d..1. 14978.481593: signal_generate: sig=15 errno=0 "
        "code=0 comm=bash pid=11636 grp=1 res=0")


def test_a_trace_line_gives_when_which_signal_to_whom_from_whom():
    assert tracefs.parse_line(LINE) == (14978.481593, 15, 11636, 11634, "bash")


def test_senders_named_with_spaces_dashes_or_odd_bytes_parse_and_print_safely():
    odd = LINE.replace("bash-11634", "my -job\x1b[31m-7")
    at, sig, target, tid, comm = tracefs.parse_line(odd)
    assert (sig, target, tid) == (15, 11636, 7) and comm == "my -job?[31m"
    spaced = LINE.replace("comm=bash", "comm=a b-c pid=9")  # a target's comm cannot lie
    assert tracefs.parse_line(spaced)[2] == 11636


def test_ignored_signals_and_other_lines_are_none():
    assert tracefs.parse_line(LINE.replace("res=0", "res=1")) is None
    for junk in ("", "# tracer: nop", "x" * 5000, LINE[:60], LINE.replace("sig=15", "sig=x")):
        assert tracefs.parse_line(junk) is None


TORCHRUN = Job(target_pid=11, launcher_pid=10, launcher_kind="torchrun", rank_pids=(11, 12),
               run_id="", ranks=(0, 1), world_size=2)


def _gone(ends, sent, traced=True):
    book = Departures()
    book.update([("k", "job", TORCHRUN)], Exits(0.0, 0.0, ()), 0.0)
    return book.update([], Exits(100.0, 0.0, tuple(ends), sent=tuple(sent), traced=traced),
                       1.0)


def _end(pid, at, status):
    return exits.to_exit(pid, status, 1, at)


# torchrun's ends measured on this machine (exits probe): rank 1 SIGTERMed alone
# then rank 0 by its launcher 24 ms later, the launcher exiting 1; or the
# launcher SIGTERMed and both ranks ending by the signal it forwards at once
ALONE = (_end(12, 50.022, 15), _end(11, 50.046, 15), _end(10, 50.63, 0x100))
WHOLE = (_end(11, 50.003, 15), _end(12, 50.003, 15), _end(10, 50.82, 0x100))


def test_a_rank_sent_sigterm_alone_is_a_death_held_with_its_sender():
    sent = (SignalSent(50.0, 15, 12, 4242, "earlyoom"), SignalSent(50.03, 15, 11, 10, "torchrun"))
    (key, _, held), = _gone(ALONE, sent)
    assert key == "k" and set(held.departed_pids) == {11, 12}
    signals = exits.Exits(100.0, 0.0, ALONE, sent=sent, traced=True)
    assert signals.stop_sent_to(ALONE[0]).by == "pid 4242 (earlyoom)"


def test_the_launcher_or_every_rank_asked_is_the_job_stopped():
    forwarded = (SignalSent(50.0, 15, 10, 777, "scancel"), SignalSent(50.001, 15, 11, 10, "pt"),
                 SignalSent(50.001, 15, 12, 10, "pt"))
    assert _gone(WHOLE, forwarded) == []
    # kill of the process group: one sender, every process, at once
    group = tuple(SignalSent(50.0, 15, p, 777, "kill") for p in (10, 11, 12))
    assert _gone(WHOLE, group) == []
    # every rank, not the launcher (a pkill of the ranks' name)
    ranks = tuple(SignalSent(50.0, 15, p, 777, "pkill") for p in (11, 12))
    assert _gone(WHOLE, ranks) == []


def test_unwatched_senders_keep_a_stop_signal_a_stop():
    assert _gone(ALONE, (), traced=False) == []
    # watched, but this signal's sending was not seen (before the watch): a stop
    assert _gone(ALONE, (SignalSent(50.0, 15, 99, 4242, "x"),)) == []


def test_the_kernel_reports_who_sent_a_signal_here(tmp_path):
    """A real trace instance: a child SIGTERMed by this process is seen with
    this process as its sender; the instance is gone after close."""
    need(os.geteuid() == 0, "tracefs instances need root")
    need(tracefs.tracefs_root() is not None,
         "no tracefs mounted (mount -t tracefs nodev /sys/kernel/tracing)")
    trace = tracefs.SignalTrace.open()
    try:
        child = subprocess.Popen(["sleep", "60"])
        os.kill(child.pid, signal.SIGTERM)
        child.wait(10)
        got = []
        wait_until(lambda: got.extend(trace.drain({child.pid})) or any(
            s.target == child.pid for s in got), 10, what="the SIGTERM's trace line")
        sent = next(s for s in got if s.target == child.pid)
        assert (sent.signal, sent.sender) == (15, os.getpid()), sent
        assert abs(sent.at - time.monotonic()) < 10  # the exits' clock
    finally:
        trace.close()
    assert not os.path.exists(trace.path)


def test_a_rank_that_exits_0_after_an_outside_sigint_died_first():
    """mp.spawn's worker wrapper turns rank 1's KeyboardInterrupt into exit code 0;
    rank 0 then fails with code 1: rank 1, asked alone from outside, ended first."""
    ends = (_end(12, 50.1, 0), _end(11, 50.4, 0x100), _end(10, 51.0, 0x100))
    (_, _, held), = _gone(ends, (SignalSent(50.0, 2, 12, 4242, "kill"),))
    assert set(held.departed_pids) == {11, 12}
    # the same ends with nobody's signal seen: rank 0's code 1 alone is abnormal
    # and the job is held all the same; the judge then names rank 0 (unknowable)
    assert _gone(ends, ()) != []


def test_a_rank_that_exits_0_after_an_outside_sigterm_died_first():
    """Lightning turns a SIGTERM into SIGTERMException, a SystemExit without a
    code, at the rank's next step: rank 1 exits 0, rank 0 fails with code 1 a
    second later (benchmarks/faults.yaml terminate/lightning). Asked alone from
    outside, rank 1 ended first; the same SIGTERM to every rank is the job
    stopped, as is one its own launcher forwarded."""
    ends = (_end(12, 50.3, 0), _end(11, 51.2, 0x100), _end(10, 51.5, 0x100))
    for sig in (15, 1):
        (_, _, held), = _gone(ends, (SignalSent(50.0, sig, 12, 4242, "earlyoom"),))
        assert set(held.departed_pids) == {11, 12}, sig
    every = (_end(12, 50.3, 0), _end(11, 50.4, 0), _end(10, 50.9, 0))
    assert _gone(every, tuple(SignalSent(50.0, 15, p, 777, "pkill") for p in (11, 12))) == []
    forwarded = (SignalSent(50.0, 15, 12, 10, "torchrun"),)
    assert _gone((_end(12, 50.3, 0), _end(11, 50.4, 0), _end(10, 50.9, 0)), forwarded) == []


def test_a_sender_seen_asking_one_rank_decides_over_the_ranks_ending_alike():
    """mp.spawn: rank 1 SIGTERMed alone, rank 0 SIGTERMed by the parent 42 ms
    later, the parent's own end not yet seen when the job leaves discovery: the
    ends alone look like the process group killed whole."""
    ends = (_end(12, 50.038, 15), _end(11, 50.080, 15))
    sent = (SignalSent(50.0, 15, 12, 4242, "python"), SignalSent(50.07, 15, 11, 10, "python"))
    assert _gone(ends, sent) != []
    assert _gone(ends, (), traced=False) == []  # unseen: killed whole, as before


LIGHTNING = Job(target_pid=11, launcher_pid=-1, launcher_kind="lightning", rank_pids=(11, 12),
                run_id="", ranks=(0, 1), world_size=2)


def test_a_stop_of_the_process_that_started_the_other_ranks_is_the_jobs():
    """Lightning's rank 0 is the process a person started; it starts rank 1. A
    SIGTERM or SIGINT to it alone is the job stopped (benchmarks/faults.yaml
    job-stopped: its handler SIGTERMs rank 1 and exits 0), not rank 0's death."""
    for sig in (15, 2):
        book = Departures()
        book.update([("k", "job", LIGHTNING)], Exits(0.0, 0.0, ()), 0.0)
        ends = (exits.to_exit(12, 15, 11, 50.1), exits.to_exit(11, 0, 1, 50.3))
        sent = (SignalSent(50.0, sig, 11, 4242, "python"), SignalSent(50.05, 15, 12, 11, "pt"))
        assert book.update([], Exits(100.0, 0.0, ends, sent=sent, traced=True), 1.0) == [], sig
    # rank 0 ended first (exit 0 after its SIGTERM handler), rank 1, its child,
    # reparented by then: only the SIGTERM it passed on says it led the job
    ends = (exits.to_exit(11, 0, 1, 50.2), exits.to_exit(12, 15, 1, 50.4))
    sent = (SignalSent(50.0, 15, 11, 4242, "python"), SignalSent(50.05, 15, 12, 11, "pt"))
    assert _gone_lightning(ends, sent) == []
    # the same ends without the SIGTERM passed on: rank 0 was stopped alone
    assert _gone_lightning(ends, sent[:1]) != []


def _gone_lightning(ends, sent):
    book = Departures()
    book.update([("k", "job", LIGHTNING)], Exits(0.0, 0.0, ()), 0.0)
    return book.update([], Exits(100.0, 0.0, ends, sent=sent, traced=True), 1.0)
