"""One HTTP POST, and the boundary where everything that can go wrong with it
becomes a DeliveryError (retryable or not, with the receiver's Retry-After).

urllib rather than http.client: it honours https_proxy/no_proxy (Slack from
behind a corporate proxy) and verifies TLS certificates by default. Redirects
are NOT followed: urllib would replay a redirected POST as a body-less GET.
"""
from __future__ import annotations

import email.utils
import http.client
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request

from .base import DeliveryError

USER_AGENT = "ddpwatch-alerts/1"
RETRY_STATUSES = frozenset((408, 429, 500, 502, 503, 504))
RETRY_AFTER_STATUSES = frozenset((429, 503))  # where Retry-After means "come back then"
BODY_SNIPPET = 200  # receivers explain 4xx in the body (Slack: "invalid_payload")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urllib then raises HTTPError for the 3xx, handled below


_OPENER = urllib.request.build_opener(_NoRedirect)


def where(url: str) -> str:
    """scheme://host:port only: safe to log (paths and queries may carry tokens)."""
    parts = urllib.parse.urlsplit(url)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Retry-After is delta-seconds or an HTTP date (RFC 9110 10.2.3); None if absent
    or unreadable. A date in the past means "now" (0)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None  # RFC dates are GMT; a naive one is not an HTTP date
    return max(0.0, when.timestamp() - now)


def post_json(url: str, body: bytes, timeout_s: float, headers: dict | None = None) -> bytes:
    """POST `body` as JSON; return the response body on 2xx, else raise DeliveryError.
    `timeout_s` bounds connecting and each read (urllib has no whole-request bound)."""
    hdrs = {"Content-Type": "application/json", "User-Agent": USER_AGENT, **(headers or {})}
    req = urllib.request.Request(url, data=body, headers=hdrs, method="POST")
    target = where(url)
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            return resp.read()
    except urllib.error.HTTPError as err:
        raise _from_status(err, target) from err
    except urllib.error.URLError as err:
        # Wraps connect-time failures: refused, DNS, TLS. A bad certificate will not
        # fix itself between retries; a refused port often will (receiver restarting).
        retryable = not isinstance(err.reason, ssl.SSLCertVerificationError)
        raise DeliveryError(f"{target}: {err.reason}", retryable=retryable) from err
    except (TimeoutError, ConnectionError, http.client.HTTPException, OSError) as err:
        # Timeouts after connecting, resets, a receiver closing without answering.
        raise DeliveryError(f"{target}: {type(err).__name__}: {err}") from err


def _from_status(err: urllib.error.HTTPError, target: str) -> DeliveryError:
    try:
        snippet = err.read(BODY_SNIPPET).decode("utf-8", "replace").strip()
    except Exception:  # the body is only decoration for the message
        snippet = ""
    finally:
        err.close()
    message = f"{target}: HTTP {err.code}" + (f": {snippet}" if snippet else "")
    if 300 <= err.code < 400:
        return DeliveryError(message + " (redirect not followed: configure the final URL)",
                             retryable=False)
    retry_after = None
    if err.code in RETRY_AFTER_STATUSES:
        retry_after = parse_retry_after(err.headers.get("Retry-After"), time.time())
    return DeliveryError(message, retry_after=retry_after,
                         retryable=err.code in RETRY_STATUSES or err.code >= 500)
