"""The run's report for a person: Markdown, and one self-contained HTML page
(no script, no external reference) with two inline SVG bar charts: time to page
per class and accuracy per framework."""
from __future__ import annotations

import html

from .score import by


def _fmt(value, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}{unit}" if unit else f"{value:.3f}"
    return f"{value}{unit}"


def _said(view: dict | None, page: bool) -> str:
    view = view or {}
    if page:
        if not view.get("pages"):
            return f"no page (/status: {view.get('status_verdict', '-')} "\
                   f"{view.get('status_culprits', '-')})"
        return f"{view.get('verdict')} {view.get('culprits')} after {view.get('time_to_page_s')} s"
    return f"{view.get('pages', 0)} page(s)" + (
        f", findings {view['findings']}" if view.get("findings") else "")


def _diag(view: dict | None) -> str:
    view = view or {}
    if "verdict" not in view:
        return f"exit {view.get('exit')} {view.get('error', '')[:60]}".strip()
    return f"{view['verdict']} {view.get('culprits')}" + (
        f", findings {view['findings']}" if view.get("findings") else "")


def _mark(ok) -> str:
    return {True: "ok", False: "FAIL", None: "-"}[ok]


def rows(results: list[dict]) -> list[list[str]]:
    out = []
    for r in results:
        exp = r["expected"]
        page = isinstance(exp, dict) and exp.get("page", True)
        expected = f"{'/'.join(exp['verdict'])} {exp['culprits']}" if page else "no page"
        if isinstance(exp, dict) and exp.get("finding"):
            expected += f", {exp['finding']} {'on a rank' if exp['present'] else 'on none'}"
        if "skipped" in r:
            out.append([r["name"], r["class"], expected, "skipped: " + r["skipped"], "", "-"])
        elif "error" in r:
            out.append([r["name"], r["class"], expected, "BROKEN: " + r["error"][:160], "",
                        "FAIL"])
        else:
            out.append([r["name"], r["class"], expected, _said(r.get("daemon"), page),
                        _diag(r.get("diagnose")), _mark(r.get("ok"))
                        + (" (known)" if r.get("known") and not r.get("ok") else "")])
    return out


HEAD = ["run", "class", "expected", "daemon", "diagnose", "ok"]
SUMMARY = [("accuracy", "accuracy", ""), ("daemon accuracy", "daemon_accuracy", ""),
           ("diagnose accuracy", "diagnose_accuracy", ""), ("precision", "precision", ""),
           ("recall", "recall", ""), ("diagnose precision", "diagnose_precision", ""),
           ("diagnose recall", "diagnose_recall", ""),
           ("time to page p50", "time_to_page_p50_s", " s"),
           ("time to page p90", "time_to_page_p90_s", " s"),
           ("time to page max", "time_to_page_max_s", " s"),
           ("time to culprit in /status p50", "time_to_culprit_p50_s", " s"),
           ("time to culprit in /status p90", "time_to_culprit_p90_s", " s"),
           ("pages per incident", "pages_per_incident", ""),
           ("false pages per hour (negatives)", "false_pages_per_hour", "")]


def summary_lines(doc: dict) -> list[str]:
    s = doc["summary"]
    lines = [f"{s['ok']} of {s['scored']} runs right ({s['skipped']} skipped, "
             f"{len(s['broken'])} broken) in {doc['wall_s']:.0f} s"]
    lines += [f"{label}: {_fmt(s.get(key), unit)}" for label, key, unit in SUMMARY]
    if s["wrong_culprits"]:
        lines.append("WRONG CULPRIT: " + ", ".join(s["wrong_culprits"]))
    if s["negatives_paged"]:
        lines.append("NEGATIVE PAGED: " + ", ".join(s["negatives_paged"]))
    if s["broken"]:
        lines.append("BROKEN (injection or ground truth): " + ", ".join(s["broken"]))
    return lines


def markdown(doc: dict) -> str:
    out = [f"# Fault benchmark, {doc['started']}", "", f"`{doc['command']}` on {doc['host']}",
           "", *[f"* {line}" for line in summary_lines(doc)], "",
           "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    out += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |"
            for row in rows(doc["scenarios"])]
    known = {r["scenario"]: r["known"] for r in doc["scenarios"]
             if r.get("known") and r.get("ok") is False}
    if known:
        out += ["", "## Known findings (rows that fail today)", ""]
        out += [f"* {name}: {text}" for name, text in known.items()]
    out += ["", "## Per class", "", "| class | runs | ok | time to page p50 |", "|---|---|---|---|"]
    out += [f"| {k} | {v['runs']} | {v['ok']} | {_fmt(v['time_to_page_p50_s'], ' s')} |"
            for k, v in by(doc["scenarios"], "class").items()]
    out += ["", "## Per framework", "", "| framework | runs | ok | accuracy |", "|---|---|---|---|"]
    out += [f"| {k} | {v['runs']} | {v['ok']} | {_fmt(v['accuracy'])} |"
            for k, v in by(doc["scenarios"], "framework").items()]
    return "\n".join(out) + "\n"


def bars(title: str, items: list[tuple[str, float | None]], unit: str, top: float,
         missing: str = "-") -> str:
    """A horizontal bar chart as inline SVG; a missing value is written as `missing`."""
    row, width, label_w = 22, 560, 170
    height = 30 + row * max(1, len(items))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="{html.escape(title)}">',
             f'<text x="0" y="16" font-size="14" font-weight="bold">{html.escape(title)}</text>']
    scale = (width - label_w - 70) / top if top else 0
    for i, (label, value) in enumerate(items):
        y = 28 + i * row
        parts.append(f'<text x="0" y="{y + 14}" font-size="12">{html.escape(label)}</text>')
        if value is None:
            parts.append(f'<text x="{label_w}" y="{y + 14}" font-size="12">'
                         f'{html.escape(missing)}</text>')
            continue
        w = max(1.0, value * scale)
        parts.append(f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="14" '
                     f'fill="#4a78b0"/>')
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 14}" font-size="12">'
                     f'{value:g}{unit}</text>')
    return "\n".join(parts + ["</svg>"])


def html_page(doc: dict) -> str:
    classes = by(doc["scenarios"], "class")
    frameworks = by(doc["scenarios"], "framework")
    ttp = [(k, v["time_to_page_p50_s"]) for k, v in classes.items()]
    acc = [(k, v["accuracy"]) for k, v in frameworks.items()]
    top = max([v for _, v in ttp if v is not None] or [1.0])
    table = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                    for row in rows(doc["scenarios"]))
    summary = "".join(f"<li>{html.escape(line)}</li>" for line in summary_lines(doc))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Fault benchmark {html.escape(doc['started'])}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:1em auto}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:2px 6px}}</style>
</head><body>
<h1>Fault benchmark, {html.escape(doc['started'])}</h1>
<p><code>{html.escape(doc['command'])}</code> on {html.escape(doc['host'])}</p>
<ul>{summary}</ul>
{bars("time to page, p50 per class", ttp, " s", top, "no page")}
{bars("accuracy per framework", acc, "", 1.0)}
<table><tr>{''.join(f'<th>{h}</th>' for h in HEAD)}</tr>{table}</table>
</body></html>
"""
