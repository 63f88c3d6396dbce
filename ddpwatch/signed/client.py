"""GET from a ddpwatch daemon as its own clients do (`ddpwatch status`, the peer
view, `diagnose --peer`): a signed request and a proven answer when a token is
set (auth.py), no proxy, no redirects, a bounded answer."""
from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

from . import auth


class Unproven(Exception):
    """Whatever answered holds no token: not the daemon (another program on its port)."""


class TooLarge(Exception):
    pass


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # the 3xx is then raised as an HTTPError


OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects())


def get(url: str, path: str, token: str = "", timeout_s: float = 10.0,
        max_bytes: int = 64 << 20) -> bytes:
    """The body of a 200 answer to GET url+path. Raises urllib's HTTPError for
    any other status, URLError/OSError when nothing answers, TooLarge, and
    Unproven when a token is set and the answer does not prove it."""
    target = urllib.parse.urlsplit(url.rstrip("/") + path)
    request = urllib.request.Request(target.geturl())
    nonce = ""
    if token:
        value, nonce = auth.sign_request(token, "GET", _request_target(target))
        request.add_header("Authorization", value)
    with OPENER.open(request, timeout=timeout_s) as response:
        body = response.read(max_bytes + 1)
        if len(body) > max_bytes:
            raise TooLarge(f"answer larger than {max_bytes} bytes")
        if token and not auth.proven(token, nonce, response.status, body,
                                     response.headers.get(auth.PROOF_HEADER)):
            raise Unproven(f"{url}: the answer does not prove the token: whatever "
                           f"answered is not a ddpwatch daemon holding it (another program "
                           f"on its port, or a daemon without a token: then ask without "
                           f"one); nothing it said is used")
    return body


def _request_target(parts: urllib.parse.SplitResult) -> str:
    """What the server sees as its request path (`req.path`)."""
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
