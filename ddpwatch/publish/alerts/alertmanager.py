"""alertmanager: POST to `<url>/api/v2/alerts`, so existing routing, grouping,
silences and receivers apply (https://prometheus.io/docs/alerting/latest/clients/).

Identity is the label set: one DDPWatchStall per incident (`incident_id` label);
culprits and summary are annotations, which Alertmanager replaces on each update
without making a new alert.

endsAt, the surprising part. Alertmanager treats a firing alert as a lease:
with no endsAt it sets "last received + resolve_timeout" (default 5 m) and then
resolves the alert BY ITSELF, sending "resolved" to every receiver while the job
may still be hung. Clients must keep re-sending while an alert fires. So, like
Prometheus (endsAt = now + 4 x resend delay), firing alerts carry
endsAt = now + 4 x `resend_s`, and this sink declares `resend_s` so the
Dispatcher re-sends open incidents that often. If the daemon dies, the alert
expires within 4 x resend_s instead of firing forever. A resolved alert carries
its real end time (in the past), which resolves it at once.
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone

from .base import Alert, register
from .transport import post_json

ALERTNAME = "DDPWatchStall"
API_PATH = "/api/v2/alerts"
LEASES_PER_RESEND = 4  # Prometheus' margin: three resends may be lost before expiry


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def endpoint(url: str) -> str:
    """Accept the Alertmanager base URL (any route prefix) or the full API URL."""
    url = url.rstrip("/")
    return url if url.endswith(API_PATH) else url + API_PATH


def payload(alert: Alert, now: float, resend_s: float) -> list[dict]:
    doc = {
        "labels": {"alertname": ALERTNAME, "verdict": alert.verdict, "job": alert.job,
                   "node": alert.node, "severity": alert.severity,
                   "incident_id": alert.incident_id},
        "annotations": {"summary": alert.summary,
                        "culprits": ",".join(str(r) for r in alert.culprits),
                        "status_url": alert.status_url, "incident_url": alert.incident_url},
        "startsAt": rfc3339(alert.started_at),
    }
    if alert.incident_url or alert.status_url:
        # Alertmanager's UI links this as the alert's source: the incident's page
        # says the most; it must be a URL, so omit it rather than send ""
        doc["generatorURL"] = alert.incident_url or alert.status_url
    if not alert.firing:
        # Alertmanager rejects endsAt before startsAt (400); equal clocks, same second.
        doc["endsAt"] = rfc3339(max(alert.ended_at, alert.started_at))
    elif resend_s > 0:
        doc["endsAt"] = rfc3339(now + LEASES_PER_RESEND * resend_s)
    # else: no endsAt, Alertmanager's resolve_timeout is the lease (see module doc).
    return [doc]


@register("alertmanager", options={"resend_s": (int, float)},
          help="Prometheus Alertmanager API v2; re-sends firing alerts every resend_s")
class AlertmanagerSink:
    def __init__(self, *, name: str, url: str, timeout_s: float, resend_s: float = 60.0,
                 now=time.time):
        if resend_s < 0:
            raise ValueError("resend_s: must be >= 0 (0: never re-send, no endsAt)")
        self.name, self.url, self.timeout_s = name, endpoint(url), timeout_s
        self.resend_s = float(resend_s)
        self._now = now

    def __repr__(self) -> str:
        return f"AlertmanagerSink(name={self.name!r}, resend_s={self.resend_s})"

    def send(self, alert: Alert) -> None:
        body = json.dumps(payload(alert, self._now(), self.resend_s)).encode()
        post_json(self.url, body, self.timeout_s)
