"""Rules: declarative conditions over named signals, loaded strictly from YAML.

    rules:
      - id: stopped
        verdict: stopped          # or `finding: <id>` for findings
        stage: stopped            # verdict rules: when it is tried (stages.py)
        overrides: [other-id]     # optional: tried just before these, of its stage
        role: culprit             # culprit | victim | none (verdict rules)
        confidence: 0.95
        severity: warning         # finding rules: info | warning | critical
        description: "What state it names and why, for people (docs/rules.md)."
        when: ["alive", "state in ['T', 't']"]   # all must hold (conditions.py;
                                                 # an item may be `any: [...]`)
        evidence: "process state {state} ..."   # str.format over the signals
        remedy: "kill -CONT {pid} ..."

The first verdict rule that matches, in the order of stages.order, decides a
rank's verdict and role; every finding rule that matches adds a finding.
`priority: N` (no stage) is the old way to order verdict rules, still accepted
(legacy.py). Unknown keys, stages, signals, verdicts or roles are errors naming
file, line and rule id (ConfigError, exit 78); so are overrides of rules that
do not exist, of another stage's, or in a circle, once the files are merged
(load_default). `ddpwatch rules signals` lists the signals.
"""
from __future__ import annotations

import functools
import re
import string
from dataclasses import dataclass

import yaml

from .. import yamlfile
from ..errors import ConfigError
from . import stages
from .conditions import AnyOf, Condition, compiled, parse_when
from .vocabulary import FINDINGS, NAMES as VERDICTS, ROLES, SEVERITIES

RULE_KEYS = {"id", "verdict", "finding", "role", "stage", "overrides", "priority", "confidence",
             "severity", "when", "evidence", "remedy", "description"}


