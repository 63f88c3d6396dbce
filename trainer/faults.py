"""Fault injection: put a run into a known-bad state on purpose (`--fault SPEC`).

Like NVRx's test trainer (`--simulated_fault rank_hung` sends SIGSTOP), each
fault reproduces a failure seen in real runs (docs/design.md "Failures seen in
real runs") so ddpwatch's tests can check it is named:

  hang:rank=R:step=S[:secs=X]   sleep outside any collective (default: for ever)
  stop:rank=R:step=S            SIGSTOP itself (frozen: state T, 0% CPU)
  exit:rank=R:step=S            leave the loop early, like a rank out of shards
  slow:rank=R:factor=F[:step=S] a straggler: F times the compute from step S on
  desync:rank=R:step=S          call a different collective than the peers
  bf16[:rank=R]                 compute in bf16 whatever --dtype says
  data-mismatch:rank=R          other data: the shard list less its last file
                                (a missed download), or another synthetic seed

Faults act at the START of step S, before its forward: `hang:rank=1:step=20`
means rank 1 completes steps 0..19. Where `rank` is omitted, every rank has the
fault.

Parsing is pure; the effects below it are what the training loop calls.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

import torch

# kind -> (required keys, optional keys)
KINDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "hang": (frozenset({"step"}), frozenset({"rank", "secs"})),
    "stop": (frozenset({"step"}), frozenset({"rank"})),
    "exit": (frozenset({"step"}), frozenset({"rank"})),
    "slow": (frozenset({"factor"}), frozenset({"rank", "step"})),
    # These two only make sense for some ranks: all ranks desynced alike agree.
    "desync": (frozenset({"rank", "step"}), frozenset()),
    "bf16": (frozenset(), frozenset({"rank"})),
    "data-mismatch": (frozenset({"rank"}), frozenset()),
}


class FaultSpecError(ValueError):
    """A --fault spec that cannot be used; the message names the spec and the problem."""


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int | None = None     # None: every rank
    step: int | None = None     # the step at whose start the fault acts
    secs: float | None = None   # hang: how long (None: for ever)
    factor: float | None = None  # slow: compute time multiplier
    spec: str = ""

    def applies_to(self, rank: int) -> bool:
        return self.rank is None or self.rank == rank


def _number(spec: str, key: str, text: str, *, integer: bool) -> int | float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise FaultSpecError(f"--fault {spec!r}: {key}={text!r} is not {kind}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise FaultSpecError(f"--fault {spec!r}: {key}={text!r} is not a finite number")
    return value


def parse_fault(spec: str) -> Fault:
    kind, *pairs = spec.strip().split(":")
    if kind not in KINDS:
        raise FaultSpecError(f"--fault {spec!r}: unknown fault kind {kind!r} "
                             f"(known: {', '.join(KINDS)})")
    required, optional = KINDS[kind]
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise FaultSpecError(f"--fault {spec!r}: {pair!r} is not key=value")
        if key not in required | optional:
            allowed = ", ".join(sorted(required | optional)) or "none"
            raise FaultSpecError(f"--fault {spec!r}: unknown key {key!r} for {kind} "
                                 f"(keys: {allowed})")
        if key in values:
            raise FaultSpecError(f"--fault {spec!r}: {key} given twice")
        values[key] = value
    missing = sorted(required - set(values))
    if missing:
        raise FaultSpecError(f"--fault {spec!r}: {kind} needs {', '.join(missing)}")
    fields: dict[str, int | float] = {}
    for key in ("rank", "step"):
        if key in values:
            fields[key] = _number(spec, key, values[key], integer=True)
            if fields[key] < 0:
                raise FaultSpecError(f"--fault {spec!r}: {key} must be >= 0")
    if "secs" in values:
        fields["secs"] = _number(spec, "secs", values["secs"], integer=False)
        if fields["secs"] <= 0:
            raise FaultSpecError(f"--fault {spec!r}: secs must be > 0")
    if "factor" in values:
        fields["factor"] = _number(spec, "factor", values["factor"], integer=False)
        if fields["factor"] < 1:
            raise FaultSpecError(f"--fault {spec!r}: factor must be >= 1 (it multiplies "
                                 f"the compute time)")
    if kind == "slow":
        fields.setdefault("step", 0)
    return Fault(kind=kind, spec=spec, **fields)


def parse_faults(specs) -> tuple[Fault, ...]:
    return tuple(parse_fault(s) for s in specs or ())


def check_world(faults, world_size: int) -> None:
    """Faults that cannot apply to a run of `world_size` ranks are errors, not no-ops."""
    for fault in faults:
        if fault.rank is not None and fault.rank >= world_size:
            raise FaultSpecError(f"--fault {fault.spec!r}: rank {fault.rank} but the world "
                                 f"size is {world_size}")
        if fault.kind == "desync" and world_size < 2:
            raise FaultSpecError(f"--fault {fault.spec!r}: desync needs at least 2 ranks "
                                 f"(run under torchrun)")


# --- effects -------------------------------------------------------------------------
class Injector:
    """The faults of one rank, asked by the training loop at fixed points."""

    def __init__(self, faults, rank: int, log=print):
        self.faults = tuple(f for f in faults if f.applies_to(rank))
        self.rank = rank
        self.log = log
        self.desync_group = None  # set once the process group is up (desync_collective)

    def before_step(self, step: int, compute_seconds: float | None) -> str:
        """Everything this rank's faults do at the start of `step`, in one call
        from the training loop: hang, stop, enter a collective the peers never
        call, burn CPU as a straggler. Returns "exit" when the loop must leave.
        `compute_seconds`: the last step's forward and backward (a slow fault
        burns a multiple of it; nothing before the first step has been timed)."""
        actions = self.at_step_start(step)  # hang and stop happen in here
        if "exit" in actions:
            return "exit"
        if "desync" in actions:
            self.log(f"fault desync: at step {step} calling all_gather_into_tensor where the "
                     f"peers call all_reduce")
            desync_collective(self.desync_group)
        slow = self.slow_factor(step)
        if slow > 1 and compute_seconds is not None:
            # Before the forward, so peers wait for us in the gradient all-reduce,
            # where a real straggler keeps them.
            burn((slow - 1) * compute_seconds)
        return ""

    def _at(self, kind: str, step: int):
        return [f for f in self.faults if f.kind == kind and f.step == step]

    def has(self, kind: str) -> bool:
        return any(f.kind == kind for f in self.faults)

    def at_step_start(self, step: int) -> set[str]:
        """Hang or stop here if told to; return the actions the loop must take
        itself ("exit", "desync")."""
        for fault in self._at("hang", step):
            how = f"for {fault.secs:g}s" if fault.secs else "for ever"
            self.log(f"fault {fault.spec}: sleeping {how} at step {step}, outside any collective")
            hang(fault.secs)
        for fault in self._at("stop", step):
            self.log(f"fault {fault.spec}: SIGSTOP at step {step} (SIGCONT resumes)")
            os.kill(os.getpid(), signal.SIGSTOP)
        return {kind for kind in ("exit", "desync") if self._at(kind, step)}

    def slow_factor(self, step: int) -> float:
        """Compute multiplier of this step (several slow faults multiply)."""
        factor = 1.0
        for fault in self.faults:
            if fault.kind == "slow" and step >= fault.step:
                factor *= fault.factor
        return factor


def hang(secs: float | None) -> None:
    """Sleep `secs` (None: until killed), in short naps so signals are handled."""
    deadline = None if secs is None else time.monotonic() + secs
    while deadline is None or time.monotonic() < deadline:
        left = 60.0 if deadline is None else deadline - time.monotonic()
        time.sleep(max(0.0, min(60.0, left)))


_burn_matrix = None


def burn(seconds: float) -> None:
    """Keep a core busy with real matmuls for `seconds`: a slow rank shows ~100%
    CPU, which is how the field tells slow from stuck (stuck sits at 0%)."""
    global _burn_matrix
    if _burn_matrix is None:
        _burn_matrix = torch.randn(128, 128) / 128 ** 0.5
    a = _burn_matrix
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ _burn_matrix)  # tanh keeps values bounded


def desync_collective(group) -> None:
    """Enter a collective the peers never call.

    It runs on `group`, a process group only this rank ever uses: on the default
    group a mismatched Gloo collective may also hang, but may instead abort the
    process ("Received data size doesn't match expected size") or pair up with
    the peers' op and return garbage, depending on sizes. A private group makes
    the outcome certain: each side waits in its own collective until the timeout.
    """
    import torch.distributed as dist
    world = dist.get_world_size()
    out = torch.zeros(world)
    dist.all_gather_into_tensor(out, torch.ones(1), group=group)
    print(f"fault desync: all_gather_into_tensor returned: {out.tolist()}",
          file=sys.stderr, flush=True)
