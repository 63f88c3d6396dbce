"""`ddpwatch status [--url]`: the daemon's current view as a table."""
from __future__ import annotations

import json
import urllib.error

from .. import errors
from ..signed import client
from .token import token
from ..publish.terminal import printable

COLUMNS = ("JOB", "NODE", "RANK", "PID", "VERDICT", "ROLE", "CONF", "FINDINGS")


def fetch(url: str, token: str | None) -> dict:
    """The daemon's /status; with a token, a signed request and a proven answer
    (signed/auth.py): the token is never sent, and a program squatting the
    daemon's port is refused (exit 76), never shown."""
    try:
        body = client.get(url, "/status", token or "", timeout_s=10)
    except client.Unproven as err:
        raise errors.Unproven(str(err)) from err
    except urllib.error.HTTPError as err:
        if err.code == 401:
            why = err.read(200).decode("utf-8", "replace")
            try:
                why = str(json.loads(why).get("error", why))
            except (ValueError, AttributeError):
                pass
            raise errors.NoPermission(f"{url}: the daemon refused the request "
                                      f"({printable(why.strip())}): give its token "
                                      f"(--token-file FILE or $DDPWATCH_TOKEN)") from err
        raise errors.Unavailable(f"{url}: HTTP {err.code}") from err
    except client.TooLarge as err:
        raise errors.Unavailable(f"{url}: {err}") from err
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise errors.Unavailable(f"{url}: no daemon answers ({reason})") from err
    try:
        return json.loads(body)
    except ValueError as err:
        raise errors.Unavailable(f"{url}: not a ddpwatch /status answer ({err})") from err


def table(doc: dict) -> str:
    return "\n".join(printable(line) for line in _lines(doc))


def _lines(doc: dict) -> list[str]:
    rows = [COLUMNS]
    for job in doc.get("jobs", []):
        for r in job["ranks"]:
            rows.append((job["key"], r.get("host") or "-", str(r["rank"]), str(r["pid"]),
                         r["verdict"], r["role"],
                         f"{r['confidence']:.0%}", ",".join(f["id"] for f in r["findings"]) or "-"))
    rows = [tuple(printable(str(c)) for c in row) for row in rows]  # widths as shown
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [f"node {doc['node']}  tick {doc['tick']}  "
             f"job verdict: {doc['job']['verdict']}  culprits: {doc['job']['culprits']}"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    open_incidents = [i for i in doc.get("incidents", []) if i["state"] != "resolved"]
    for i in open_incidents:
        sender = i.get("alerts_from") or ""
        alerts = f"; webhooks from {'this node' if sender == doc['node'] else sender}" \
            if sender else ""
        lines.append(f"incident {i['id']} ({i['state']}): {i['verdict']}, culprits "
                     f"{list(i['culprits'])}; evidence in {i['bundle'] or '-'}{alerts}")
    if not doc.get("jobs"):
        lines.append("no DDP job on this node")
    for peer in doc.get("peers", []):
        state = f"error: {peer['error']}" if peer["error"] else "ok"
        age = f", last answer {peer['age_s']:.1f}s ago" if peer["age_s"] is not None else ""
        lines.append(f"peer {peer['url']} ({peer['node'] or '?'}): {state}{age}")
    return lines


def main(args) -> int:
    if args.watch:
        if args.json:
            raise errors.UsageError("--watch draws a view: not with --json")
        from . import live
        secret = token(args)
        return live.status_watch(args, lambda: fetch(args.url, secret))
    doc = fetch(args.url, token(args))
    print(json.dumps(doc, indent=1) if args.json else table(doc))
    return errors.OK
