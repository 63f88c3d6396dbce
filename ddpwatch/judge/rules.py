"""Rules: declarative conditions over named signals, loaded strictly from YAML.

    rules:
      - id: stopped
        verdict: stopped          # or `finding: <id>` for findings
        role: culprit             # culprit | victim | none (verdict rules)
        priority: 90              # higher is tried first (verdict rules)
        confidence: 0.95
        severity: warning         # finding rules: info | warning | critical
        when: ['state in ["T", "t"]']
        evidence: "process state {state} ..."   # str.format over the signals
        remedy: "kill -CONT {pid} ..."

A condition is `<signal>`, `not <signal>`, or `<signal> <op> <YAML value>` with
op one of == != < <= > >= in. A condition on an unmeasured (None) signal is
false. Unknown keys, signals, verdicts or roles are errors naming file, line and
rule id (ConfigError, exit 78).
"""
from __future__ import annotations

import operator
import re
import string
from dataclasses import dataclass

import yaml

from ..errors import ConfigError
from .membership import SIGNALS as _MEMBERSHIP
from .signals import SIGNALS
from .window import SIGNALS as _WINDOW
from .vocabulary import FINDINGS, NAMES as VERDICTS, ROLES, SEVERITIES

RULE_KEYS = {"id", "verdict", "finding", "role", "priority", "confidence", "severity", "when",
             "evidence", "remedy", "description"}
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


@dataclass(frozen=True)
class Rule:
    id: str
    source: str        # file:line, for messages
    verdict: str
    finding: str
    role: str
    priority: int
    confidence: float
    severity: str
    when: tuple[Condition, ...]
    evidence: str
    remedy: str

    def matches(self, signals: dict) -> bool:
        return all(c.holds(signals) for c in self.when)


class _Blank(string.Formatter):
    """Formats evidence; an unmeasured signal shows as '?', never an exception."""

    def get_value(self, key, args, kwargs):
        value = kwargs.get(key)
        return _Unknown() if value is None else value

    def format_field(self, value, format_spec):
        if isinstance(value, _Unknown):
            return "?"
        try:
            return format(value, format_spec)
        except (TypeError, ValueError):
            return str(value)


class _Unknown:
    pass


_OPTIONAL = re.compile(r"\[([^\[\]]*)\]")


def render(template: str, signals: dict) -> str:
    """Format evidence; a [bracketed part] is left out when a signal in it is unknown
    (a rank without heartbeats has no collective number to cite)."""
    def optional(m):
        fields = [f for _, f, _, _ in _Blank().parse(m.group(1)) if f]
        return "" if any(signals.get(f) is None for f in fields) else m.group(1)
    return _Blank().format(_OPTIONAL.sub(optional, template), **signals)


def parse_condition(text: str, where: str) -> Condition:
    m = _COND.match(str(text))
    if not m:
        raise ConfigError(f"{where}: cannot read condition {text!r} "
                          f"(want '<signal> <op> <value>', op one of {' '.join(_OPS)})")
    negate, signal, op, raw = m.groups()
    if signal not in SIGNALS and signal not in _MEMBERSHIP and signal not in _WINDOW:
        raise ConfigError(f"{where}: unknown signal {signal!r} in {text!r}")
    if negate and op:
        raise ConfigError(f"{where}: 'not' only goes with a bare signal: {text!r}")
    if not op:
        return Condition(text, signal, "not" if negate else "")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: bad value in {text!r}: {err}") from err
    if op == "in" and not isinstance(value, list):
        raise ConfigError(f"{where}: 'in' needs a list: {text!r}")
    return Condition(text, signal, op, tuple(value) if isinstance(value, list) else value)


def load(path: str) -> list[Rule]:
    try:
        with open(path) as f:
            text = f.read()
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror}") from err
    return parse(text, path)


