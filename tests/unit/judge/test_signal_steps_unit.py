"""The cross-rank steps declare what they read of each other and what they write
(judge/signals/steps.py `cross_rank`); their order follows. The declarations are
checked against what each step does on every replay fixture."""
import glob
import os

import pytest
from replay_expected import SNAPSHOTS

from ddpwatch.judge import signals
from ddpwatch.judge.signals.steps import Step, ordered
from ddpwatch.observe.snapshot import load, load_remote


def step(name, reads=(), writes=()):
    fn = lambda ranks: None  # noqa: E731
    fn.__name__, fn.__module__ = name, "fam"
    return Step(fn, tuple(reads), tuple(writes))


def test_a_step_runs_after_those_it_reads_else_in_the_order_given():
    a, b, c = step("a", reads=["y"], writes=["x"]), step("b", writes=["y"]), step("c", writes=["z"])
    assert [s.name for s in ordered([a, b, c])] == ["fam.b", "fam.a", "fam.c"]
    assert [s.name for s in ordered([c, b, a])] == ["fam.c", "fam.b", "fam.a"]


@pytest.mark.parametrize("steps, message", [
    ([step("a", reads=["y"], writes=["x"]), step("b", reads=["x"], writes=["y"])],
     "in a cycle: fam.a, fam.b"),
    ([step("a", reads=["nobody"], writes=["x"])], "fam.a reads nobody, which no cross-rank"),
    ([step("a", writes=["x"]), step("b", writes=["x"])], "'x' is written by fam.a and fam.b"),
])
def test_a_cycle_a_read_nobody_writes_and_two_writers_are_errors(steps, message):
    with pytest.raises(ValueError, match=message):
        ordered(steps)


def test_every_step_is_found_once_and_the_waits_are_in_order():
    names = [s.name for s in signals.STEPS]
    assert len(names) == len(set(names)) == 10
    assert names.index("window.link") < names.index("stack.link_start") < \
        names.index("peers.link_pauses")
    assert names.index("peers.link") < names.index("launch.orphans")


class Seen(dict):
    """A rank's signals that note which step reads and writes which."""
    step = None   # the step running (one at a time)
    log: list = []

    def __getitem__(self, key):
        Seen.log.append(("read", Seen.step, key))
        return super().__getitem__(key)

    def get(self, key, default=None):
        Seen.log.append(("read", Seen.step, key))
        return super().get(key, default)

    def __setitem__(self, key, value):
        Seen.log.append(("write", Seen.step, key))
        super().__setitem__(key, value)

    def update(self, other=(), **kw):
        for k, v in dict(other, **kw).items():
            self[k] = v


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(SNAPSHOTS, "*.json"))),
                         ids=lambda p: os.path.basename(p)[:-5])
def test_the_declarations_say_what_the_steps_do(path):
    """Whatever the order: a step reading what another writes (before or after it
    runs) declares it, and writes only what it declares."""
    ranks = [Seen(s) for s in signals.local(load(path))]
    ranks += [Seen(dict(s, remote=True)) for s in load_remote(path)]
    Seen.log = []
    for s in signals.STEPS:
        Seen.step = s
        s.fn(ranks)
    written = {(s, key) for what, s, key in Seen.log if what == "write"}
    assert written
    for s, key in written:
        assert key in s.writes, (s.name, "writes", key)
    writer = {key: s for s, key in written}
    for what, s, key in Seen.log:
        if what == "read" and writer.get(key, s) is not s:
            assert key in s.reads, (s.name, "reads", key, "from", writer[key].name)