@dataclass(frozen=True)
class Rule:
    id: str
    source: str        # file:line, for messages
    verdict: str
    finding: str
    role: str
    stage: str                  # verdict rules: one of stages.NAMES; "" in the old format
    overrides: tuple[str, ...]  # ids of rules of its stage it is tried before
    priority: int | None        # the old format's order (legacy.py); None when not given
    confidence: float
    severity: str
    when: tuple[Condition | AnyOf, ...]
    evidence: str
    remedy: str
    description: str = ""

    def matches(self, signals: dict) -> bool:
        return self.test(signals)

    @functools.cached_property
    def test(self):
        """`when` as one function of the signals (conditions.compiled), made at
        first use: what `matches` calls, and classify.judge directly."""
        return compiled(self.when)


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
    (a rank without heartbeats has no collective number to cite). Every rank's
    evidence and remedy are rendered at every judgement: a template of plain
    `{signal:spec}` fields is parsed once (`_compiled`), any other goes the
    long way (`render_parsing`), with the same result."""
    pieces = _compiled(template)
    if pieces is None:
        return render_parsing(template, signals)
    out = []
    for optional, parts in pieces:
        if optional and any(f is not None and signals.get(f) is None for _, f, _ in parts):
            continue
        for literal, field, spec in parts:
            out.append(literal)
            if field is None:
                continue
            value = signals.get(field)
            if value is None:
                out.append("?")
                continue
            try:
                out.append(format(value, spec))
            except (TypeError, ValueError):
                out.append(str(value))
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def _compiled(template: str) -> tuple | None:
    """((optional, ((literal, field, spec), ...)), ...) for a template whose fields
    are plain names with a plain spec, None for any other (a conversion, an
    index, a nested field, a bracket inside a field)."""
    pieces, pos = [], 0
    try:
        for m in _OPTIONAL.finditer(template):
            pieces.append((False, _parts(template[pos:m.start()])))
            pieces.append((True, _parts(m.group(1))))
            pos = m.end()
        pieces.append((False, _parts(template[pos:])))
    except ValueError:
        return None
    return tuple(pieces)


def _parts(text: str) -> tuple:
    parts = []
    for literal, field, spec, conversion in _Blank().parse(text):
        if field is not None and (not field.isidentifier() or conversion or "{" in spec):
            raise ValueError(field)
        parts.append((literal, field, spec))
    return tuple(parts)


def render_parsing(template: str, signals: dict) -> str:
    """`render` by string.Formatter: every template, parsed at each call."""
    def optional(m):
        fields = [f for _, f, _, _ in _Blank().parse(m.group(1)) if f]
        return "" if any(signals.get(f) is None for f in fields) else m.group(1)
    return _Blank().format(_OPTIONAL.sub(optional, template), **signals)


def load(path: str) -> list[Rule]:
    return parse(yamlfile.read_text(path), path)


def parse(text: str, path: str = "<rules>") -> list[Rule]:
    root = yamlfile.compose(text, path)
    if root is None or not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{path}: expected a mapping with a 'rules' list")
    top = {}
    for key_node, value_node in root.value:
        key = yamlfile.scalar_key(key_node, path)
        if key not in ("rules", "version"):
            raise ConfigError(f"{path}:{key_node.start_mark.line + 1}: unknown key "
                              f"{yamlfile.show(key)} (allowed: rules, version)")
        top[key] = value_node
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
    for key_node, _ in node.value:
        yamlfile.scalar_key(key_node, path)
    raw = yamlfile.construct(node, path)
    if not isinstance(raw.get("id", ""), (str, int)) or isinstance(raw.get("id"), bool):
        raise ConfigError(f"{path}:{line}: a rule id is a name, not {yamlfile.show(raw['id'])}")
    rule_id = str(raw.get("id", "?"))
    where = f"{path}:{line}: rule {yamlfile.show(rule_id)}"
    for key_node, _ in node.value:
        if key_node.value not in RULE_KEYS:
            raise ConfigError(f"{path}:{key_node.start_mark.line + 1}: rule "
                              f"{yamlfile.show(rule_id)}: "
                              f"unknown key {yamlfile.show(key_node.value)} (allowed: "
                              f"{', '.join(sorted(RULE_KEYS))})")
    if "id" not in raw:
        raise ConfigError(f"{path}:{line}: rule without an id")
    for key in ("verdict", "finding", "role", "severity", "evidence", "remedy", "description"):
        if key in raw and not isinstance(raw[key], str):
            raise ConfigError(f"{where}: {key}: a string, not {yamlfile.show(raw[key])}")
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
    when = parse_when(raw.get("when", []), where)
    stage, overrides, priority = _order(raw, where)
    confidence = raw.get("confidence", 0.8)
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)):
        raise ConfigError(f"{where}: confidence must be a number")
    confidence = float(confidence)
    if not 0.0 <= confidence <= 1.0:  # also false for nan
        raise ConfigError(f"{where}: confidence {confidence} is not within 0..1")
    for key in ("evidence", "remedy"):
        try:
            _Blank().parse(str(raw.get(key, "")))
            list(_Blank().parse(str(raw.get(key, ""))))
        except ValueError as err:
            raise ConfigError(f"{where}: bad {key} template: {err}") from err
    return Rule(id=rule_id, source=f"{path}:{line}", verdict=verdict, finding=finding,
                role=role, stage=stage, overrides=overrides, priority=priority,
                confidence=confidence, severity=severity, when=when,
                evidence=str(raw.get("evidence", "")), remedy=str(raw.get("remedy", "")),
                description=" ".join(str(raw.get("description", "")).split()))


def _order(raw: dict, where: str) -> tuple[str, tuple[str, ...], int | None]:
    """stage, overrides and the old format's priority of a rule."""
    stage, overrides, priority = raw.get("stage", ""), raw.get("overrides", []), raw.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                 or not -10**6 <= priority <= 10**6):
        raise ConfigError(f"{where}: priority must be a whole number within -1000000..1000000")
    if ("stage" in raw or "overrides" in raw) and raw.get("finding"):
        raise ConfigError(f"{where}: 'stage' and 'overrides' order verdict rules; every finding "
                          f"rule applies")
    if "stage" in raw and stage not in stages.NAMES:
        raise ConfigError(f"{where}: unknown stage {yamlfile.show(stage)} (one of "
                          f"{', '.join(stages.NAMES)}, tried in that order)")
    if stage and priority is not None:
        raise ConfigError(f"{where}: 'stage' and 'priority' both order it: keep the stage "
                          f"(priority is the old format)")
    if not isinstance(overrides, list) or not all(
            isinstance(o, (str, int)) and not isinstance(o, bool) for o in overrides):
        raise ConfigError(f"{where}: 'overrides' must be a list of rule ids, not "
                          f"{yamlfile.show(overrides)}")
    if overrides and not stage:
        raise ConfigError(f"{where}: 'overrides' needs a 'stage' (it orders rules within one)")
    return stage, tuple(str(o) for o in overrides), priority


def load_default(extra_files=(), warn=None) -> list[Rule]:
    """The shipped rules, then each extra file on top (by id: add or override),
    their order checked (stages.order: overrides of unknown rules, of another
    stage's, or in a circle are errors). A rule of the old format (`priority:`)
    loads; `warn(note)` is told what replaces it (stages.deprecations)."""
    from ..resources import shipped
    rules = load(shipped("rules", "default.yaml"))
    for path in extra_files or ():
        rules = merge(rules, load(path))
    stages.order(rules)
    for note in stages.deprecations(rules) if warn is not None else ():
        warn(note)
    return rules


def merge(base: list[Rule], extra: list[Rule]) -> list[Rule]:
    """`extra` adds rules; a rule with an existing id replaces it, in its place
    (tried where it was: stages.py), unless it names another stage: then it
    joins that stage last, as a new rule would."""
    by_id = {r.id: r for r in base}
    for r in extra:
        old = by_id.get(r.id)
        if old is not None and r.stage and r.stage != old.stage:
            del by_id[r.id]
        by_id[r.id] = r
    return list(by_id.values())
