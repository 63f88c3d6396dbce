"""slack: an incoming-webhook message (https://api.slack.com/messaging/webhooks).

`text` is the one-line fallback Slack shows in notifications; `blocks` carry the
verdict, culprits, node/job and summary. The URL path is the credential, so it is
never logged (transport.where). Slack answers 429 with Retry-After when rate
limited, and 400/403/404/410 with a reason in the body (not retried).
"""
from __future__ import annotations

import json
import time

from .base import Alert, register
from .transport import post_json

HEADER_MAX = 150   # Slack's limit for header text
TEXT_MAX = 3000    # ... and for a section's text


def escape(text: str) -> str:
    """Slack mrkdwn treats &, < and > as control characters (links, mentions)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ranks(alert: Alert) -> str:
    return ", ".join(str(r) for r in alert.culprits) or "none named"


def fallback_text(alert: Alert) -> str:
    if alert.firing:
        return (f"DDP stall on {alert.node} (job {alert.job}): {alert.verdict}, "
                f"culprit rank(s) {_ranks(alert)}")
    return (f"Resolved: DDP stall on {alert.node} (job {alert.job}): {alert.verdict}, "
            f"culprit rank(s) {_ranks(alert)}")


def _when(ts: float) -> str:
    # <!date^…> renders in each reader's time zone; the fallback is UTC.
    fallback = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
    return f"<!date^{int(ts)}^{{date_short_pretty}} {{time_secs}}|{fallback}>"


def payload(alert: Alert) -> dict:
    title = (f"DDP stall: {alert.verdict}" if alert.firing
             else f"Resolved: DDP stall ({alert.verdict})")
    fields = [("Verdict", alert.verdict), ("Culprit ranks", _ranks(alert)),
              ("Node", alert.node), ("Job", alert.job)]
    if not alert.firing and alert.ended_at:
        fields.append(("Lasted", f"{max(0.0, alert.ended_at - alert.started_at):.0f} s"))
    context = [f"Started {_when(alert.started_at)}"]
    if not alert.firing and alert.ended_at:
        context.append(f"resolved {_when(alert.ended_at)}")
    if alert.incident_url:
        context.append(f"<{alert.incident_url}|incident page>")
    if alert.status_url:
        context.append(f"<{alert.status_url}|daemon status>")
    context.append(f"incident `{escape(alert.incident_id)}`")
    return {
        "text": escape(fallback_text(alert)),
        "blocks": [
            {"type": "header",
             "text": {"type": "plain_text", "text": _clip(title, HEADER_MAX)}},
            {"type": "section",
             "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{escape(v)}"} for k, v in fields]},
            {"type": "section",
             "text": {"type": "mrkdwn", "text": _clip(escape(alert.summary) or "-", TEXT_MAX)}},
            {"type": "context",
             "elements": [{"type": "mrkdwn", "text": " · ".join(context)}]},
        ],
    }


@register("slack", help="Slack incoming webhook (the URL is the secret)")
class SlackSink:
    def __init__(self, *, name: str, url: str, timeout_s: float):
        self.name, self.url, self.timeout_s = name, url, timeout_s

    def __repr__(self) -> str:  # never the URL: its path is the token
        return f"SlackSink(name={self.name!r})"

    def send(self, alert: Alert) -> None:
        post_json(self.url, json.dumps(payload(alert)).encode(), self.timeout_s)
