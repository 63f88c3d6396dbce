"""The incident page's drawings, as inline SVG strings: the ranks' timeline
(the last collectives from the heartbeat rings, then the stall) and, for any
job, the thread states over the window. Pure; every text from a rank goes
through `esc` (run ids, hostnames, op names and frames are the ranks' claims).

The timeline has two panels with a break between them, because their scales
differ by a thousand: the last collectives take milliseconds, the stall
seconds. Left, the ring on a shared axis (who arrived when); right, seconds
before the snapshot (who waits in what, and the gap the culprit left).
"""
from __future__ import annotations

from html import escape

from ..judge.vocabulary import VERDICTS, Verdict
from .page_model import STATE_NAMES, Timeline

W, LABEL_W = 1000, 210
RING_X0, RING_X1 = 240, 590
STALL_X0, STALL_X1 = 625, 985
ROW_H, TOP = 70, 46
COLOURS = {"collective": "#4a78b5", "waiting": "#e08a00", "gap": "#c62828",
           "running": "#2e7d32", "R": "#2e7d32", "S": "#7b8ea6", "D": "#8e44ad",
           "T": "#c62828", "t": "#c62828", "Z": "#555555", "I": "#b0bec5"}
STATE_ORDER = "RSDTtZI"


def esc(value) -> str:
    return escape(str(value), quote=True)


def _seconds(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.1f} s"


def _text(x, y, body, cls="", anchor="start") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"'
            + (f' class="{cls}"' if cls else "") + f">{body}</text>")


def _defs() -> str:
    return ('<defs><pattern id="gap-hatch" width="8" height="8" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(45)"><rect width="8" height="8" fill="#fbe3e3"/>'
            f'<line x1="0" y1="0" x2="0" y2="8" stroke="{COLOURS["gap"]}" stroke-width="4"/>'
            '</pattern></defs>')


def timeline_svg(tl: Timeline) -> str:
    height = TOP + ROW_H * len(tl.rows) + 30
    out = [f'<svg class="timeline" role="img" '
           f'viewBox="0 0 {W} {height}" width="100%" aria-label="timeline of the ranks">',
           "<title>Per-rank timeline: the last collectives, then the stall</title>", _defs(),
           _text(RING_X0, 16, "last collectives (heartbeat ring)", "head"),
           _text(STALL_X0, 16, "at the stall: seconds before the snapshot", "head")]
    span_ring = max(tl.t1 - tl.t0, 1e-6)
    stall_span = max([tl.now - tl.t1 if any(r.bars for r in tl.rows) else 0.0] +
                     [r.inside_s or 0.0 for r in tl.rows] +
                     [r.quiet_s or 0.0 for r in tl.rows if r.role == "culprit"] + [1.0])

    def rx(t):
        return RING_X0 + (t - tl.t0) / span_ring * (RING_X1 - RING_X0)

    def sx(ago):
        return STALL_X1 - min(max(ago, 0.0), stall_span) / stall_span * (STALL_X1 - STALL_X0)
    # axes
    out.append(_text(RING_X0, TOP - 10, "0", "axis"))
    out.append(_text(RING_X1, TOP - 10, "+" + _seconds(tl.t1 - tl.t0), "axis", "end"))
    out.append(_text(STALL_X0, TOP - 10, f"−{stall_span:.1f} s", "axis"))
    out.append(_text(STALL_X1, TOP - 10, "now", "axis", "end"))
    bottom = TOP + ROW_H * len(tl.rows)
    mid = (RING_X1 + STALL_X0) / 2
    out.append(f'<path d="M{mid - 6} {TOP - 4} l6 -8 M{mid} {TOP - 4} l6 -8" '
               f'stroke="#888" fill="none"/>')
    out.append(f'<line x1="{mid:.1f}" y1="{TOP}" x2="{mid:.1f}" y2="{bottom}" class="break"/>')
    for i, row in enumerate(tl.rows):
        y = TOP + i * ROW_H
        cls = "rank-row culprit" if row.role == "culprit" else "rank-row"
        out.append(f'<g class="{cls}" data-rank="{row.rank}" data-pid="{row.pid}">')
        if i % 2:
            out.append(f'<rect x="0" y="{y}" width="{W}" height="{ROW_H}" class="stripe"/>')
        who = f"rank {row.rank}" if row.rank >= 0 else f"pid {row.pid}"
        out.append(_text(8, y + 20, esc(who + (" · CULPRIT" if row.role == "culprit" else "")),
                         "label culprit-label" if row.role == "culprit" else "label"))
        out.append(_text(8, y + 38, esc(row.verdict.replace("_", " ")), "verdict"))
        state = STATE_NAMES.get(row.state, row.state or "state ?")
        cpu = "CPU ?" if row.cpu is None else f"CPU {row.cpu * 100:.0f}%"
        sub = f"{row.host} · " if row.host else ""
        out.append(_text(8, y + 56, esc(f"{sub}pid {row.pid} · {state} · {cpu}"), "sub"))
        out.extend(_ring_bars(row, y, rx, tl))
        out.extend(_stall(row, y, sx, tl))
        out.append("</g>")
    if not any(r.bars for r in tl.rows):
        out.append(_text((RING_X0 + RING_X1) / 2, TOP + 20, "no completed collective in "
                         "the rings", "note", "middle"))
    out.append("</svg>")
    return "\n".join(out)


