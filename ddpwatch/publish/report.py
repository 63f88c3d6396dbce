"""What people read: the judgement as text (verdict first, then evidence, then
remedy) and as JSON (`job` and `ranks[]`, a contract other tools rely on)."""
from __future__ import annotations

import textwrap

from ..judge.classify import Judgement
from ..codec import to_json
from ..observe.snapshot import Snapshot
from ..judge.vocabulary import label


def as_json(judgement: Judgement, last: Snapshot) -> dict:
    job = judgement.job
    return {
        "job": {"verdict": job.verdict, "culprits": list(job.culprits), "summary": job.summary,
                "culprit_elsewhere": job.elsewhere,
                "launcher_pid": last.job.launcher_pid, "launcher_kind": last.job.launcher_kind,
                "run_id": last.job.run_id},
        "ranks": [{
            "pid": r.pid, "rank": r.rank, "local_rank": r.local_rank, "host": r.host,
            "verdict": r.verdict, "role": r.role, "confidence": r.confidence, "rule": r.rule,
            "evidence": r.evidence, "remedy": r.remedy,
            "findings": [to_json(f) for f in r.findings],
            "stack": r.stack, "signals": r.signals,
        } for r in judgement.ranks],
        "probes": [to_json(p) for p in last.probes],
    }


def over_time_json(over, full: bool = False) -> dict:
    """A job's judgement over time (watch/job.py OverTime) for /status and, `full`,
    the incident bundle: the pause in progress (what, where, how long, its bound),
    where each rank's time went, the job's verdicts over time and, `full`, its
    earlier pauses and the last hour's time by state (the incident page's bars)."""
    if over is None:
        return {}
    pause = None
    if over.pause is not None:
        p = over.pause
        pause = {"rank": p.rank, "pid": p.pid, "kind": p.kind, "site": p.site,
                 "elapsed_s": p.elapsed_s, "bound_s": round(p.bound_s, 1),
                 "earlier_s": list(p.earlier), "timeout_s": p.timeout_s,
                 "left_s": round(p.left_s, 1), "over": p.over}
    doc = {"pause": pause, "pauses_note": over.note,
           "time_s": {str(rank): states for rank, states in over.time.items()},
           "time_last_10min_s": _rounded(over.recent),
           "timeline": [{"at": t, "verdict": v, "pause": k}
                        for t, v, k in over.timeline[-(512 if full else 50):]]}
    if full:
        doc["time_last_hour_s"] = _rounded(over.hour)
        doc["pauses"] = [{"rank": e.rank, "kind": e.kind, "site": e.site,
                          "started_at": round(e.started_wall, 1), "length_s": e.length_s}
                         for e in over.pauses]
    return doc


def _rounded(by_rank: dict) -> dict:
    return {str(rank): {k: round(v, 1) for k, v in states.items()}
            for rank, states in by_rank.items()}


def _wrap(text: str, indent: str) -> str:
    return textwrap.fill(text, width=100, initial_indent=indent, subsequent_indent=indent + "  ")


def as_text(judgement: Judgement, last: Snapshot) -> str:
    job = judgement.job
    lines = []
    culprits = ", ".join(f"rank {c}" for c in job.culprits) or job.elsewhere or \
        "none found locally"
    lines.append(f"JOB: {label(job.verdict)}   culprit: {culprits}")
    lines.append(_wrap(job.summary, "  "))
    launcher = (f"{last.job.launcher_kind} pid {last.job.launcher_pid}"
                if last.job.launcher_pid > 0 else f"launched by {last.job.launcher_kind}"
                if last.job.launcher_kind not in ("none", "", "wire")
                else "no launcher, grouped by their TCP connections"
                if last.job.launcher_kind == "wire" else "no launcher")
    # ranks seen ending while watched (probes/exits.py): a held job has no process left
    ended = (f", {len(last.job.departed_pids)} ended while watched"
             if last.job.departed_pids else "")
    alive = (f"{len(last.job.rank_pids)} local rank process(es)" if last.job.rank_pids
             or not ended else "no local rank process left")
    lines.append(f"  ({alive}{ended}, {launcher})")
    for r in judgement.ranks:
        # no record, environment or launch convention says its number: say so
        who = (f"rank {r.rank}" if r.rank >= 0 else "launcher" if r.pid == last.job.launcher_pid
               else "rank unknown")
        lines.append("")
        where = f" on {r.host or 'a peer node'} (peer view)" if r.remote else ""
        lines.append(f"{who:<8} pid {r.pid:<8} {label(r.verdict)}"
                     f"  ({r.role}, confidence {r.confidence:.0%}){where}")
        lines.append(_wrap(f"evidence: {r.evidence}", "  "))
        lines.append(_wrap(f"remedy:   {r.remedy}", "  "))
        if r.stack:
            lines.append(_wrap(f"stack:    {r.stack}", "  "))
        for f in r.findings:
            lines.append(_wrap(f"finding {f.id} ({f.severity}): {f.evidence} -> {f.remedy}", "  "))
        if r.signals.get("ns_unseen"):  # its own namespace, judged from outside
            lines.append(_wrap(f"not seen in its namespaces: {r.signals['ns_unseen']}", "  "))
    failed = [p for p in last.probes if not p.ok]
    if failed:
        lines.append("")
        lines.append("probes that failed (their signals are unknown): " +
                     "; ".join(f"{p.name}: {p.error}" for p in failed))
    return "\n".join(lines)
