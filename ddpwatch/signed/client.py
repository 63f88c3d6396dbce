"""GET from a ddpwatch daemon as its own clients do (`ddpwatch status`, the peer
view, `diagnose --peer`): when a token is set, a challenge of the daemon first,
then a request signed over it and a proven answer (auth.py); no proxy, no
redirects, a bounded answer."""
from __future__ import annotations

import http.client
import io
import json
import os
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
        challenge = _challenge(url, token, timeout_s)
        value, nonce = auth.sign_request(token, "GET", _request_target(target), challenge)
        request.add_header("Authorization", value)
    with OPENER.open(request, timeout=timeout_s) as response:
        body = response.read(max_bytes + 1)
        if len(body) > max_bytes:
            raise TooLarge(f"answer larger than {max_bytes} bytes")
        if token and not auth.proven(token, nonce, response.status, body,
                                     response.headers.get(auth.PROOF_HEADER)):
            raise Unproven(_not_proven(url))
    return body


def _challenge(url: str, token: str, timeout_s: float) -> str:
    """A fresh challenge of the daemon at `url`, proven made with the token for
    this client's own nonce and for the address this connection went to
    (auth.py): nothing is signed for whatever else answers, nor for another
    node's daemon that it relays."""
    parts = urllib.parse.urlsplit(url)
    try:
        host, port = parts.hostname, parts.port
        if parts.scheme not in ("http", "https") or not host:
            raise ValueError(url)
        conn = (http.client.HTTPSConnection if parts.scheme == "https" else
                http.client.HTTPConnection)(host, port, timeout=timeout_s)
    except (ValueError, http.client.InvalidURL) as err:
        raise urllib.error.URLError(f"not a daemon's base URL (http://HOST:PORT): "
                                    f"{url!r}") from err
    mine = os.urandom(16).hex()
    try:
        conn.request("GET", parts.path.rstrip("/") + f"/challenge?c={mine}")
        reached = auth.address(conn.sock.getpeername())  # before the answer closes it
        response = conn.getresponse()
        body = response.read(4096)
        status = response.status
    except http.client.HTTPException as err:  # not HTTP: not a daemon of ours
        raise Unproven(_not_proven(url)) from err
    finally:
        conn.close()
    if status == 404:  # a daemon without a token, one older than challenges, or none of ours
        raise Unproven(_not_proven(url) + " (a ddpwatch daemon older than challenges also "
                       "answers so: upgrade it)")
    if status != 200:
        raise urllib.error.HTTPError(url, status, body[:200].decode("utf-8", "replace"),
                                     response.headers, io.BytesIO(body))
    try:
        doc = json.loads(body)
        identity, there, challenge = (str(doc[k]) for k in ("identity", "at", "challenge"))
    except (ValueError, KeyError, TypeError, RecursionError) as err:  # nested [[[...
        raise Unproven(_not_proven(url)) from err
    if auth.challenge_valid(token, identity, reached, challenge, mine):
        return challenge
    if there != reached:
        raise Unproven(f"{url}: the daemon that answered says it was reached at {there[:64]!r}, "
                       f"but this connection went to {reached}: another program on the port "
                       f"relays a daemon elsewhere, or a NAT, proxy or tunnel sits between; "
                       f"signed requests need a direct path to the daemon (README, \"Trust "
                       f"model\"); nothing was signed for it")
    raise Unproven(_not_proven(url))


def _not_proven(url: str) -> str:
    return (f"{url}: the answer does not prove the token: whatever answered is not a "
            f"ddpwatch daemon holding it (another program on its port, or a daemon without "
            f"a token: then ask without one); nothing it said is used")


def _request_target(parts: urllib.parse.SplitResult) -> str:
    """What the server sees as its request path (`req.path`)."""
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
