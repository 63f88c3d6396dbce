"""Stack family: what py-spy dumps say a rank's training thread is doing (its
main thread, unless that idles in a worker pool's loop: stackmatch.training_thread), and what
the ranks' stacks say next to each other (`link`). Pure."""
from __future__ import annotations

from collections import Counter

from ...observe.snapshot import Snapshot
from ..memo import per_dump
from ..pausekind import KINDS, pause_of
from ..stackmatch import (bf16_evidence, call_site, classify_stack, describe_top, loop_position,
                          main_thread, training_thread)
from .lookup import proc_of, stacks_of
from .spec import declare, one_of
from .steps import cross_rank

SIGNALS = declare(
    ("stack", one_of("collective", "ddp_backward", "rendezvous", "compile", "agent", "idle_user",
                     "active", "mixed", "stopped", "unknown"),
     "what the main thread does in every dump of the window (py-spy; judge/stackmatch.py "
     "classify_stack; mixed: not the same in all)"),
    ("stack_top", str, "the innermost frames of the main thread"),
    ("stack_samples", int, "stack dumps taken in the window", "count"),
    ("stack_moved_on", int, "dumps left out: they showed the main thread waiting in a "
                            "collective, and it has run since (a thread that waits runs "
                            "none), so it is elsewhere now", "count"),
    ("stack_waits", int, "stack dumps of the window with the main thread waiting in a "
                         "collective (collective or ddp_backward): all of stack_samples for "
                         "a stuck rank, some for a training one", "count"),
    ("stack_backward", int, "stack dumps of the window with the main thread in autograd's "
                            "backward (computing, or waiting for DDP's gradient all-reduce): "
                            "the rank trains, past the job's set-up", "count"),
    ("stack_site", str, "the collective it waits in and the user's line that called it, the "
                        "same in every sample of the window (py-spy)"),
    ("stack_bf16", str, "what in its stacks says it computes in bf16 on the CPU: a known "
                        "bf16 mixed-precision plugin's frames on a node without GPUs, or a "
                        "bf16 kernel of libtorch_cpu (native dump)"),
    ("stack_bf16_seen", int, "stack samples of the window showing stack_bf16", "count"),
    ("desync_deviant", bool, "its stacks wait in a collective none of the common path's ranks "
                             "wait in (see link)"),
    ("desync_others", str, "where the other stuck ranks wait, from their stacks"),
    ("loop_position", one_of("in_epoch", "left_epoch"),
     "where the main thread is in a known training loop (Lightning's), the same in every "
     "sample of the window: in_epoch (in the epoch's batch loop) or left_epoch (in the fit "
     "loop outside any epoch: at an epoch-end hook)"),
    ("loop_site", str, "the same for a person: \"mid-epoch at _TrainingEpochLoop.advance "
                       "(training_epoch_loop.py:300)\", \"out of the training loop at "
                       "ModelCheckpoint.on_train_epoch_end (model_checkpoint.py:493) <- "
                       "_FitLoop.on_advance_end (fit_loop.py:484)\""),
    ("left_loop", bool, "stuck in a collective out of the training loop (left_epoch) while "
                        "every other stuck rank waits mid-epoch (see link): it ran out of "
                        "batches first"),
    ("pause_kind", one_of(*KINDS), "what the main thread does outside the collectives at the "
                                   "last dump (judge/pausekind.py); none while it waits in a "
                                   "collective"),
    ("pause_site", str, "where the loop called what it does outside the collectives "
                        "(\"estimate_loss <- train.py:260\"): the key its pauses are learned by"),
    ("ddp_setup", bool, "main thread in DistributedDataParallel's constructor at the last "
                        "dump: it meets its peers there (shapes, then parameters) before "
                        "its first step"),
    ("peer_ddp_setup", bool, "another rank of the job is in DDP's constructor"),
    ("ddp_starting", bool, "the job has not begun training: this rank meets its peers (at "
                           "rendezvous or in DDP's constructor) while a peer is busy (wants "
                           ">= 30% CPU), or is busy outside any collective (in DDP's "
                           "constructor too: its lazy imports) while a peer meets"),
)

BUSY = 0.3
WAITS = ("collective", "ddp_backward")  # kinds of a main thread waiting in a collective
# Seconds of run time: a main thread blocked in a collective ran 0 ns over
# seconds (Gloo's all-reduce in DDP's backward, its peer asleep); one that ran
# more since a dump has left the wait it showed, if only for a while.
RAN_S = 0.002

# DDP's constructor: py-spy names frames by qualified name
DDP_INIT = ("torch/nn/parallel/distributed.py", "DistributedDataParallel.__init__")