def _ring_bars(row, y, rx, tl) -> list[str]:
    if row.remote:
        return [_text(RING_X0, y + 30, esc(f"ring on node {row.host or '?'} (peer view: "
                                           "its daemon's bundle holds it)"), "note")]
    out, labelled = [], -1e9
    for b in row.bars:
        x0, x1 = rx(b.start), rx(b.end)
        # a seq number only where it has room: bars of async buckets crowd together
        label = _text(x0 + 1, y + 40, f"#{b.seq}", "seq") if x0 - labelled >= 30 else ""
        labelled = x0 if label else labelled
        late = tl.lateness.get(b.seq, {}).get(row.rank)
        tip = (f"#{b.seq} {b.op}, {b.bytes} bytes, {_seconds(b.end - b.start)} inside"
               + (f", arrived {_seconds(late)} after the first" if late is not None else ""))
        out.append(f'<g class="collective" data-seq="{b.seq}" data-rank="{row.rank}">'
                   f'<title>{esc(tip)}</title>'
                   f'<rect x="{x0:.1f}" y="{y + 8}" width="{max(x1 - x0, 2):.1f}" height="18" '
                   f'fill="{COLOURS["collective"]}"/>' + label + "</g>")
    return out


def _stall(row, y, sx, tl) -> list[str]:
    """Where the rank was at the stall: the culprit's gap (hatched: stopped,
    hung or quiet, inside a collective or not, and the collectives it never
    entered), a victim waiting inside a collective, or a rank running on."""
    out = []
    quiet = row.quiet_s
    if row.role == "culprit" or (row.inside_s is None and quiet is not None and quiet >= 1.0
                                 and row.phase != "exited"):
        ago = max(row.inside_s or 0.0, quiet or 0.0)
        x0 = sx(ago)
        out.append(f'<rect x="{x0:.1f}" y="{y + 8}" width="{max(STALL_X1 - x0, 2):.1f}" '
                   f'height="18" fill="url(#gap-hatch)" class="gap"/>')
        what = row.verdict.replace("_", " ")
        if row.inside_s is not None:
            where, since = f"{what} inside #{row.seq} {row.op}", f"for {_seconds(row.inside_s)}"
        else:
            where = f"{what}, " + (f"last #{row.seq} {row.op}" if row.seq else "no collective yet")
            since = f"no heartbeat for {_seconds(quiet or 0.0)}"
        if row.behind and tl.furthest is not None and row.seq is not None:
            first = row.seq + 1  # the gap it left: what the others entered, it did not
            since += (f"; never entered #{first}" if first == tl.furthest
                      else f"; never entered #{first}–#{tl.furthest}")
        out.append(_text(STALL_X0, y + 44, esc(where), "stall gap-label"))
        out.append(_text(STALL_X0, y + 60, esc(since), "stall gap-label"))
    elif row.inside_s is not None:
        x0 = sx(row.inside_s)
        out.append(f'<rect x="{x0:.1f}" y="{y + 8}" width="{max(STALL_X1 - x0, 2):.1f}" '
                   f'height="18" fill="{COLOURS["waiting"]}" class="waiting"/>')
        out.append(_text(STALL_X0, y + 44, esc(f"waits in #{row.seq} {row.op}"), "stall"))
        out.append(_text(STALL_X0, y + 60, esc(f"for {_seconds(row.inside_s)}"), "stall"))
    else:
        label = {"exited": "exited"}.get(row.phase, "running on")
        out.append(_text(STALL_X1, y + 22, esc(f"{label} (#{row.seq} {row.op})"
                                               if row.seq else label), "ok", "end"))
    return out


