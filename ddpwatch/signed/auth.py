"""Signed requests and proven answers between the daemon and its clients
(`ddpwatch status`, `diagnose --peer`, the peer view), so the token never
crosses the wire, an answer is trusted only from a holder of the token, and a
signed request is good once, at the live daemon it was made for.

Why: while the daemon is down (boot, a restart) any local user can bind its
port first. A client that sent `Authorization: Bearer <token>` handed the token
to that program, and a peer that took its `/peer` answer as it came let it
forge ranks and alert claims (publish/alerts/route.py). A request signed over
its method and target alone could still be collected there, unused, and
replayed to the daemon once it was back, or at any other node sharing the
token. With a token set:

* the client first asks `GET /challenge?c=<its own fresh nonce, 32 hex>`; the
  daemon answers `{"identity": <a random id of this daemon process>, "at":
  <the address the asker reached it at>, "challenge": "<client nonce>.<daemon
  nonce>.<expiry>.<HMAC(token, "ddpwatch-challenge" identity at client-nonce
  daemon-nonce expiry)>"}`. It keeps nothing: a challenge is checked by its MAC
  when it comes back, so anonymous askers cost no memory;
* the client signs only over a challenge whose MAC holds for its own nonce and
  for the address its connection went to (the peer address of that socket):
  a program without the token can make no challenge, so it never receives a
  signed request; and one that relays the challenge from another node's daemon
  is caught by the address (that daemon names its own);
* the signed request: `Authorization: DDPWatch-HMAC-SHA256 ts=<unix seconds>,
  nonce=<random>, challenge=<the challenge>, mac=<HMAC(token,
  "ddpwatch-request" ts nonce method target challenge)>`; the token itself is
  never sent;
* the daemon accepts it when the MAC holds, the challenge is one it made
  (this process's identity, arriving at the address it named), unexpired
  (CHALLENGE_S), unused (each daemon nonce once: the only memory, added to by
  token holders alone, bounded by MAX_USED and by expiry), and the timestamp is
  within WINDOW_S of its clock. A restarted daemon has a new identity, so no
  challenge of the old one, and no request bound to it, is taken;
* it proves its answer: `X-Ddpwatch-Proof: <HMAC(token, "ddpwatch-answer"
  nonce status sha256(body))>`, and the client uses an answer only with a
  valid proof of its own nonce.

Signed clients need a direct path to the daemon: a NAT, proxy or tunnel makes
the address the daemon sees differ from the one the client reached, and the
client refuses, saying so (README, "Trust model"). Tests:
tests/unit/publish/test_auth_unit.py, tests/hostile/test_port_squat.py.

The daemon still takes `Bearer <token>` (curl, a browser extension, Prometheus'
`authorization:`), but its own clients never send one. README, "Trust model".
Pure but for the clock and the random nonces, both injectable.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
import threading
import time

SCHEME = "DDPWatch-HMAC-SHA256"
PROOF_HEADER = "X-Ddpwatch-Proof"
WINDOW_S = 300.0      # clocks of a LAN's nodes agree far better than this (NTP)
CHALLENGE_S = 30.0    # a challenge is good this long after the daemon gave it
MAX_USED = 16384      # challenges remembered as used; only token holders add
HEX32 = re.compile(r"[0-9a-f]{32}")
_CHALLENGE = re.compile(r"([0-9a-f]{32})\.([0-9a-f]{32})\.([0-9]{1,20})\.([0-9a-f]{64})")
_FIELD = re.compile(r"\s*(ts|nonce|mac|challenge)=([0-9a-f]{1,128}|[0-9]{1,20}|"
                    + _CHALLENGE.pattern + r")\s*")


def _mac(token: str, *parts: str) -> str:
    return hmac.new(token.encode(), "\n".join(parts).encode(), hashlib.sha256).hexdigest()


def address(sockaddr) -> str:
    """A socket's address as both ends name it: "ip:port" ("[ip]:port" for
    IPv6), an IPv4-mapped IPv6 address as IPv4 (a daemon on "::" sees its IPv4
    clients so), no scope id."""
    host, port = str(sockaddr[0]).partition("%")[0], int(sockaddr[1])
    try:
        ip = ipaddress.ip_address(host)
        if ip.version == 6 and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        host = str(ip)
    except ValueError:
        pass
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def make_challenge(token: str, identity: str, at: str, client_nonce: str, now: float,
                   nonce: str | None = None) -> str:
    """"client-nonce.daemon-nonce.expiry.mac": the daemon's answer to
    GET /challenge?c=client_nonce on a connection that reached it at `at`."""
    expiry = str(int(now + CHALLENGE_S))
    nonce = nonce or os.urandom(16).hex()
    mac = _mac(token, "ddpwatch-challenge", identity, at, client_nonce, nonce, expiry)
    return f"{client_nonce}.{nonce}.{expiry}.{mac}"


def challenge_valid(token: str, identity: str, at: str, challenge: str,
                    client_nonce: str | None = None) -> bool:
    """Whether `challenge` was made with the token by the daemon `identity`
    reached at `at` (and, for the client, for its own nonce)."""
    m = _CHALLENGE.fullmatch(challenge)
    if m is None or (client_nonce is not None and m.group(1) != client_nonce):
        return False
    return hmac.compare_digest(m.group(4).encode(), _mac(
        token, "ddpwatch-challenge", identity, at, *m.group(1, 2, 3)).encode())


def sign_request(token: str, method: str, target: str, challenge: str,
                 now: float | None = None, nonce: str | None = None) -> tuple[str, str]:
    """(the Authorization header's value, the nonce the answer's proof must name)."""
    ts = str(int(time.time() if now is None else now))
    nonce = nonce or os.urandom(16).hex()
    mac = _mac(token, "ddpwatch-request", ts, nonce, method, target, challenge)
    return f"{SCHEME} ts={ts}, nonce={nonce}, challenge={challenge}, mac={mac}", nonce


def answer_proof(token: str, nonce: str, status: int, body: bytes) -> str:
    return _mac(token, "ddpwatch-answer", nonce, str(status), hashlib.sha256(body).hexdigest())


def proven(token: str, nonce: str, status: int, body: bytes, proof: str | None) -> bool:
    return bool(proof) and hmac.compare_digest(proof.encode(),
                                               answer_proof(token, nonce, status, body).encode())


def parse(value: str) -> dict | None:
    """The fields of a signed Authorization header, or None if it is not one."""
    scheme, _, rest = value.partition(" ")
    if scheme != SCHEME or len(rest) > 768:
        return None
    fields = {}
    for part in rest.split(","):
        m = _FIELD.fullmatch(part)
        if m is None or m.group(1) in fields:
            return None
        fields[m.group(1)] = m.group(2)
    if set(fields) != {"ts", "nonce", "mac", "challenge"} or \
            not _CHALLENGE.fullmatch(fields["challenge"]):
        return None
    return fields


class Verifier:
    """The daemon's side: the challenges it gives, and which requests come
    from a holder of the token."""

    def __init__(self, clock=time.time, window_s: float = WINDOW_S,
                 max_used: int = MAX_USED, identity: str | None = None):
        self.clock = clock
        # who this daemon is to its challenges: a random id per process, so a
        # challenge (and a request bound to it) is good at this daemon only,
        # and only until it restarts
        self.identity = identity or os.urandom(16).hex()
        self.window_s = window_s
        self.max_used = max_used
        self._used: dict[str, int] = {}  # daemon nonce of a used challenge -> its expiry
        self._lock = threading.Lock()  # the HTTP workers check at once

    def challenge(self, token: str, at: str, client_nonce: str) -> dict:
        """The answer to GET /challenge?c=client_nonce (client_nonce: HEX32),
        asked on a connection that reached this daemon at `at`. Stateless."""
        return {"identity": self.identity, "at": at,
                "challenge": make_challenge(token, self.identity, at, client_nonce,
                                            self.clock())}

    def check(self, token: str, value: str, method: str, target: str,
              at: str = "") -> tuple[bool, str, str]:
        """(accepted, nonce to prove the answer to or "", why refused or "");
        `at`: the address the request's connection reached this daemon at."""
        if not token:
            return True, "", ""
        if hmac.compare_digest(value.encode(), f"Bearer {token}".encode()):
            return True, "", ""
        fields = parse(value)
        if fields is None:
            return False, "", "token required"
        challenge = fields["challenge"]
        if not hmac.compare_digest(
                fields["mac"].encode(),
                _mac(token, "ddpwatch-request", fields["ts"], fields["nonce"], method,
                     target, challenge).encode()):
            return False, "", "wrong token"
        if not challenge_valid(token, self.identity, at, challenge):
            return False, "", ("a challenge this daemon did not give (another node's, or "
                               "before it restarted): ask for a new one")
        _, used, expiry, _ = challenge.split(".")
        now, ts, expiry = self.clock(), int(fields["ts"]), int(expiry)
        if not now <= expiry <= now + CHALLENGE_S + 1:
            return False, "", "challenge expired: ask for a new one"
        if abs(now - ts) > self.window_s:
            return False, "", (f"signed with a clock {ts - now:+.0f} s off this node's "
                               f"(more than {self.window_s:.0f} s: set the clocks)")
        with self._lock:
            if used in self._used:
                return False, "", "replayed request"
            if len(self._used) >= self.max_used:
                self._used = {k: e for k, e in self._used.items() if e >= now}
                if len(self._used) >= self.max_used:
                    return False, "", (f"more than {self.max_used} signed requests within "
                                       f"{CHALLENGE_S:.0f} s: ask again")
            self._used[used] = expiry
        return True, fields["nonce"], ""
