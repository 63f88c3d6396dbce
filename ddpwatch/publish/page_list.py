"""/incidents/: the daemon's incidents as one small HTML page, newest first,
each linking to its page (/incidents/<id>). Pure; escaped like page.py."""
from __future__ import annotations

import time
import urllib.parse

from .page import CSS
from .page_svg import esc


def incident_path(incident_id: str) -> str:
    """The page's path; the id holds the job key, which holds the ranks' run id:
    quoted whole, so it is one path segment whatever it holds."""
    return "/incidents/" + urllib.parse.quote(incident_id, safe="")


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts)) if ts else "-"


def render_list(incidents, node: str) -> str:
    rows = []
    for i in sorted(incidents, key=lambda i: -i.opened_at):
        culprits = ", ".join(str(c) for c in i.culprits) or "-"
        page = (f'<a href="{esc(incident_path(i.id))}">{esc(i.id)}</a>' if i.bundle
                else f"{esc(i.id)} (no bundle: nothing to show)")
        resolved = (f"{_when(i.resolved_at)}: {esc(i.resolution)}"
                    if i.state == "resolved" else "-")
        rows.append(f'<tr class="{esc(i.state)}" data-incident="{esc(i.id)}"><td>{page}</td>'
                    f"<td>{esc(i.state)}</td><td>{esc(i.verdict.replace('_', ' '))}</td>"
                    f"<td>{esc(culprits)}</td><td>{esc(i.job)}</td>"
                    f"<td>{_when(i.opened_at)}</td><td>{resolved}</td></tr>")
    body = ("<table><thead><tr><th>incident</th><th>state</th><th>verdict</th>"
            "<th>culprit ranks</th><th>job</th><th>opened</th><th>resolved</th></tr></thead>"
            "<tbody>" + "".join(rows) + "</tbody></table>") if rows else \
        "<p>No incident: no job on this node has been judged a problem (recently).</p>"
    return ("<!DOCTYPE html>\n" '<html lang="en"><head><meta charset="utf-8">'
            f"<title>ddpwatch incidents on {esc(node)}</title><style>{CSS}</style></head>"
            f"<body><main><h1>Incidents on {esc(node)}</h1>{body}</main></body></html>\n")
