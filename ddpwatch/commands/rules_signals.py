"""`ddpwatch rules signals [NAME...]`: every signal a rule may name, with its
family, type, unit and meaning (judge/signals/*.py SIGNALS); `--json` for
machines. An unknown name is a usage error (exit 2)."""
from __future__ import annotations

import difflib
import json

from .. import errors
from ..judge.signals import FAMILY, SIGNALS
from ..judge.signals.spec import UNITS


def main(args) -> int:
    families = sorted(set(FAMILY.values()))
    if args.family and args.family not in families:
        raise errors.UsageError(f"no signal family {args.family!r} (one of "
                                f"{', '.join(families)})")
    for name in args.names:
        if name not in SIGNALS:
            near = difflib.get_close_matches(name, SIGNALS, n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise errors.UsageError(f"no signal {name!r}{hint}; `ddpwatch rules signals` "
                                    f"lists them all")
    chosen = [SIGNALS[n] for n in (args.names or SIGNALS)
              if not args.family or FAMILY[n] == args.family]
    if args.json:
        print(json.dumps({"signals": [{"name": s.name, "family": FAMILY[s.name],
                                       "type": s.type_name, "unit": s.unit or None,
                                       "meaning": s.doc, "values": list(s.values) or None}
                                      for s in chosen],
                          "units": UNITS}, indent=2))
        return errors.OK
    rows = [("SIGNAL", "FAMILY", "TYPE", "UNIT", "MEANING")]
    rows += [(s.name, FAMILY[s.name], s.type_name, s.unit or "-", s.meaning) for s in chosen]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4])
    used = [u for u in UNITS if any(s.unit == u for s in chosen)]
    if used:
        print("\nunits:")
        for unit in used:
            print(f"  {unit.ljust(max(map(len, used)))}  {UNITS[unit]}")
    return errors.OK