def measure(history: tuple[Snapshot, ...], pid: int) -> dict:
    found = stacks_of(history, pid)
    dumps = [d for d in found if d.threads]
    stopped = [d for d in found if d.status.startswith("stopped")]
    # py-spy runs at most every stacks_min_interval_s per job: a look in between
    # keeps the last dump (observe/sampler.py still_current). A dump that showed
    # the main thread waiting in a collective, whose main thread has run since,
    # says nothing of now: a DataLoader job's kept dump of DDP's backward, read
    # beside its ranks' 3-second wait for an epoch's workers, was two ticks of
    # `blocked` and a page (tests/daemon/test_soak.py,
    # tests/unit/judge/test_stack_moved_on_unit.py).
    ran_now = _main_run_now(history[-1], pid) if dumps else -1.0
    kinds = [classify_stack(d) for d in dumps]
    moved = [k in WAITS and _ran_since(d, ran_now) for d, k in zip(dumps, kinds)]
    dumps = [d for d, m in zip(dumps, moved) if not m]
    kinds = [k for k, m in zip(kinds, moved) if not m]
    if not dumps:
        return {"stack": "stopped" if stopped else None, "stack_samples": 0,
                "stack_moved_on": sum(moved)}
    # One dump is not evidence (healthy ranks spend much time in the same wait):
    # the stack signal is the kind seen in every sample, else "mixed" (diagnose
    # takes 4 per window: a training rank waits in some, a stuck one in all;
    # stack_waits counts them). Compiler
    # frames are the exception: they are on no stack but a compiling rank's, so one
    # sample of them says the rank compiled in the window (a 60-layer compile
    # caught once in its first second and once compiling).
    kind = kinds[0] if len(set(kinds)) == 1 else "compile" if "compile" in kinds else "mixed"
    sites = {call_site(d) for d in dumps}
    s = {"stack": kind, "stack_top": describe_top(dumps[-1]), "stack_samples": len(dumps),
         "stack_moved_on": sum(moved),
         "stack_waits": sum(k in WAITS for k in kinds),
         "stack_backward": sum(_in_backward(d) for d in dumps),
         "stack_site": sites.pop() if len(sites) == 1 else None,
         "ddp_setup": _in_ddp_init(dumps[-1])}
    if kinds[-1] not in WAITS + ("rendezvous", "agent"):
        s["pause_kind"], s["pause_site"] = pause_of(dumps[-1])
    s.update(_bf16(history, dumps))
    s.update(_loop(dumps))
    return s


def _main_run_now(snap: Snapshot, pid: int) -> float:
    """The main thread's run time at `snap`'s process reading, -1 if not read."""
    proc = proc_of(snap, pid)
    if proc is None:
        return -1.0
    return next((t.sched.run_s for t in proc.threads if t.tid == pid), -1.0)


def _ran_since(dump, ran_now: float) -> bool:
    """Whether the dump's main thread, its training thread, ran since the dump
    (its run time then: PidStacks.main_run_s); unknown counts as not."""
    then = dump.main_run_s
    if then < 0 or ran_now < 0 or training_thread(dump) is not main_thread(dump):
        return False
    return ran_now - then > RAN_S


LOOP_PHRASE = {"in_epoch": "mid-epoch at", "left_epoch": "out of the training loop at"}


def _loop(dumps: list) -> dict:
    """Where in the training loop, when every dump of the window agrees (a rank
    training through its epochs moves in and out of it)."""
    places = [loop_position(d) for d in dumps]
    if places[-1] is None or len({p and p[0] for p in places}) != 1:
        return {}
    position, where = places[-1]
    return {"loop_position": position, "loop_site": f"{LOOP_PHRASE[position]} {where}"}


def _bf16(history: tuple[Snapshot, ...], dumps: list) -> dict:
    """bf16 compute from any sample of the window: autocast's frames are on the stack
    only while the step's forward (accelerate) or the step (Lightning) runs, so a
    healthy rank shows them in some samples, not all. Python frames name a library
    and not the device: taken as the CPU's only on a node where the host probe saw no
    GPU (a GPU job's bf16 is no finding); a native bf16 kernel of libtorch_cpu is
    the CPU's wherever it runs."""
    host = history[-1].host
    no_gpu = host is not None and getattr(host, "gpus", -1) == 0
    seen = [e for e in (bf16_evidence(d) for d in dumps) if e and (e[1] or no_gpu)]
    if not seen:
        return {}
    return {"stack_bf16": seen[-1][0], "stack_bf16_seen": len(seen)}


