"""Stack family: what py-spy dumps say a rank's main thread is doing. Pure."""
from __future__ import annotations

from ...observe.snapshot import Snapshot
from ..stackmatch import classify_stack, describe_top, main_thread
from .lookup import stacks_of
from .spec import declare

SIGNALS = declare(
    ("stack", str, "main thread: collective, ddp_backward, rendezvous, compile, agent, "
                   "idle_user, active, mixed, stopped or unknown (py-spy)"),
    ("stack_top", str, "the innermost frames of the main thread"),
    ("stack_samples", int, "stack dumps taken in the window"),
    ("ddp_setup", bool, "main thread in DistributedDataParallel's constructor at the last "
                        "dump: it meets its peers there (shapes, then parameters) before "
                        "its first step"),
    ("peer_ddp_setup", bool, "another rank of the job is in DDP's constructor"),
    ("ddp_starting", bool, "the job has not begun training: this rank meets its peers (at "
                           "rendezvous or in DDP's constructor) while a peer is busy (wants "
                           ">= 30% CPU), or is busy outside any collective while a peer "
                           "meets"),
)

BUSY = 0.3

# DDP's constructor: py-spy names frames by qualified name
DDP_INIT = ("torch/nn/parallel/distributed.py", "DistributedDataParallel.__init__")


def measure(history: tuple[Snapshot, ...], pid: int) -> dict:
    dumps = [d for d in stacks_of(history, pid) if d.threads]
    stopped = [d for d in stacks_of(history, pid) if d.status.startswith("stopped")]
    if not dumps:
        return {"stack": "stopped" if stopped else None, "stack_samples": 0}
    kinds = [classify_stack(d) for d in dumps]
    # One dump is not evidence (healthy ranks spend much time in the same wait):
    # the stack signal is the kind seen in every sample, else "mixed". Compiler
    # frames are the exception: they are on no stack but a compiling rank's, so one
    # sample of them says the rank compiled in the window (a 60-layer compile
    # caught once in its first second and once compiling: issue 13).
    kind = kinds[0] if len(set(kinds)) == 1 else "compile" if "compile" in kinds else "mixed"
    return {"stack": kind, "stack_top": describe_top(dumps[-1]), "stack_samples": len(dumps),
            "ddp_setup": _in_ddp_init(dumps[-1])}


def _in_ddp_init(dump) -> bool:
    thread = main_thread(dump)
    return thread is not None and any(
        f.name == DDP_INIT[1] and f.filename.replace("\\", "/").endswith(DDP_INIT[0])
        for f in thread.frames)


def link(ranks: list[dict]) -> None:
    """After every rank's own signals and the window's (cpu_wanted): is the job
    still meeting before its first step."""
    def meets(o):
        return bool(o.get("ddp_setup") or o.get("stack") == "rendezvous")

    def busy(o):
        return (o.get("cpu_wanted") or 0) >= BUSY
    for s in ranks:
        peers = [o for o in ranks if o is not s]
        s["peer_ddp_setup"] = any(o.get("ddp_setup") for o in peers)
        s["ddp_starting"] = bool(
            (meets(s) and any(busy(o) for o in peers))
            or (not meets(s) and busy(s) and not s.get("in_collective")
                and any(meets(o) for o in peers)))
