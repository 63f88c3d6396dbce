"""Exits family: how a rank's process ended and when, next to its peers' ends
(the exits probe: the kernel's process events). The first rank to end abnormally
took the others with it: Gloo fails a survivor's collective ("Connection closed
by peer") once the dead rank's sockets close, and mp.spawn, Lightning and
torchrun then end the rest. Pure."""
from __future__ import annotations

from ...observe.jobs.departures import stopped_from_outside
from ...observe.probes.exits import signal_name
from ...observe.snapshot import Snapshot
from .spec import NUMBER, declare
from .steps import cross_rank

SIGNALS = declare(
    ("exit_seen", bool, "the kernel reported how this rank's process ended"),
    ("exit_how", str, "how it ended, for people: 'was killed by SIGKILL', 'exited with code "
                        "1'"),
    ("exit_signal", int, "the signal that ended it, 0 when it exited by itself"),
    ("exit_code", int, "its exit code, -1 when a signal ended it"),
    ("exit_abnormal", bool, "it ended by a signal or with a non-zero exit code, or by its "
                            "own exit after a stop signal sent to it alone from outside its job"),
    ("exit_oom", bool, "killed by SIGKILL while the node's OOM-kill count rose"),
    ("exit_sent_by", str, "who sent it a stop signal (SIGHUP, SIGINT, SIGTERM) before it "
                          "ended: 'pid 4242 (earlyoom)', when the exits probe watched senders"),
    ("exit_order", int, "1 for the first of the job's ranks seen to end, 2 the next..."),
    ("exit_after_s", NUMBER, "seconds after the job's first rank ended that this one did", "s"),
    ("died_first", bool, "the first of its job's ranks to end abnormally (a signal, a "
                         "non-zero code)"),
    ("peer_died_first", bool, "another rank of the job ended abnormally before this one "
                              "ended (or while it still runs)"),
    ("first_exit_rank", int, "the first rank to end abnormally, -1 unknown"),
    ("first_exit_pid", int, "its pid"),
    ("first_exit_how", str, "how it ended: 'was killed by SIGKILL', 'exited with code 1'"),
    ("launcher", str, "what started the job: torchrun, spawn, lightning... (discovery)"),
    ("launcher_exit_how", str, "how the job's launcher ended, when it did"),
    ("exits_watched", bool, "the kernel's process events are watched for this job: a rank "
                            "that ends is seen ending"),
)


def _exit_of(snap: Snapshot, pid: int):
    if snap.exits is None:
        return None
    return next((e for e in reversed(snap.exits.exits) if e.pid == pid), None)


def measure(s: dict, last: Snapshot) -> None:
    """Adds to a rank's signals `s` what the exits probe saw of its process. An
    exit seen while the process still runs is an earlier process's under the
    same pid: not this one's."""
    s["exits_watched"] = last.exits is not None
    s["launcher"] = last.job.launcher_kind
    launcher = _exit_of(last, last.job.launcher_pid) if last.job.launcher_pid > 0 else None
    if launcher is not None:
        s["launcher_exit_how"] = launcher.how
    exit_ = _exit_of(last, s["pid"])
    s["exit_seen"] = exit_ is not None and not s.get("alive")
    if not s["exit_seen"]:
        return
    s["exit_how"] = exit_.how
    sent = last.exits.stop_sent_to(exit_)
    if sent is not None:
        s["exit_sent_by"] = sent.by
        s["exit_how"] += (f" (sent by {sent.by})" if sent.signal == exit_.signal else
                          f" (after {signal_name(sent.signal)} from {sent.by})")
    s["exit_signal"], s["exit_code"] = exit_.signal, exit_.code
    # an exit 0 after a stop signal from outside its job is no clean finish
    # (mp.spawn's wrapper, Lightning's SIGTERM handling): as the held job is decided
    s["exit_abnormal"] = bool(exit_.signal or exit_.code) or (
        not exit_.code and stopped_from_outside(last.job, exit_, last.exits))
    s["exit_oom"] = exit_.signal == 9 and exit_.oom_kills > 0
    # for link() only: clock-bound, so kept out of what is served to peers and shown
    # (those take scalars only)
    s["_exit_at"] = (exit_.at,)


@cross_rank(writes=("died_first", "exit_after_s", "exit_order", "first_exit_how", "first_exit_pid",
                    "first_exit_rank", "peer_died_first"))
def link(ranks: list[dict]) -> None:
    """Orders the job's rank exits: who ended abnormally first, and when the
    others ended after it. Ranks that exited 0 before it had just finished."""
    # remote ranks' stamps are another node's clock: ordered on their own node only
    ended = sorted((s for s in ranks if s.get("exit_seen") and "_exit_at" in s
                    and not s.get("remote")), key=lambda s: s["_exit_at"][0])
    # a rank whose record says it went through the interpreter's exit at its start
    # is judged by exited-at-start* (they know why: a peer it could not reach)
    first = next((s for s in ended if s.get("exit_abnormal")
                  and not (s.get("hb_phase") == "exited" and s.get("hb_step") == 0)), None)
    # a rank already gone whose end was not seen (before the watch began) may have
    # ended first: then no exit seen is known to be the first
    if any(s.get("alive") is False and not s.get("exit_seen") and not s.get("remote")
           for s in ranks):
        first = None
    for order, s in enumerate(ended, 1):
        s["exit_order"] = order
        if first is not None and s["_exit_at"][0] >= first["_exit_at"][0]:
            s["exit_after_s"] = round(s["_exit_at"][0] - first["_exit_at"][0], 3)
    for s in ranks:
        at = s.pop("_exit_at", None)
        if first is None:
            continue
        rank = first.get("rank")
        s["first_exit_rank"] = rank if isinstance(rank, int) else -1
        s["first_exit_pid"], s["first_exit_how"] = first["pid"], first["exit_how"]
        s["died_first"] = s is first
        s["peer_died_first"] = s is not first and (at is None or s.get("exit_after_s") is not None)
