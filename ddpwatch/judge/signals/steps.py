"""The cross-rank steps: functions that complete every rank's signals from the
others' (`with_peers`). Each declares, where it is defined, the signals of other
steps it reads and every signal it writes (`cross_rank`); their order follows from
that (`ordered`), so a new step goes anywhere and runs after what it reads. What a
step reads of the per-rank families needs no declaring: they are all measured
before any step runs. tests/unit/judge/test_signal_steps_unit.py checks the
declarations against what the steps do on every replay fixture."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    fn: Callable[[list[dict]], None]
    reads: tuple[str, ...]    # signals other steps write that it reads
    writes: tuple[str, ...]   # every signal it sets

    @property
    def name(self) -> str:
        return f"{self.fn.__module__.rpartition('.')[2]}.{self.fn.__name__}"


def cross_rank(*, reads: tuple[str, ...] = (), writes: tuple[str, ...]):
    """Marks `fn(ranks)` as a cross-rank step of its family (found by `of`)."""
    def mark(fn):
        fn.step = Step(fn, reads, writes)
        return fn
    return mark


def of(modules: Iterable) -> list[Step]:
    """The steps the modules define, in the modules' order, each's in source order."""
    return [step for m in modules for step in sorted(
        (v.step for v in vars(m).values() if isinstance(getattr(v, "step", None), Step)
         and v.__module__ == m.__name__), key=lambda s: s.fn.__code__.co_firstlineno)]


def ordered(steps: list[Step]) -> tuple[Step, ...]:
    """Each step after the steps that write what it reads; otherwise in the order
    given. A read no step writes, a signal two steps write, or a cycle is an error."""
    writer: dict[str, Step] = {}
    for step in steps:
        for name in step.writes:
            if name in writer:
                raise ValueError(f"signal {name!r} is written by {writer[name].name} and "
                                 f"{step.name}")
            writer[name] = step
    after: dict[str, set[str]] = {}
    for step in steps:
        missing = [n for n in step.reads if n not in writer]
        if missing:
            raise ValueError(f"{step.name} reads {', '.join(missing)}, which no cross-rank "
                             f"step writes")
        after[step.name] = {writer[n].name for n in step.reads} - {step.name}
    out: list[Step] = []
    while len(out) < len(steps):
        done = {s.name for s in out}
        ready = [s for s in steps if s.name not in done and after[s.name] <= done]
        if not ready:
            raise ValueError("cross-rank steps read each other's signals in a cycle: "
                             + ", ".join(sorted(after.keys() - done)))
        out.append(ready[0])
    return tuple(out)
