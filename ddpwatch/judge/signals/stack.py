"""Stack family: what py-spy dumps say a rank's main thread is doing. Pure."""
from __future__ import annotations

from ...observe.snapshot import Snapshot
from ..stackmatch import classify_stack, describe_top
from .lookup import stacks_of
from .spec import declare

SIGNALS = declare(
    ("stack", str, "main thread: collective, ddp_backward, rendezvous, compile, agent, "
                   "idle_user, active, mixed, stopped or unknown (py-spy)"),
    ("stack_top", str, "the innermost frames of the main thread"),
    ("stack_samples", int, "stack dumps taken in the window"),
)


def measure(history: tuple[Snapshot, ...], pid: int) -> dict:
    dumps = [d for d in stacks_of(history, pid) if d.threads]
    stopped = [d for d in stacks_of(history, pid) if d.status.startswith("stopped")]
    if not dumps:
        return {"stack": "stopped" if stopped else None, "stack_samples": 0}
    kinds = [classify_stack(d) for d in dumps]
    # One dump is not evidence (healthy ranks spend much time in the same wait):
    # the stack signal is the kind seen in every sample, else "mixed".
    kind = kinds[0] if len(set(kinds)) == 1 else "mixed"
    return {"stack": kind, "stack_top": describe_top(dumps[-1]), "stack_samples": len(dumps)}
