"""The incident page: one self-contained HTML file (inline CSS and SVG, no
script, no external resource) for the person paged at 3 a.m. Verdict and
culprit first, then the ranks' timeline, where each rank was, the findings with
their remedies, the stacks, and the evidence.

    render(report, history, incident=None, evidence_base="") -> str

`report` is report.as_json's shape (what report.json in a bundle holds),
`history` the snapshots the judgement was made from, `incident` to_json(Incident).
`evidence_base` prefixes links to the bundle's files ("" in the bundle itself;
None: no bundle, no links). Everything a rank or a config wrote is escaped.
"""
from __future__ import annotations

import time

from . import page_model as model
from .page_svg import esc, states_svg, time_svg, timeline_svg, verdicts_svg

FRAMES_SHOWN = 16  # per stack: the outermost 4 and the innermost 12
LATE_S = 0.0005  # arrivals closer than this are the same moment, not a late rank
EVIDENCE_FILES = (("report.txt", "the judgement as text"),
                  ("report.json", "verdicts, evidence and signals of every rank"),
                  ("snapshots.json", "everything observed: processes, sockets, stacks, rings; "
                                     "`ddpwatch diagnose --replay` judges it again"))
CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;
 color:#1b1f24;background:#f6f7f9}
main{max-width:1100px;margin:0 auto;padding:16px 20px 40px}
h1{font-size:28px;margin:4px 0 2px;letter-spacing:.02em}
h2{font-size:19px;margin:28px 0 8px;border-bottom:2px solid #d7dce2;padding-bottom:3px}
.banner{background:#fff;border-left:10px solid #c62828;padding:12px 18px;border-radius:4px;
 box-shadow:0 1px 3px #0002}
.banner.resolved{border-left-color:#2e7d32}
.culprit-line{font-size:22px;font-weight:700;color:#b71c1c;margin:4px 0}
.resolved .culprit-line{color:#555}
.meta{color:#555;font-size:13px}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:13px;font-weight:700;
 color:#fff;background:#c62828;vertical-align:middle;margin-right:6px}
.badge.resolved{background:#2e7d32}.badge.ongoing{background:#e08a00}
.box{background:#fff;padding:10px 14px;border-radius:4px;box-shadow:0 1px 2px #0001;
 margin:10px 0}
.remedy{border-left:6px solid #1565c0}.resolution{border-left:6px solid #2e7d32}
.notice{border-left:6px solid #e08a00}
table{border-collapse:collapse;width:100%;background:#fff;font-size:14px}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #e3e6ea;vertical-align:top}
th{background:#eef1f4}
tr.culprit td{background:#fdecea;font-weight:600}
td.late{color:#b71c1c;font-weight:700}
code,pre{font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
pre{background:#fff;padding:8px 10px;overflow-x:auto;margin:4px 0 10px;
 border:1px solid #e3e6ea}
svg{background:#fff;border-radius:4px;box-shadow:0 1px 2px #0001;display:block}
svg text{font:13px system-ui,sans-serif;fill:#1b1f24}
svg .head{font-weight:700;font-size:14px}svg .axis{fill:#666;font-size:12px}
svg .label{font-weight:700;font-size:15px}svg .verdict{font-size:13px}svg .culprit-label{fill:#b71c1c}
svg .sub,svg .seq{fill:#555;font-size:12px}svg .stall{font-size:13px}
svg .gap-label{fill:#b71c1c;font-weight:700}svg .ok{fill:#2e7d32}
svg .note{fill:#777;font-style:italic}svg .in-bar{fill:#fff;font-size:12px}
svg .stripe{fill:#f4f6f8}svg .break{stroke:#bbb;stroke-dasharray:4 3}
details{margin:6px 0}summary{cursor:pointer;font-weight:600}
"""


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts)) if ts else "-"


def _who(r: dict) -> str:
    rank = r.get("rank", -1)
    return f"rank {rank}" if isinstance(rank, int) and rank >= 0 else f"pid {r.get('pid')}"


def _rank_label(rank) -> str:
    """A rank number as people read it: "rank unknown" for -1 (a process whose
    rank no evidence gave), as everywhere else, never "rank -1"."""
    return f"rank {rank}" if int(rank) >= 0 else "rank unknown"


def render(report: dict, history: tuple, incident: dict | None = None,
           evidence_base: str | None = "") -> str:
    job = report.get("job", {})
    ranks = report.get("ranks", [])
    tl = model.timeline(report, tuple(history))
    title = f"ddpwatch: {job.get('verdict', 'unknown')} — {incident['id'] if incident else 'replay'}"
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>",
             _banner(job, ranks, incident, history)]
    parts.append(_summary(job, ranks, incident))
    parts.append('<h2 id="timeline">Timeline of the ranks</h2>')
    if tl is not None:
        parts.append(timeline_svg(tl))
        parts.append(_lateness(tl))
    else:
        parts.append('<div class="box notice" id="no-heartbeats"><b>This job writes no '
                     'heartbeats</b>, so there is no timeline of its collectives: below is '
                     'what was observed instead (thread states over the window, stacks). '
                     'Heartbeats would add the timeline: call <code>ddpwatch.instrument()</code> '
                     'before <code>init_process_group</code> in the training script.</div>')
    parts.append(_ranks_table(ranks))
    parts.append(_over_time(report.get("over_time"), incident))
    parts.append(_states(ranks, tuple(history)))
    parts.append(_findings(ranks))
    parts.append(_stacks(ranks, tuple(history)))
    parts.append(_evidence(report, incident, tuple(history), evidence_base))
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


def _banner(job, ranks, incident, history) -> str:
    state = incident["state"] if incident else "replay"
    resolved = state == "resolved"
    culprits = [r for r in ranks if r.get("role") == "culprit"]
    if culprits:
        line = "culprit: " + "; ".join(
            f"{_who(r)} (pid {r.get('pid')}" + (f" on {r.get('host')}" if r.get("host") else "")
            + f", {str(r.get('verdict', '')).replace('_', ' ')})" for r in culprits)
    elif job.get("culprit_elsewhere"):  # victims here, their culprit where no view reaches
        line = f"culprit: {job['culprit_elsewhere']} (not watched from this node)"
    else:
        line = "no culprit named on this node" if job.get("culprits") == [] else \
            "culprit: " + ", ".join(_rank_label(c) for c in job.get("culprits", []))
    key = incident["job"] if incident else (job.get("run_id") or f"pid {job.get('launcher_pid')}")
    meta = [f"job {key}"]
    if job.get("launcher_pid", -1) > 0:
        meta.append(f"{job.get('launcher_kind')} pid {job.get('launcher_pid')}")
    meta.append(f"{len(ranks)} rank(s)")
    if incident:
        meta.append(f"opened {_when(incident['opened_at'])}")
        meta.append(f"updated {_when(incident['updated_at'])}")
    elif history:
        meta.append(f"observed {_when(history[-1].wall_time)}")
    culprit_attr = ",".join(str(c) for c in job.get("culprits", []))
    return (f'<header class="banner{" resolved" if resolved else ""}" id="verdict" '
            f'data-verdict="{esc(job.get("verdict", ""))}" data-culprits="{esc(culprit_attr)}" '
            f'data-state="{esc(state)}">'
            f'<div><span class="badge {esc(state)}">{esc(state.upper())}</span>'
            f'<span class="meta">incident {esc(incident["id"]) if incident else "(replay)"}'
            f'</span></div>'
            f'<h1>{esc(str(job.get("verdict", "unknown")).replace("_", " ").upper())}</h1>'
            f'<div class="culprit-line" id="culprit">{esc(line)}</div>'
            f'<div class="meta">{esc(" · ".join(meta))}</div></header>')


def _summary(job, ranks, incident) -> str:
    out = []
    if incident and incident.get("state") == "resolved":
        lasted = max(0.0, incident["resolved_at"] - incident["opened_at"])
        how = incident.get("resolution") or "the job was no longer judged a problem"
        out.append(f'<div class="box resolution" id="resolution"><b>Resolved '
                   f'{esc(_when(incident["resolved_at"]))}</b> after {lasted:.0f} s: '
                   f'{esc(how)}.</div>')
    summary, _, remedy = str(job.get("summary", "")).partition(" Remedy: ")
    out.append(f'<div class="box" id="summary">{esc(summary)}</div>')
    remedies = [(r, r.get("remedy", "")) for r in ranks if r.get("role") == "culprit"]
    if remedy or remedies:
        items = "".join(f"<li><b>{esc(_who(r))}</b>: {esc(text)}</li>"
                        for r, text in remedies if text) or f"<li>{esc(remedy)}</li>"
        head = ("What it needed (resolved since)" if incident and incident.get("state") ==
                "resolved" else "What to do")
        out.append(f'<div class="box remedy" id="remedy"><b>{head}</b><ul>{items}</ul></div>')
    return "\n".join(out)


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _ranks_table(ranks) -> str:
    rows = []
    for r in ranks:
        s = r.get("signals", {})
        cpu = s.get("cpu_ratio")
        phase = s.get("hb_phase") or ""
        where = (f"in #{s.get('hb_seq')} {s.get('hb_op')} for {_seconds(s.get('hb_inside_s'))}"
                 if phase == "inside" else
                 f"{phase}, last #{s.get('hb_seq')} {s.get('hb_op')}" if phase else
                 f"stack: {s.get('stack')}" if s.get("stack") else "no heartbeat")
        cls = ' class="culprit"' if r.get("role") == "culprit" else ""
        rows.append(
            f'<tr{cls} data-rank="{esc(r.get("rank", -1))}">'
            f"<td>{esc(_who(r))}</td><td>{esc(r.get('host') or s.get('node') or '-')}"
            f"{' (peer view)' if s.get('remote') else ''}</td><td>{esc(r.get('pid'))}</td>"
            f"<td>{esc(str(r.get('verdict', '')).replace('_', ' '))}</td>"
            f"<td>{esc(r.get('role', ''))}</td>"
            f"<td>{esc(model.STATE_NAMES.get(s.get('state'), s.get('state') or '?'))}</td>"
            f"<td>{'?' if cpu is None else f'{cpu * 100:.0f}%'}</td><td>{esc(where)}</td>"
            f"<td>{esc(s.get('hb_step', '-'))}</td>"
            f"<td>{_seconds(s.get('hb_age_s'))}</td></tr>")
    return ('<h2 id="ranks">Where each rank was</h2><table class="ranks"><thead><tr>'
            "<th>rank</th><th>node</th><th>pid</th><th>verdict</th><th>role</th>"
            "<th>state</th><th>CPU</th><th>collective</th><th>step</th>"
            "<th>since heartbeat</th></tr></thead><tbody>" + "".join(rows) +
            "</tbody></table>")


def _lateness(tl: model.Timeline) -> str:
    ranks = [row.rank for row in tl.rows if not row.remote and row.bars]
    if not tl.seqs or not ranks:
        return ""
    head = "".join(f"<th>rank {r}</th>" for r in ranks)
    rows = []
    for seq in tl.seqs:
        bar = next((b for row in tl.rows for b in row.bars if b.seq == seq), None)
        late = tl.lateness.get(seq, {})
        # the last to arrive, when it is not a matter of microseconds
        last = max(late, key=late.get) if late and max(late.values()) >= LATE_S else None
        done = {row.rank for row in tl.rows for b in row.bars if b.seq == seq}
        cells = "".join(
            ('<td class="late">' if r == last or r not in done else "<td>")
            + (f"+{late[r] * 1e3:.1f} ms" if r in late else
               "completed" if r in done else "not completed") + "</td>" for r in ranks)
        rows.append(f'<tr data-seq="{seq}"><td>#{seq}</td><td>{esc(bar.op if bar else "?")}'
                    f"</td><td>{bar.bytes if bar else '?'}</td>{cells}</tr>")
    return ('<h3>Arrival at the last collectives</h3><p class="meta">How long after the '
            'first rank each rank entered the collective (the last to arrive in red).</p><table class="lateness"><thead><tr>'
            f"<th>seq</th><th>op</th><th>bytes</th>{head}</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _over_time(over: dict | None, incident: dict | None) -> str:
    """The job before the stall (the daemon's watch of it, watch/job.py): its
    verdicts over the last hour, its earlier pauses, where each rank's time went."""
    if not over or not over.get("timeline"):
        return ""
    now = (incident or {}).get("updated_at") or over["timeline"][-1]["at"]
    parts = ['<h2 id="over-time">The job over time</h2>',
             '<p class="meta">Its verdict as the daemon judged it each tick, over the last '
             'hour: pauses (a rank working outside the collectives while the others wait) '
             'are light blue; what paged is red.</p>',
             verdicts_svg(over["timeline"], now)]
    if over.get("pauses_note"):
        parts.append(f'<p class="pauses-note">{esc(over["pauses_note"])}.</p>')
    pauses = over.get("pauses") or []
    if pauses:
        rows = "".join(f"<tr><td>{esc(_when(p['started_at']))}</td><td>rank {p['rank']}</td>"
                       f"<td>{esc(p['kind'])}</td><td><code>{esc(p['site'] or '?')}</code></td>"
                       f"<td>{p['length_s']:.1f} s</td></tr>" for p in pauses[-20:])
        parts.append('<table class="pauses" id="pauses"><caption>Earlier pauses (the last '
                     f'{min(len(pauses), 20)})</caption><tr><th>began</th><th>rank</th>'
                     '<th>kind</th><th>where</th><th>lasted</th></tr>' + rows + "</table>")
    hour = over.get("time_last_hour_s") or {}
    if hour:
        parts.append('<p class="meta">Where each rank\'s time went over the last hour '
                     '(from the verdicts; without heartbeats a rank\'s training time is all '
                     'counted as computing).</p>')
        parts.append(time_svg([(_rank_label(rank), states) for rank, states in
                               sorted(hour.items(), key=lambda kv: int(kv[0]))]))
    return "\n".join(parts)


def _states(ranks, history) -> str:
    rows = [(f"{_who(r)} (pid {r.get('pid')})", model.state_fractions(history, r.get("pid")),
             r.get("signals", {}).get("cpu_ratio")) for r in ranks
            if not r.get("signals", {}).get("remote")]
    if not rows:
        return ""
    span = history[-1].taken_at - history[0].taken_at if len(history) > 1 else 0.0
    return (f'<h2 id="states">Observed over the window ({span:.1f} s, {len(history)} '
            f"samples)</h2><p class=\"meta\">Share of each rank's thread samples per "
            f"state, and its CPU in cores over the window.</p>" + states_svg(rows))


def _findings(ranks) -> str:
    out = ['<h2 id="findings">Findings and remedies</h2>']
    for r in ranks:
        cls = ' culprit' if r.get("role") == "culprit" else ""
        out.append(f'<div class="box{cls}" data-rank="{esc(r.get("rank", -1))}">'
                   f"<b>{esc(_who(r))}</b>: {esc(str(r.get('verdict')).replace('_', ' '))} "
                   f"({esc(r.get('role'))}, confidence {float(r.get('confidence') or 0):.0%})"
                   f"<br>evidence: {esc(r.get('evidence', ''))}"
                   f"<br>remedy: {esc(r.get('remedy', ''))}")
        for f in r.get("findings", []):
            out.append(f"<br>finding <b>{esc(f.get('id'))}</b> ({esc(f.get('severity'))}): "
                       f"{esc(f.get('evidence'))} → {esc(f.get('remedy'))}")
        unseen = (r.get("signals") or {}).get("ns_unseen")
        if unseen:  # the rank's own namespace, judged from outside it
            out.append(f"<br>not seen in its namespaces: {esc(unseen)}")
        out.append("</div>")
    return "\n".join(out)


def _stacks(ranks, history) -> str:
    out = ['<h2 id="stacks">Stacks, folded per rank</h2>']
    any_dump = any(s.stacks is not None for s in history)
    if not any_dump:
        out.append('<p class="meta">No stack was dumped in this window (py-spy runs only '
                   'when a job looks wrong, at most every few seconds).</p>')
    for r in ranks:
        if r.get("signals", {}).get("remote"):
            continue
        folded, status = model.folded_stacks(history, r.get("pid"))
        body = [f"<summary>{esc(_who(r))} (pid {esc(r.get('pid'))})</summary>"]
        if not folded:
            body.append(f'<p class="meta">{esc(status or "no dump")}</p>')
        bare = [st for st in folded if not st.frames]
        for st in (st for st in folded if st.frames):
            body.append(f'<div class="meta">thread {esc(st.thread)}, '
                        f'{"idle" if st.idle else "active"}, seen in {st.seen} dump(s)</div>'
                        f"<pre>{_frames(st.frames)}</pre>")
        if bare:  # threads with no Python frame (torch's, Gloo's): named, not drawn
            body.append(f'<div class="meta">{len(bare)} thread(s) with no Python frame: '
                        f'{esc(", ".join(sorted({st.thread for st in bare})))}</div>')
        out.append(f'<details open data-rank="{esc(r.get("rank", -1))}">'
                   + "".join(body) + "</details>")
    return "\n".join(out)


def _frames(frames: tuple[str, ...]) -> str:
    """Outermost first, one per line, indented by depth; the innermost (where the
    thread is) in bold."""
    if not frames:
        return "(no frames)"
    lines = [esc(("  " * min(i, 12)) + f) for i, f in enumerate(frames)]
    lines[-1] = f"<b>{lines[-1]}</b>"
    if len(lines) > FRAMES_SHOWN:  # importlib's dozens of frames say nothing at 3 a.m.
        hidden = len(lines) - FRAMES_SHOWN
        lines = (lines[:4] + [f"<i>… {hidden} frames (all in snapshots.json) …</i>"]
                 + lines[-(FRAMES_SHOWN - 4):])
    return "\n".join(lines)


def _evidence(report, incident, history, base) -> str:
    out = ['<h2 id="evidence">Evidence</h2><ul>']
    if base is not None:
        for name, what in EVIDENCE_FILES:
            out.append(f'<li><a href="{esc(base + name)}">{esc(name)}</a>: {esc(what)}</li>')
        out.append("<li><code>records/</code>: the ranks' raw heartbeat records</li>")
    if incident and incident.get("bundle"):
        out.append(f"<li>bundle on the node: <code>{esc(incident['bundle'])}</code></li>")
    if history:
        out.append(f"<li>{len(history)} snapshot(s), the last taken "
                   f"{esc(_when(history[-1].wall_time))}</li>")
    for p in report.get("probes", []):
        state = "ok" if p.get("ok") else f"FAILED: {p.get('error')}"
        out.append(f"<li>probe {esc(p.get('name'))}: {esc(state)} "
                   f"({float(p.get('duration_s') or 0):.2f} s)</li>")
    out.append("</ul>")
    return "\n".join(out)
