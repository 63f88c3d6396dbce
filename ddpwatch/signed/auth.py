"""Signed requests and proven answers between the daemon and its clients
(`ddpwatch status`, `diagnose --peer`, the peer view), so the token never
crosses the wire and an answer is trusted only from a holder of the token.

Why: while the daemon is down (boot, a restart) any local user can bind its
port first. A client that sent `Authorization: Bearer <token>` handed the token
to that program, and a peer that took its `/peer` answer as it came let it
forge ranks and alert claims (publish/alerts/route.py). With a token set:

* the client signs its request: `Authorization: DDPWatch-HMAC-SHA256 ts=<unix
  seconds>, nonce=<random>, mac=<HMAC-SHA256(token, "ddpwatch-request" ts nonce
  method target)>`; the token itself is never sent;
* the daemon accepts a signature made within WINDOW_S of its own clock, once
  (a replayed nonce is refused), and proves its answer:
  `X-Ddpwatch-Proof: <HMAC-SHA256(token, "ddpwatch-answer" nonce status
  sha256(body))>`;
* the client uses an answer only with a valid proof of its own nonce: a
  program without the token can neither read the token nor be believed.

The daemon still takes `Bearer <token>` (curl, a browser extension, Prometheus'
`authorization:`), but its own clients never send one. README, "Trust model".
Pure but for the clock and the random nonce, both injectable.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import re
import threading
import time
from collections import OrderedDict

SCHEME = "DDPWatch-HMAC-SHA256"
PROOF_HEADER = "X-Ddpwatch-Proof"
WINDOW_S = 300.0      # clocks of a LAN's nodes agree far better than this (NTP)
MAX_NONCES = 16384    # signed requests remembered against replay; only token holders add
_FIELD = re.compile(r"\s*(ts|nonce|mac)=([0-9a-f]{1,128}|[0-9]{1,20})\s*")


def _mac(token: str, *parts: str) -> str:
    return hmac.new(token.encode(), "\n".join(parts).encode(), hashlib.sha256).hexdigest()


def sign_request(token: str, method: str, target: str, now: float | None = None,
                 nonce: str | None = None) -> tuple[str, str]:
    """(the Authorization header's value, the nonce the answer's proof must name)."""
    ts = str(int(time.time() if now is None else now))
    nonce = nonce or os.urandom(16).hex()
    return (f"{SCHEME} ts={ts}, nonce={nonce}, "
            f"mac={_mac(token, 'ddpwatch-request', ts, nonce, method, target)}", nonce)


def answer_proof(token: str, nonce: str, status: int, body: bytes) -> str:
    return _mac(token, "ddpwatch-answer", nonce, str(status), hashlib.sha256(body).hexdigest())


def proven(token: str, nonce: str, status: int, body: bytes, proof: str | None) -> bool:
    return bool(proof) and hmac.compare_digest(proof.encode(),
                                               answer_proof(token, nonce, status, body).encode())


def parse(value: str) -> dict | None:
    """The fields of a signed Authorization header, or None if it is not one."""
    scheme, _, rest = value.partition(" ")
    if scheme != SCHEME or len(rest) > 512:
        return None
    fields = {}
    for part in rest.split(","):
        m = _FIELD.fullmatch(part)
        if m is None or m.group(1) in fields:
            return None
        fields[m.group(1)] = m.group(2)
    return fields if set(fields) == {"ts", "nonce", "mac"} else None


class Verifier:
    """The daemon's side: which requests come from a holder of the token."""

    def __init__(self, clock=time.time, window_s: float = WINDOW_S,
                 max_nonces: int = MAX_NONCES):
        self.clock = clock
        self.window_s = window_s
        self.max_nonces = max_nonces
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> its ts
        self._lock = threading.Lock()  # the HTTP workers check at once

    def check(self, token: str, value: str, method: str, target: str) -> tuple[bool, str, str]:
        """(accepted, nonce to prove the answer to or "", why refused or "")."""
        if not token:
            return True, "", ""
        if hmac.compare_digest(value.encode(), f"Bearer {token}".encode()):
            return True, "", ""
        fields = parse(value)
        if fields is None:
            return False, "", "token required"
        if not hmac.compare_digest(
                fields["mac"].encode(),
                _mac(token, "ddpwatch-request", fields["ts"], fields["nonce"], method,
                     target).encode()):
            return False, "", "wrong token"
        now, ts = self.clock(), int(fields["ts"])
        if abs(now - ts) > self.window_s:
            return False, "", (f"signed with a clock {ts - now:+.0f} s off this node's "
                               f"(more than {self.window_s:.0f} s: set the clocks)")
        with self._lock:
            while self._seen and (len(self._seen) >= self.max_nonces or
                                  next(iter(self._seen.values())) < now - 2 * self.window_s):
                self._seen.popitem(last=False)
            if fields["nonce"] in self._seen:
                return False, "", "replayed request"
            self._seen[fields["nonce"]] = ts
        return True, fields["nonce"], ""
