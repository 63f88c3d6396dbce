"""The scorer: pure functions of the runner's results (dicts, as in the JSON), so
the unit tests feed it results built in code (tests/unit/benchmarks).

Per run: `daemon_ok` (a fault paged within its deadline, the first page's verdict
one the ground truth allows and its culprits exactly the expected ranks; a
negative sent no page), `diagnose_ok` (the same of the diagnoser's judgement; a
negative names no culprit; None where it could not judge: the job was gone), and
`ok` (both, where the diagnoser judged). Overall: accuracy, precision and recall
of culprit naming (the daemon's first page; the diagnoser's apart), time to page
and to the culprit in /status (p50, p90, max), pages per incident and false pages
per hour of the negatives."""
from __future__ import annotations

import math

GONE_EXIT = 69  # ddpwatch diagnose: the pid is gone or not Python (README "Commands")


def percentile(values, q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of `values`; None when empty."""
    data = sorted(values)
    if not data:
        return None
    rank = max(1, math.ceil(q / 100 * len(data)))
    return data[rank - 1]


def _page_expected(expected) -> bool:
    return isinstance(expected, dict) and expected.get("page", True)


def _finding_ok(expected, found) -> bool:
    """A finding the ground truth names is there exactly when it should be."""
    if not isinstance(expected, dict) or not expected.get("finding"):
        return True
    return (expected["finding"] in (found or ())) == expected["present"]


def daemon_ok(result: dict) -> bool:
    expected, seen = result["expected"], result.get("daemon") or {}
    if not _page_expected(expected):
        return seen.get("pages", 0) == 0 and _finding_ok(expected, seen.get("findings"))
    return (seen.get("pages", 0) > 0 and seen.get("verdict") in expected["verdict"]
            and seen.get("culprits") == sorted(expected["culprits"]))


def diagnose_ok(result: dict) -> bool | None:
    """`expected_diagnose`, where the catalogue gives one, is the one-shot judge's
    ground truth: diagnose has no past (a busy loop at a new place is a pause to
    it until the daemon learns that nothing paused there before)."""
    expected = result.get("expected_diagnose", result["expected"])
    seen = result.get("diagnose") or {}
    if seen.get("exit") == GONE_EXIT or "verdict" not in seen:
        return None if seen.get("exit") == GONE_EXIT else False
    if not _page_expected(expected):
        return not seen.get("culprits") and _finding_ok(expected, seen.get("findings"))
    return seen.get("verdict") in expected["verdict"] and \
        seen.get("culprits") == sorted(expected["culprits"])


def score_run(result: dict) -> dict:
    """`result` with daemon_ok, diagnose_ok and ok added (skipped and broken runs: ok
    None and False: they are not scored, and a broken one fails the benchmark)."""
    out = dict(result)
    if "skipped" in result:
        out.update(daemon_ok=None, diagnose_ok=None, ok=None)
        return out
    if "error" in result:
        out.update(daemon_ok=None, diagnose_ok=None, ok=False)
        return out
    d, g = daemon_ok(result), diagnose_ok(result)
    out.update(daemon_ok=d, diagnose_ok=g, ok=d and g is not False)
    return out


def _counts(pairs) -> tuple[int, int, int]:
    """(true positives, false positives, false negatives) over (named, expected) pairs."""
    tp = fp = fn = 0
    for named, expected in pairs:
        named, expected = set(named), set(expected)
        tp += len(named & expected)
        fp += len(named - expected)
        fn += len(expected - named)
    return tp, fp, fn


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 3) if b else None


def _named_pairs(scored, key: str):
    for r in scored:
        truth = r.get("expected_diagnose", r["expected"]) if key == "diagnose" else r["expected"]
        expected = truth["culprits"] if _page_expected(truth) else []
        seen = r.get(key) or {}
        if key == "diagnose" and seen.get("exit") == GONE_EXIT:
            continue
        named = seen.get("culprits") or []
        if key == "daemon" and not seen.get("pages"):
            named = []
        yield named, expected


def _times(values, prefix: str) -> dict:
    return {f"{prefix}_p50_s": percentile(values, 50), f"{prefix}_p90_s": percentile(values, 90),
            f"{prefix}_max_s": max(values) if values else None}


def summarize(results: list[dict]) -> dict:
    scored = [r for r in results if r.get("ok") is not None and "error" not in r]
    broken = [r["name"] for r in results if "error" in r]
    positives = [r for r in scored if _page_expected(r["expected"])]
    negatives = [r for r in scored if not _page_expected(r["expected"])]
    tp, fp, fn = _counts(_named_pairs(scored, "daemon"))
    dtp, dfp, dfn = _counts(_named_pairs(scored, "diagnose"))
    judged = [r for r in scored if r.get("diagnose_ok") is not None]
    pages = [r["daemon"]["time_to_page_s"] for r in positives
             if (r.get("daemon") or {}).get("time_to_page_s") is not None]
    named = [r["daemon"]["time_to_culprit_s"] for r in positives
             if (r.get("daemon") or {}).get("time_to_culprit_s") is not None]
    per_incident = [r["daemon"]["pages_first_incident"] for r in positives
                    if (r.get("daemon") or {}).get("pages_first_incident")]
    false_pages = sum((r.get("daemon") or {}).get("pages", 0) for r in negatives)
    hours = sum(r.get("watched_s", 0.0) for r in negatives) / 3600
    return {
        "runs": len(results), "scored": len(scored), "ok": sum(bool(r["ok"]) for r in scored),
        "skipped": sum("skipped" in r for r in results), "broken": broken,
        "accuracy": _ratio(sum(bool(r["ok"]) for r in scored), len(scored)),
        "daemon_accuracy": _ratio(sum(bool(r["daemon_ok"]) for r in scored), len(scored)),
        "diagnose_accuracy": _ratio(sum(bool(r["diagnose_ok"]) for r in judged), len(judged)),
        "precision": _ratio(tp, tp + fp), "recall": _ratio(tp, tp + fn),
        "diagnose_precision": _ratio(dtp, dtp + dfp), "diagnose_recall": _ratio(dtp, dtp + dfn),
        **_times(pages, "time_to_page"), **_times(named, "time_to_culprit"),
        "pages_per_incident": round(sum(per_incident) / len(per_incident), 2)
        if per_incident else None,
        "false_pages": false_pages, "negative_hours": round(hours, 4),
        "false_pages_per_hour": round(false_pages / hours, 2) if hours else None,
        "wrong_culprits": [r["name"] for r in scored if _wrong_culprit(r)],
        "negatives_paged": [r["name"] for r in negatives if (r.get("daemon") or {}).get("pages")],
    }


def _wrong_culprit(result: dict) -> bool:
    """A named culprit that is not the ground truth's (a miss is no wrong name)."""
    expected = set(result["expected"]["culprits"]) if _page_expected(result["expected"]) else set()
    daemon = result.get("daemon") or {}
    named_d = set(daemon.get("culprits") or []) if daemon.get("pages") else set()
    named_g = set((result.get("diagnose") or {}).get("culprits") or [])
    return bool(named_d - expected or named_g - expected)


def by(results: list[dict], field: str) -> dict[str, dict]:
    """field value -> {runs, ok, accuracy, time_to_page_p50_s, ...} over scored runs."""
    groups: dict[str, list[dict]] = {}
    for r in results:
        if r.get("ok") is not None and "error" not in r:
            groups.setdefault(str(r[field]), []).append(r)
    out = {}
    for name, rs in groups.items():
        pages = [r["daemon"]["time_to_page_s"] for r in rs
                 if _page_expected(r["expected"])
                 and (r.get("daemon") or {}).get("time_to_page_s") is not None]
        out[name] = {"runs": len(rs), "ok": sum(bool(r["ok"]) for r in rs),
                     "accuracy": _ratio(sum(bool(r["ok"]) for r in rs), len(rs)),
                     **_times(pages, "time_to_page")}
    return out
