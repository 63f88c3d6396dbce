"""What the judge reads from one stack dump, worked out once per dump.

A rank's dump is read by several signals (its kind, call site, top frames,
pause kind, loop position, bf16 frames: judge/signals/stack.py), each of which
first finds the thread that trains (stackmatch.training_thread): a dozen walks
over the same frames per rank, every judgement. And the daemon keeps a job's
last dump for a while between dumps (observe/sampler.py KeptStacks), so the
same dump is judged again at every tick. Dumps are frozen (PidStacks), so a
reading of one never changes: `per_dump` keeps it for as long as the dump
exists, keyed by the dump's identity, dropped when the dump is (a weak
reference's callback). Anything that is not a PidStacks (tests' hand-made
dumps) is read afresh each time.
"""
from __future__ import annotations

import functools
import weakref

from ..observe.probes.stacks import PidStacks


def per_dump(fn):
    """`fn(dump)`, kept per PidStacks object."""
    memo: dict[int, tuple] = {}

    @functools.wraps(fn)
    def cached(dump):
        if type(dump) is not PidStacks:
            return fn(dump)
        key = id(dump)
        hit = memo.get(key)
        if hit is not None and hit[0]() is dump:
            return hit[1]
        value = fn(dump)
        # the callback runs before the dump's memory (and so its id) is free again
        memo[key] = (weakref.ref(dump, lambda _, key=key: memo.pop(key, None)), value)
        return value

    cached.memo = memo  # tests: what is kept
    return cached