def states_svg(rows: list[tuple[str, dict[str, float], float | None]]) -> str:
    """rows: (label, state -> share of samples, CPU in cores). One stacked bar each."""
    x0, x1, h = LABEL_W, 860, 34
    out = [f'<svg class="states" role="img" '
           f'viewBox="0 0 {W} {len(rows) * h + 10}" width="100%" '
           'aria-label="thread states over the window">',
           "<title>Thread states of each rank over the window</title>"]
    for i, (label, shares, cpu) in enumerate(rows):
        y = 4 + i * h
        out.append(f'<g class="state-row" data-row="{i}">')
        out.append(_text(8, y + 18, esc(label), "label"))
        x = x0
        order = sorted(shares, key=lambda s: STATE_ORDER.find(s) % 99)
        for state in order:
            w = shares[state] * (x1 - x0)
            colour = COLOURS.get(state, "#999999")
            out.append(f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="20" '
                       f'fill="{colour}"><title>{esc(STATE_NAMES.get(state, state))} '
                       f'{shares[state]:.0%}</title></rect>')
            if w > 60:
                out.append(_text(x + 4, y + 19, esc(f"{STATE_NAMES.get(state, state)} "
                                                    f"{shares[state]:.0%}"), "in-bar"))
            x += w
        if not shares:
            out.append(_text(x0, y + 18, "no process sample", "note"))
        out.append(_text(x1 + 10, y + 18, "CPU ?" if cpu is None else
                         f"CPU {cpu * 100:.0f}%", "sub"))
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


# --- the job over time (publish/report.py over_time_json): verdicts, time by state
TIME_COLOURS = {"computing": "#2e7d32", "collective": "#4a78b5", "waiting": "#e08a00",
                "paused": "#7fb3e0", "stalled": "#c62828", "starting": "#9e9e9e",
                "unknown": "#cccccc"}
VERDICT_COLOURS = {v.name: v.page for v in VERDICTS}  # judge/vocabulary.py: a row each


def verdicts_svg(timeline: list[dict], now: float, span_s: float = 3600.0) -> str:
    """The job's verdict over the last `span_s` (one band, a colour per verdict,
    each stretch titled with its verdict, pause kind and length)."""
    x0, x1 = LABEL_W, 960
    start = max(now - span_s, timeline[0]["at"]) if timeline else now - span_s
    width = max(now - start, 1.0)
    out = [f'<svg class="verdicts" role="img" viewBox="0 0 {W} 64" width="100%" '
           'aria-label="the job\'s verdict over time">',
           "<title>The job's verdict over time</title>",
           _text(8, 26, "job verdict", "label")]
    for i, entry in enumerate(timeline):
        t0 = max(entry["at"], start)
        t1 = timeline[i + 1]["at"] if i + 1 < len(timeline) else now
        if t1 <= start:
            continue
        x, w = x0 + (t0 - start) / width * (x1 - x0), max(1.0, (t1 - t0) / width * (x1 - x0))
        colour = VERDICT_COLOURS.get(entry["verdict"], Verdict.page)
        what = entry["verdict"].replace("_", " ") + (f" ({entry['pause']})"
                                                     if entry.get("pause") else "")
        out.append(f'<rect class="verdict" data-verdict="{esc(entry["verdict"])}" '
                   f'x="{x:.1f}" y="10" width="{w:.1f}" height="24" fill="{colour}">'
                   f"<title>{esc(what)} for {_seconds(t1 - t0)}</title></rect>")
    out.append(_text(x0, 52, f"{_seconds(now - start)} ago", "sub"))
    out.append(_text(x1, 52, "now", "sub", "end"))
    out.append("</svg>")
    return "\n".join(out)


def time_svg(rows: list[tuple[str, dict[str, float]]]) -> str:
    """rows: (label, state -> seconds). One stacked bar per rank: where its time went."""
    x0, x1, h = LABEL_W, 860, 34
    out = [f'<svg class="time" role="img" viewBox="0 0 {W} {len(rows) * h + 10}" '
           'width="100%" aria-label="where each rank\'s time went">',
           "<title>Where each rank's time went</title>"]
    for i, (label, seconds) in enumerate(rows):
        y, total = 4 + i * h, sum(seconds.values())
        out.append(f'<g class="time-row" data-row="{i}">')
        out.append(_text(8, y + 18, esc(label), "label"))
        x = x0
        for state in sorted(seconds, key=lambda k: list(TIME_COLOURS).index(k)
                            if k in TIME_COLOURS else 99):
            share = seconds[state] / total if total else 0.0
            w = share * (x1 - x0)
            out.append(f'<rect class="time-state" data-state="{esc(state)}" x="{x:.1f}" '
                       f'y="{y + 4}" width="{w:.1f}" height="20" '
                       f'fill="{TIME_COLOURS.get(state, "#999999")}"><title>{esc(state)} '
                       f'{share:.0%} ({_seconds(seconds[state])})</title></rect>')
            if w > 70:
                out.append(_text(x + 4, y + 19, esc(f"{state} {share:.0%}"), "in-bar"))
            x += w
        out.append(_text(x1 + 10, y + 18, _seconds(total), "sub"))
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)
