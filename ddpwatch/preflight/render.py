"""The table every node prints: one line per check (status, check, node, the
measured fact, the fix), and the same rows as JSON for scripts."""
from __future__ import annotations

import json

MARK = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "cannot": "CANNOT-RUN"}


def exit_code(rows: list[dict]) -> int:
    """0 when every check passed (warnings allowed), 1 when one failed or
    could not run: a check that did not run is never a pass."""
    return 1 if any(r["status"] in ("fail", "cannot") for r in rows) else 0


def text(rows: list[dict], header: str) -> str:
    width = max(len(r["check"]) for r in rows) if rows else 0
    lines = [header]
    for r in rows:
        line = f"{MARK[r['status']]:<10} {r['check']:<{width}}  {r['node']}: {r['fact']}"
        if r["fix"] and r["status"] != "pass":
            line += f"\n{'':<10} {'':<{width}}  fix: {r['fix']}"
        lines.append(line)
    counts = {s: sum(r["status"] == s for r in rows) for s in MARK}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no checks")
    return "\n".join(lines)


def as_json(rows: list[dict], meeting, master: str) -> str:
    return json.dumps({"master": master, "me": meeting.me, "ok": exit_code(rows) == 0,
                       "error": meeting.error, "checks": rows, "nodes": meeting.nodes,
                       "probes": meeting.probes}, indent=1)
