"""A rule's conditions: `when` is a list, and the rule matches when every item
holds. An item is a condition string or an `any:` of them:

    when: ["alive", "syn_sent >= 1",
           any: ["syn_sent_to_gloo_off_route", "syn_sent_to_gloo_loopback"]]

A condition is `<signal>`, `not <signal>`, or `<signal> <op> <YAML value>` with
op one of == != < <= > >= in. `any:` holds when one of its items holds; an item
of `any:` is a condition or a list of conditions that must all hold
(`any: ["a", ["b", "c"]]`: a, or b and c). A condition on an unmeasured (None)
signal is false, `not <signal>` too: a blind watcher concludes nothing either way.
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass

from .. import yamlfile
from ..errors import ConfigError, UndeclaredValue
from .signals import SIGNALS

_OPS = {"==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge,
        "<": operator.lt, ">": operator.gt, "in": lambda a, b: a in b}
_COND = re.compile(r"^\s*(not\s+)?([a-z_][a-z0-9_]*)\s*(?:(==|!=|<=|>=|<|>|in)\s*(.+))?\s*$")


@dataclass(frozen=True)
class Condition:
    text: str
    signal: str
    op: str          # "" (truthy), "not", or a key of _OPS
    value: object = None

    def holds(self, signals: dict) -> bool:
        value = signals.get(self.signal)
        if value is None:
            return False
        if self.op == "":
            return bool(value)
        if self.op == "not":
            return not value
        try:
            return bool(_OPS[self.op](value, self.value))
        except TypeError:
            return False

    @property
    def signals(self) -> tuple[str, ...]:
        return (self.signal,)


@dataclass(frozen=True)
class AnyOf:
    """Holds when every condition of one of its branches holds."""
    branches: tuple[tuple[Condition, ...], ...]

    def holds(self, signals: dict) -> bool:
        return any(all(c.holds(signals) for c in branch) for branch in self.branches)

    @property
    def text(self) -> str:
        return "any: [" + ", ".join(
            branch[0].text if len(branch) == 1 else "[" + ", ".join(c.text for c in branch) + "]"
            for branch in self.branches) + "]"

    @property
    def signals(self) -> tuple[str, ...]:
        return tuple(c.signal for branch in self.branches for c in branch)


def compiled(when: tuple[Condition | AnyOf, ...]):
    """One function of the signals that holds when every item of `when` holds,
    as `holds` says: each condition made a closure over its signal, operator
    and value once, not read back from the Condition at every call. A rule's
    conditions are tried ~60 times per rank per judgement (classify.judge)."""
    tests = tuple(_closure(item) for item in when)
    if len(tests) == 1:
        return tests[0]

    def all_hold(signals: dict) -> bool:
        for test in tests:
            if not test(signals):
                return False
        return True
    return all_hold


def _closure(item: Condition | AnyOf):
    if isinstance(item, AnyOf):
        branches = tuple(compiled(branch) for branch in item.branches)

        def any_holds(signals: dict) -> bool:
            for branch in branches:
                if branch(signals):
                    return True
            return False
        return any_holds
    key, op, expected = item.signal, item.op, item.value
    if op == "":
        return lambda signals: bool(signals.get(key))  # None is false
    if op == "not":
        return lambda signals: (value := signals.get(key)) is not None and not value
    compare = _OPS[op]

    def compares(signals: dict) -> bool:
        value = signals.get(key)
        if value is None:
            return False
        try:
            return bool(compare(value, expected))
        except TypeError:  # a peer's signal of another type (observe/peers.py)
            return False
    return compares


def parse_when(when, where: str) -> tuple[Condition | AnyOf, ...]:
    if not isinstance(when, list) or not when:
        raise ConfigError(f"{where}: 'when' must be a non-empty list of conditions")
    return tuple(_item(item, where) for item in when)


def _item(item, where: str) -> Condition | AnyOf:
    if not isinstance(item, dict):
        return parse_condition(item, where)
    if list(item) != ["any"]:
        raise ConfigError(f"{where}: a condition is a string or 'any: [...]', not "
                          f"{yamlfile.show(item)}")
    branches = item["any"]
    if not isinstance(branches, list) or not branches:
        raise ConfigError(f"{where}: 'any' must be a non-empty list of conditions")
    return AnyOf(tuple(_branch(b, where) for b in branches))


def _branch(branch, where: str) -> tuple[Condition, ...]:
    if not isinstance(branch, list):
        return (parse_condition(branch, where),)
    if not branch:
        raise ConfigError(f"{where}: an empty list in 'any' (a list there means all of it)")
    return tuple(parse_condition(c, where) for c in branch)


def parse_condition(text: str, where: str) -> Condition:
    if not isinstance(text, str):
        raise ConfigError(f"{where}: a condition is a string, not {yamlfile.show(text)}")
    m = _COND.match(text)
    if not m:
        raise ConfigError(f"{where}: cannot read condition {yamlfile.show(text)} "
                          f"(want '<signal> <op> <value>', op one of {' '.join(_OPS)})")
    negate, signal, op, raw = m.groups()
    if signal not in SIGNALS:
        raise ConfigError(f"{where}: unknown signal {signal!r} in {text!r}")
    if negate and op:
        raise ConfigError(f"{where}: 'not' only goes with a bare signal: {text!r}")
    if not op:
        return Condition(text, signal, "not" if negate else "")
    node = yamlfile.compose(raw, f"{where}: value in {yamlfile.show(text)}")
    value = None if node is None else yamlfile.construct(node, f"{where}: {yamlfile.show(text)}")
    if op == "in" and not isinstance(value, list):
        raise ConfigError(f"{where}: 'in' needs a list: {text!r}")
    spec = SIGNALS[signal]
    wrong = [v for v in (value if isinstance(value, list) else [value]) if not spec.accepts(v)]
    if wrong:
        kinds = spec.kind if isinstance(spec.kind, tuple) else (spec.kind,)
        raise ConfigError(f"{where}: {signal} is {' or '.join(k.__name__ for k in kinds)}, "
                          f"not {type(wrong[0]).__name__} ({wrong[0]!r}) in {text!r}")
    undeclared = [v for v in (value if isinstance(value, list) else [value])
                  if not spec.declares(v)]
    if undeclared:
        raise UndeclaredValue(f"{where}: {signal} is never {undeclared[0]!r} in {text!r} (one "
                              f"of: {', '.join(spec.values)})")
    return Condition(text, signal, op, tuple(value) if isinstance(value, list) else value)
