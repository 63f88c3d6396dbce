"""`ddpwatch rules explain ID [--rules FILE...]` (as ruff's `ruff rule F401`):
one rule as it is tried, with the shipped rules and any --rules file on top:
what it gives, where it is written, its stage and place in the order, its
description, its conditions with what each signal means, its evidence and
remedy, the replay fixtures it decides or finds in (judged as `rules doc`
judges them: commands/rules_doc.py `exercised`), and where it is overridden (a
rule tried before it by `overrides:`, a --rules file that replaced it). An id no
rule has exits 67, naming the closest ids."""
from __future__ import annotations

import difflib
import glob
import json
import os
import textwrap

from .. import errors
from ..judge import rules as rules_mod, stages
from ..judge.signals import FAMILY, SIGNALS
from . import load_rules
from .rules_doc import CHECKOUT, exercised

WIDTH = 88


def main(args) -> int:
    shipped = {r.id: r for r in rules_mod.load_default()}
    rules = load_rules("rules explain", args.rules)
    by_id = {r.id: r for r in rules}
    rule = by_id.get(args.id)
    if rule is None:
        near = difflib.get_close_matches(args.id, by_id, n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise errors.Unknown(f"no rule {args.id!r}{hint}; `ddpwatch rules doc` lists them all")
    doc = explain(rule, rules, shipped.get(rule.id), _fixtures(args.fixtures, rules, rule))
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(text(doc), end="")
    return errors.OK


def _fixtures(directory: str | None, rules, rule) -> list | None:
    """[(fixture, rank)] it decides or finds in; None where no fixtures are at hand
    (an installed ddpwatch has none: --fixtures DIR)."""
    where = directory or os.path.join(CHECKOUT, "tests", "fixtures", "snapshots")
    paths = sorted(glob.glob(os.path.join(glob.escape(where), "*.json")))
    if not paths and directory:
        raise errors.NoInput(f"{directory}: no replay fixtures (*.json) there")
    return sorted(set(exercised(rules, paths).get(rule.id, ()))) if paths else None


def explain(rule, rules, shipped, fixtures) -> dict:
    """What `text` prints, as data (`--json`)."""
    doc = {"id": rule.id, "source": rule.source, "description": rule.description,
           "when": [c.text for c in rule.when],
           "signals": [{"name": n, "family": FAMILY[n], "type": SIGNALS[n].type_name,
                        "unit": SIGNALS[n].unit or None, "meaning": SIGNALS[n].doc}
                       for n in dict.fromkeys(s for c in rule.when for s in c.signals)
                       if n in SIGNALS],
           "evidence": rule.evidence, "remedy": rule.remedy,
           "fixtures": None if fixtures is None else [{"fixture": f, "rank": r}
                                                       for f, r in fixtures],
           "replaces": shipped.source if shipped is not None and shipped.source != rule.source
           else None}
    if rule.finding:
        doc.update(kind="finding", finding=rule.finding, severity=rule.severity)
        return doc
    tried = stages.order(rules)
    doc.update(kind="verdict", verdict=rule.verdict, role=rule.role, confidence=rule.confidence,
               stage=rule.stage or None,
               stage_doc=dict(stages.STAGES).get(rule.stage),
               stage_number=stages.NAMES.index(rule.stage) + 1 if rule.stage else None,
               position=tried.index(rule) + 1, of=len(tried),
               overrides=list(rule.overrides),
               overridden_by=[f"{o.id} ({o.source})" for o in tried if rule.id in o.overrides],
               tried_after=tried[tried.index(rule) - 1].id if tried.index(rule) else None)
    return doc


def text(doc: dict) -> str:
    if doc["kind"] == "verdict":
        what = (f"verdict {doc['verdict']}, role {doc['role']}, confidence "
                f"{doc['confidence']:g}")
    else:
        what = f"finding {doc['finding']}, severity {doc['severity']}"
    out = [f"{doc['id']}: {what}", f"  written at   {doc['source']}"]
    if doc["replaces"]:
        out.append(f"  replaces     the shipped rule of that id ({doc['replaces']})")
    if doc["kind"] == "verdict":
        if doc["stage"]:
            out.append(f"  stage        {doc['stage']} ({doc['stage_number']} of "
                       f"{len(stages.NAMES)})")
        else:
            out.append("  stage        none (the old format: placed by its priority)")
        out.append(f"  tried        {doc['position']} of {doc['of']} verdict rules"
                   + (f", after {doc['tried_after']}" if doc["tried_after"] else ", first"))
        if doc["overrides"]:
            out.append(f"  overrides    {', '.join(doc['overrides'])} (tried just before them)")
        out.append("  overridden   " + (", ".join(doc["overridden_by"]) if doc["overridden_by"]
                                        else "by no rule (none says `overrides: "
                                             f"[{doc['id']}]`)"))
    else:
        out.append("  applies      with every verdict (every finding rule that matches adds "
                   "its finding)")
    out += ["", _wrap(doc["description"] or "(no description)", "  "), "", "  when all of:"]
    out += [f"    {c}" for c in doc["when"]]
    if doc["signals"]:
        out += ["", "  signals:"]
        for s in doc["signals"]:
            unit = f", {s['unit']}" if s["unit"] else ""
            out.append(_wrap(f"{s['name']} ({s['family']}, {s['type']}{unit}): {s['meaning']}",
                             "    ", "      "))
    out += ["", _wrap(f"evidence: {doc['evidence']}", "  ", "    "),
            _wrap(f"remedy: {doc['remedy']}", "  ", "    ")]
    if doc["kind"] == "verdict" and doc.get("stage_doc"):
        out += ["", _wrap(f"stage {doc['stage']}: {doc['stage_doc']}", "  ", "    ")]
    if doc["fixtures"] is None:
        fixtures = ("no replay fixtures at hand (a source checkout's tests/fixtures/snapshots; "
                    "--fixtures DIR)")
    else:
        fixtures = ", ".join(f"{f['fixture']} (rank {f['rank']})" if f["rank"] >= 0
                             else f"{f['fixture']} (unnumbered)" for f in doc["fixtures"]) \
            or "none decides or finds by it"
    out += ["", _wrap(f"fixtures: {fixtures}", "  ", "    ")]
    return "\n".join(out) + "\n"


def _wrap(line: str, first: str, rest: str | None = None) -> str:
    return textwrap.fill(line, WIDTH, initial_indent=first,
                         subsequent_indent=first if rest is None else rest,
                         break_on_hyphens=False, break_long_words=False)
