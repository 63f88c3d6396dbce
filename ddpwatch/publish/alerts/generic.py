"""generic: the alert as flat JSON, optionally signed two ways at once so most
receivers can check it with what they already have:

* Standard Webhooks (https://www.standardwebhooks.com, spec "Verifying webhook
  authenticity"): `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<b64>`
  over "{id}.{timestamp}.{body}"; a `whsec_` secret is base64 key material.
* GitHub style: `X-Hub-Signature-256: sha256=<hex>` over the body alone, keyed by
  the secret string exactly as configured (what GitHub-style receivers expect).

`verify_standard` and `verify_hub` are the receiver side (and what tests use).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time

from .base import Alert, register
from .transport import post_json

FIELDS = ("status", "incident_id", "node", "job", "verdict", "culprits", "summary",
          "started_at", "ended_at", "status_url", "incident_url", "severity")
TOLERANCE_S = 300  # Standard Webhooks' suggested replay window


def payload(alert: Alert) -> dict:
    doc = {f: getattr(alert, f) for f in FIELDS}
    doc["culprits"] = list(alert.culprits)
    return doc


def body_of(alert: Alert) -> bytes:
    return json.dumps(payload(alert), separators=(",", ":"), sort_keys=True).encode()


def message_id(body: bytes) -> str:
    """Derived from the content: the same message keeps its id across retries (the
    spec requires it, receivers deduplicate on it) with no state in the sink."""
    return "msg_" + hashlib.sha256(body).hexdigest()[:32]


def signing_key(secret: str) -> bytes:
    """`whsec_<base64>` -> the decoded bytes; any other secret -> its UTF-8 bytes."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret[len("whsec_"):], validate=True)
        except (binascii.Error, ValueError) as err:
            raise ValueError("a whsec_ secret must be base64 after the prefix") from err
    return secret.encode()


def _standard_sig(key: bytes, msg_id: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


def _hub_sig(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, msg_id: str, timestamp: int) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + _standard_sig(signing_key(secret), msg_id,
                                                   str(timestamp), body),
        "X-Hub-Signature-256": _hub_sig(secret, body),
    }


def _lower(headers) -> dict[str, str]:
    # http.server's headers are case-insensitive, a plain dict is not.
    return {k.lower(): v for k, v in headers.items()}


def _as_bytes(body) -> bytes:
    return body.encode() if isinstance(body, str) else bytes(body)


def verify_standard(secret: str, headers, body, *, tolerance_s: float = TOLERANCE_S,
                    now: float | None = None) -> bool:
    """True if any `v1` signature matches and the timestamp is within tolerance."""
    h = _lower(headers)
    msg_id, ts, sigs = h.get("webhook-id"), h.get("webhook-timestamp"), h.get("webhook-signature")
    if not (msg_id and ts and sigs):
        return False
    try:
        if abs((time.time() if now is None else now) - int(ts)) > tolerance_s:
            return False
        want = _standard_sig(signing_key(secret), msg_id, ts, _as_bytes(body))
    except ValueError:
        return False
    # The header may carry several space-separated signatures (key rotation).
    return any(version == "v1" and hmac.compare_digest(sig, want)
               for version, _, sig in (s.partition(",") for s in sigs.split()))


def verify_hub(secret: str, headers, body) -> bool:
    got = _lower(headers).get("x-hub-signature-256", "")
    return hmac.compare_digest(got, _hub_sig(secret, _as_bytes(body)))


@register("generic", options={"secret": str},
          help="flat JSON POST; with `secret`, Standard Webhooks + X-Hub-Signature-256")
class GenericSink:
    def __init__(self, *, name: str, url: str, timeout_s: float, secret: str = "",
                 now=time.time):
        if secret:
            try:
                signing_key(secret)  # a malformed whsec_ secret is a config error, now
            except ValueError as err:
                raise ValueError(f"secret: {err}") from None
        self.name, self.url, self.timeout_s = name, url, timeout_s
        self._secret, self._now = secret, now

    def __repr__(self) -> str:  # never the secret
        return f"GenericSink(name={self.name!r}, signed={bool(self._secret)})"

    def send(self, alert: Alert) -> None:
        body = body_of(alert)
        headers = {}
        if self._secret:
            # The timestamp is per attempt: a retry minutes later must still fall in
            # the receiver's replay window; the id stays the same.
            headers = sign(self._secret, body, message_id(body), int(self._now()))
        post_json(self.url, body, self.timeout_s, headers)
