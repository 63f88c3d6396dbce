"""State family: what a rank is doing, from the other families' signals of the
same rank (heartbeat and stack, CPU). Pure."""
from __future__ import annotations

from ...observe.snapshot import Snapshot
from .lookup import record_of
from .process import IDLE_CPU
from .spec import declare

SIGNALS = declare(
    ("in_collective", bool, "this rank waits in a collective (heartbeat or stack)"),
    ("blocked", bool, "in a collective, using ~no CPU, its connections to the job's other "
                     "ranks here idle (bytes moving: the collective moves, starved of CPU)"),
    ("links_moving", bool, "its connections to the job's other ranks here sent or received "
                          "in the last second: a collective that moves (None: not read)"),
    ("warming_up", bool, "first steps or compilation frames"),
    ("waiting_in", str, "the collective this rank waits in (heartbeat op, else from its stack)"),
    ("local_rank", int, "LOCAL_RANK (environment, else the record), -1 unknown"),
    ("awaits_dialers", bool, "a rank of a multi-node job waits for peers that should dial it: "
     "more peers unconnected than its own connects stuck in SYN-SENT, listening where they "
     "can reach it (not loopback, not off its route), on a node whose traffic is watched and "
     "shows no dropped attempt of theirs yet (`diagnose --syn-wait` waits for their next SYN)"),
)

WARMUP_STEPS = 2
LINKS_MOVING_S = 1.0  # a rank's links to its peers moved bytes this recently: not blocked


def measure(s: dict, last: Snapshot) -> None:
    """Adds to a rank's signals `s`, once the other families measured it."""
    stalled_hb = bool(s.get("hb_stalled"))
    stack_waits = s.get("stack") in ("collective", "ddp_backward")
    s["in_collective"] = bool(s.get("hb_phase") == "inside" or stack_waits) if s.get(
        "alive") else False
    idle = s.get("cpu_ratio") is not None and s["cpu_ratio"] < IDLE_CPU
    # Bytes between the ranks in the last second: the collective moves, however
    # little CPU its threads get. Measured on 2 cores (tests/daemon/test_soak.py):
    # a DataLoader job's two ranks in backward beside a torch.compile job's
    # compile used 2-4% CPU and waited 0.19 cores for one (wait share 0.9), their
    # links idle 0-8 ms; both were "blocked" and paged with no culprit. A rank
    # that waits for a peer has idle links however busy the host is (its run-queue
    # wait says nothing: 0.05-0.08 cores beside a recompile and a busy loop).
    # tests/unit/judge/test_rank_links_unit.py; replay fixture plain_starved_moving
    links = s.get("rank_links_idle_s")
    s["links_moving"] = None if links is None else 0 <= links < LINKS_MOVING_S
    s["blocked"] = bool(s["in_collective"] and idle and not s["links_moving"] and (stalled_hb or (
        not s.get("hb") and stack_waits)))
    # torch/_dynamo and torch/_inductor frames are on the stack of every step of
    # a compiled model, not only while it compiles: a rank whose heartbeat
    # advances past the first steps runs compiled code, it is not warming up.
    compiling = s.get("stack") == "compile" and not (
        s.get("hb_advanced") and s.get("hb_step", 0) >= WARMUP_STEPS)
    s["warming_up"] = bool(compiling or (
        s.get("hb") and s.get("hb_step", 0) < WARMUP_STEPS and not stalled_hb
        and s.get("hb_phase") != "rendezvous"))
    s["waiting_in"] = _waiting_in(s)
    s["local_rank"] = _local_rank(last, s["pid"])
    s["awaits_dialers"] = _awaits_dialers(s, last)


def _waiting_in(s: dict) -> str | None:
    """The collective a rank waits in: from its heartbeat, else from its stack."""
    if s.get("hb_phase") == "inside":
        return s.get("hb_op")
    if s.get("stack") == "ddp_backward":
        return "ddp_bucket_all_reduce"
    if s.get("stack") == "collective":
        return (s.get("stack_top") or "?").split(" ")[0]
    return None


def _awaits_dialers(s: dict, last: Snapshot) -> bool:
    """Worth waiting for the peers' next SYN (a connect retries 1, 2, 4 ... 32 s
    apart): their attempts come to this rank's address, and the capture
    (snapshot.traffic) would see them dropped. A rank in another network
    namespace than the capture has no inbound signals; it still waits."""
    if last.traffic is None or s.get("all_ranks_local") is not False:
        return False
    if s.get("gloo_loopback") or s.get("gloo_off_route"):
        return False
    dialled_by = (s.get("gloo_unconnected") or 0) - (s.get("syn_sent") or 0)
    return dialled_by >= 1 and not s.get("syn_in_unanswered")


def _local_rank(snap: Snapshot, pid: int) -> int:
    if snap.processes is not None:
        p = snap.processes.by_pid.get(pid)  # a reading that failed has no environment
        if p is not None and p.env.get("LOCAL_RANK", "").isdigit():
            return int(p.env["LOCAL_RANK"])
    rec = record_of(snap, pid)
    return rec.local_rank if rec is not None else -1