@cross_rank(writes=("desync_deviant", "desync_others", "left_loop"))
def link(ranks: list[dict]) -> None:
    """Which stuck rank left the common path, from stacks alone (no heartbeats to
    say which collective is new to a rank). Ranks blocked in different collectives
    are a desync; the culprit is the rank a person would look at first:
    * the ranks outside the collective most stuck ranks wait in (of 4 ranks, 3 in
      DDP's gradient all-reduce and 1 in a barrier: the barrier's rank took a branch
      the others did not);
    * on a tie (always so with 2 ranks), the ranks outside DDP's gradient all-reduce:
      every training step of every rank goes through it, so a rank elsewhere (an
      explicit broadcast or barrier, or the loop left early: fewer batches,
      docs/design.md "Uneven data across nodes") is the one whose path differs;
    * on a tie without it (a barrier against a broadcast, 2 ranks), no culprit: both
      are named as victims with both call sites (a guess would be silent).
    Before all of these, where the ranks are in a known training loop: when some
    stuck ranks are out of it (at an epoch's end) and all the others mid-epoch,
    those that left it are the culprits (`left_loop`): they ran out of batches
    first (uneven data; Lightning's rank at ModelCheckpoint's epoch-end collective
    while its peer waits in the next step's broadcast, both outside DDP's
    all-reduce: tests/thirdparty/test_thirdparty_stacks.py).
    Stopped ranks wait in nothing (their stack is not read) and do not count."""
    stuck = [s for s in ranks if s.get("blocked") and s.get("waiting_in")
             and s.get("stack_site") and s.get("state") not in ("T", "t")]
    ops = Counter(s["waiting_in"] for s in stuck)
    if len(ops) < 2:
        return
    top = max(ops.values())
    leaders = [op for op, n in ops.items() if n == top]
    ddp = next((op for op in leaders if op == "ddp_bucket_all_reduce"), None)
    common = leaders[0] if len(leaders) == 1 else ddp
    left = {id(s) for s in stuck if s.get("loop_position") == "left_epoch"}
    split = 0 < len(left) < len(stuck) and all(
        s.get("loop_position") == "in_epoch" for s in stuck if id(s) not in left)
    for s in stuck:
        s["left_loop"] = split and id(s) in left
        s["desync_deviant"] = (s["left_loop"] if split
                               else common is not None and s["waiting_in"] != common)
        s["desync_others"] = "; ".join(
            f"{rank_name(p)} waits in {p['stack_site']}"
            + (f", {p['loop_site']}" if p.get("loop_site") else "")
            for p in stuck if p is not s)


@per_dump
def _in_backward(dump) -> bool:
    """Autograd's backward on the main thread: only a step that ran forward gets
    there, so every rank is past rendezvous and DDP's constructor (a collective
    of all ranks)."""
    thread = training_thread(dump)
    return thread is not None and any(f.name == "_engine_run_backward" for f in thread.frames)


@per_dump
def _in_ddp_init(dump) -> bool:
    thread = training_thread(dump)
    return thread is not None and any(
        f.name == DDP_INIT[1] and f.filename.replace("\\", "/").endswith(DDP_INIT[0])
        for f in thread.frames)


@cross_rank(reads=("cpu_wanted",), writes=("ddp_starting", "peer_ddp_setup"))
def link_start(ranks: list[dict]) -> None:
    """After every rank's own signals and the window's (cpu_wanted): is the job
    still meeting before its first step."""
    def meets(o):
        return bool(o.get("ddp_setup") or o.get("stack") == "rendezvous")

    def busy(o):
        return (o.get("cpu_wanted") or 0) >= BUSY
    # A rank busy inside DDP's constructor but outside its collectives imports
    # (torch._dynamo, inductor's config: seconds of CPU on a loaded machine) while
    # a peer that got through them first waits in the constructor's collective.
    # counted once, each rank's own taken off: its peers' (256 ranks: no pairs)
    setting_up = sum(1 for o in ranks if o.get("ddp_setup"))
    busy_ranks = sum(1 for o in ranks if busy(o))
    meeting = sum(1 for o in ranks if meets(o))
    for s in ranks:
        s["peer_ddp_setup"] = setting_up - bool(s.get("ddp_setup")) > 0
        s["ddp_starting"] = bool(
            (meets(s) and busy_ranks - busy(s) > 0)
            or (busy(s) and not s.get("in_collective") and meeting - meets(s) > 0))


def rank_name(s: dict) -> str:
    """"rank N", or "pid P" for a rank whose number is unknown."""
    rank = s.get("rank")
    return f"rank {rank}" if isinstance(rank, int) and rank >= 0 else f"pid {s.get('pid')}"


__all__ = ["SIGNALS", "measure", "link", "link_start", "rank_name"]