def parse(text: str, path: str = "<rules>") -> list[Rule]:
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{line}: not valid YAML: {getattr(err, 'problem', err)}") from err
    if root is None or not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{path}: expected a mapping with a 'rules' list")
    top = {k.value: v for k, v in root.value}
    for key_node, _ in root.value:
        if key_node.value not in ("rules", "version"):
            raise ConfigError(f"{path}:{key_node.start_mark.line + 1}: unknown key "
                              f"{key_node.value!r} (allowed: rules, version)")
    rules_node = top.get("rules")
    if not isinstance(rules_node, yaml.SequenceNode):
        raise ConfigError(f"{path}: 'rules' must be a list")
    rules, seen = [], {}
    for node in rules_node.value:
        rule = _rule(node, path)
        if rule.id in seen:
            raise ConfigError(f"{rule.source}: rule {rule.id!r}: duplicate id (first at "
                              f"{seen[rule.id]})")
        seen[rule.id] = rule.source
        rules.append(rule)
    return rules


def _rule(node, path: str) -> Rule:
    line = node.start_mark.line + 1
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{path}:{line}: a rule must be a mapping")
    raw = yaml.safe_load(yaml.serialize(node))
    rule_id = str(raw.get("id", "?"))
    where = f"{path}:{line}: rule {rule_id!r}"
    for key_node, _ in node.value:
        if key_node.value not in RULE_KEYS:
            raise ConfigError(f"{path}:{key_node.start_mark.line + 1}: rule {rule_id!r}: "
                              f"unknown key {key_node.value!r} (allowed: "
                              f"{', '.join(sorted(RULE_KEYS))})")
    if "id" not in raw:
        raise ConfigError(f"{path}:{line}: rule without an id")
    verdict, finding = raw.get("verdict", ""), raw.get("finding", "")
    if bool(verdict) == bool(finding):
        raise ConfigError(f"{where}: needs exactly one of 'verdict' or 'finding'")
    if verdict and verdict not in VERDICTS:
        raise ConfigError(f"{where}: unknown verdict {verdict!r} (one of {', '.join(VERDICTS)})")
    if finding and finding not in FINDINGS:
        raise ConfigError(f"{where}: unknown finding {finding!r} (one of {', '.join(FINDINGS)})")
    role = raw.get("role", "none")
    if role not in ROLES:
        raise ConfigError(f"{where}: unknown role {role!r} (one of {', '.join(ROLES)})")
    severity = raw.get("severity", "warning")
    if severity not in SEVERITIES:
        raise ConfigError(f"{where}: unknown severity {severity!r}")
    when = raw.get("when", [])
    if not isinstance(when, list) or not when:
        raise ConfigError(f"{where}: 'when' must be a non-empty list of conditions")
    try:
        confidence = float(raw.get("confidence", 0.8))
        priority = int(raw.get("priority", 0))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: confidence and priority must be numbers") from err
    if not 0.0 <= confidence <= 1.0:
        raise ConfigError(f"{where}: confidence {confidence} is not within 0..1")
    for key in ("evidence", "remedy"):
        try:
            _Blank().parse(str(raw.get(key, "")))
            list(_Blank().parse(str(raw.get(key, ""))))
        except ValueError as err:
            raise ConfigError(f"{where}: bad {key} template: {err}") from err
    return Rule(id=rule_id, source=f"{path}:{line}", verdict=verdict, finding=finding,
                role=role, priority=priority, confidence=confidence, severity=severity,
                when=tuple(parse_condition(c, where) for c in when),
                evidence=str(raw.get("evidence", "")), remedy=str(raw.get("remedy", "")))


def load_default(extra_files=()) -> list[Rule]:
    """The shipped rules, then each extra file on top (by id: add or override)."""
    from ..resources import shipped
    rules = load(shipped("rules", "default.yaml"))
    for path in extra_files or ():
        rules = merge(rules, load(path))
    return rules


def merge(base: list[Rule], extra: list[Rule]) -> list[Rule]:
    """`extra` adds rules; a rule with an existing id replaces it."""
    by_id = {r.id: r for r in base}
    for r in extra:
        by_id[r.id] = r
    return list(by_id.values())
