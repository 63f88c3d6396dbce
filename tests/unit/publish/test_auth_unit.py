"""Signed requests and proven answers (ddpwatch/signed/auth.py), pure: the
token never appears in what a client sends, a request is good once, at the
daemon whose challenge it carries and only while that daemon lives, and a
server's answer is believed only with a proof made with the token for this
very request. The /challenge endpoint (publish/endpoints.py) keeps nothing."""
from __future__ import annotations

import pytest

from fake_request import Request

from ddpwatch.publish.endpoints import Server
from ddpwatch.signed import auth

TOKEN = "s3cret-token-of-the-cluster"
MINE = "c" * 32  # the client's nonce for its challenge
AT = "10.0.0.1:19500"  # where the client reached the daemon


def challenge(identity: str = "node-a", now: float = 1000.0, nonce: str | None = None,
              at: str = AT) -> str:
    return auth.make_challenge(TOKEN, identity, at, MINE, now, nonce=nonce)


def verifier(now: float = 1000.0, identity: str = "node-a", **kw) -> auth.Verifier:
    return auth.Verifier(clock=lambda: now, identity=identity, **kw)


def signed(made: str | None = None, target: str = "/status", now: float = 1000.0, **kw):
    return auth.sign_request(TOKEN, "GET", target, made or challenge(), now=now, **kw)


def test_a_signed_request_is_accepted_once_and_never_carries_the_token():
    header, nonce = signed(target="/status?stacks=1")
    assert TOKEN not in header and header.startswith(auth.SCHEME + " ")
    v = verifier(1010.0)
    assert v.check(TOKEN, header, "GET", "/status?stacks=1", AT) == (True, nonce, "")
    assert v.check(TOKEN, header, "GET", "/status?stacks=1", AT) == (
        False, "", "replayed request")


def test_a_challenge_is_good_once_at_its_daemon_only_and_for_a_short_time():
    """A request collected by a squatter while the daemon was down carries no
    challenge of the live daemon; one made for node A is refused at node B and
    at A once it restarted (a new identity)."""
    made = challenge("node-a")
    assert auth.challenge_valid(TOKEN, "node-a", AT, made, MINE)
    assert not auth.challenge_valid(TOKEN, "node-a", AT, made, "d" * 32)  # another asker's
    assert not auth.challenge_valid("guess", "node-a", AT, made, MINE)    # a forgery
    header, _ = signed(made)
    for other in (verifier(identity="node-b"), verifier(identity="node-a-restarted")):
        ok, _, why = other.check(TOKEN, header, "GET", "/status", AT)
        assert not ok and "did not give" in why
    late = verifier(1000.0 + auth.CHALLENGE_S + 2)
    assert late.check(TOKEN, header, "GET", "/status", AT)[2].startswith("challenge expired")
    v = verifier()
    assert v.check(TOKEN, header, "GET", "/status", AT)[0]
    again, _ = signed(made)  # the same challenge, a new request nonce
    assert v.check(TOKEN, again, "GET", "/status", AT) == (False, "", "replayed request")
    forged = made.rsplit(".", 1)[0] + "." + "0" * 64
    assert not verifier().check(TOKEN, signed(forged)[0], "GET", "/status", AT)[0]
    # a later expiry than the daemon gives (clock set back since) is refused too
    ahead = challenge(now=1000.0 + 60)
    assert verifier().check(TOKEN, signed(ahead)[0], "GET", "/status", AT)[2].startswith(
        "challenge expired")


def test_a_challenge_names_the_address_it_was_asked_at():
    """A squatter on node A's port that relays node B's challenge hands the
    client one that names B's address, not the one the client reached: the
    client signs nothing for it (signed/client.py _challenge). And the daemon
    takes a request only on the address its challenge names."""
    made = challenge(at="10.0.0.2:19500")
    assert not auth.challenge_valid(TOKEN, "node-a", "127.0.0.1:19500", made, MINE)
    ok, _, why = verifier().check(TOKEN, signed(made)[0], "GET", "/status", "10.0.0.9:19500")
    assert not ok and "did not give" in why


@pytest.mark.parametrize("sockaddr, named", [
    (("127.0.0.1", 19500), "127.0.0.1:19500"),
    (("::ffff:10.0.0.5", 19500, 0, 0), "10.0.0.5:19500"),
    (("fe80::1%eth0", 80, 0, 2), "[fe80::1]:80"),
    (("::1", 19500, 0, 0), "[::1]:19500"),
])
def test_both_ends_name_an_address_alike(sockaddr, named):
    assert auth.address(sockaddr) == named


def test_a_signature_holds_for_its_token_method_and_target_only():
    header, _ = signed()
    for token, method, target in (("other-token", "GET", "/status"),
                                  (TOKEN, "GET", "/peer"), (TOKEN, "POST", "/status")):
        assert verifier().check(token, header, method, target, AT) == (False, "", "wrong token")


def test_a_signature_from_another_time_is_refused_and_says_by_how_much():
    later = 1000.0 + auth.WINDOW_S + 5
    header, _ = signed(challenge(now=later), now=1000.0)
    ok, nonce, why = verifier(later).check(TOKEN, header, "GET", "/status", AT)
    assert not ok and not nonce and "-305 s" in why and "set the clocks" in why


@pytest.mark.parametrize("value", [
    "", "Bearer wrong", "Basic dG9rZW4=", auth.SCHEME, f"{auth.SCHEME} ts=1, nonce=ab",
    f"{auth.SCHEME} ts=1, nonce=ab, mac=cd", f"{auth.SCHEME} ts=1, nonce=ab, mac=cd, mac=cd",
    f"{auth.SCHEME} ts=1, nonce=zz, mac=cd, challenge=ab",
    f"{auth.SCHEME} ts=1, nonce=ab, mac=cd, challenge=ab",  # not a challenge's shape
    f"{auth.SCHEME} " + "ts=1, " * 200 + "nonce=ab, mac=cd",
])
def test_anything_but_a_signature_or_the_bearer_token_is_refused(value):
    assert auth.Verifier().check(TOKEN, value, "GET", "/status", AT) == (
        False, "", "token required")


def test_bearer_is_still_taken_and_no_token_means_open():
    assert auth.Verifier().check(TOKEN, f"Bearer {TOKEN}", "GET", "/status") == (True, "", "")
    assert auth.Verifier().check("", "", "GET", "/status") == (True, "", "")


def test_the_used_challenges_are_bounded_and_forgotten_once_expired():
    """Only token holders add to the memory; full of live challenges it
    refuses rather than forget one that could then be replayed."""
    now = [1000.0]
    v = auth.Verifier(clock=lambda: now[0], max_used=8, identity="node-a")

    def one(i: int) -> tuple[bool, str, str]:
        made = challenge(now=now[0], nonce=f"{i:032x}")
        return v.check(TOKEN, signed(made, target="/peer", now=now[0])[0], "GET", "/peer", AT)
    assert all(one(i)[0] for i in range(8))
    ok, _, why = one(8)
    assert not ok and why.startswith("more than 8 signed requests within 30 s")
    now[0] += auth.CHALLENGE_S + 1
    assert one(9)[0] and len(v._used) == 1


def test_an_answer_is_proven_only_for_its_nonce_status_and_body():
    proof = auth.answer_proof(TOKEN, "ab12", 200, b'{"node": "n1"}')
    assert auth.proven(TOKEN, "ab12", 200, b'{"node": "n1"}', proof)
    assert not auth.proven(TOKEN, "ab13", 200, b'{"node": "n1"}', proof)
    assert not auth.proven(TOKEN, "ab12", 200, b'{"node": "evil"}', proof)
    assert not auth.proven(TOKEN, "ab12", 503, b'{"node": "n1"}', proof)
    assert not auth.proven("other", "ab12", 200, b'{"node": "n1"}', proof)
    assert not auth.proven(TOKEN, "ab12", 200, b'{"node": "n1"}', None)
    assert not auth.proven(TOKEN, "ab12", 200, b'{"node": "n1"}', "")




def ask(server, path: str) -> tuple[int, bytes]:
    req = Request(path)
    server.handle(req)
    return req.code, req.body


@pytest.mark.parametrize("query", [
    "", "?", "?c=", "?c=" + "C" * 32, "?c=" + "c" * 31, "?c=" + "c" * 33, "?x=" + "c" * 32,
    "?c=" + "c" * 32 + "&c=" + "d" * 32, "?c=" + "g" * 32, "?c=" + "%63" * 32,
])
def test_a_malformed_challenge_request_is_a_clear_400(query):
    server = Server("127.0.0.1", 0, lambda: None, lambda: b"", token=TOKEN)
    try:
        code, body = ask(server, "/challenge" + query)
        assert code == 400 and b"c=<32 lowercase hex digits" in body, body
    finally:
        server.stop()


def test_challenges_cost_the_daemon_nothing_to_give_and_none_without_a_token():
    import json
    server = Server("127.0.0.1", 0, lambda: None, lambda: b"", token=TOKEN)
    try:
        answers = [json.loads(ask(server, f"/challenge?c={i:032x}")[1]) for i in range(2000)]
        assert len({a["challenge"] for a in answers}) == 2000
        assert {a["identity"] for a in answers} == {server.verifier.identity}
        assert server.verifier._used == {}  # nothing kept for anonymous askers
    finally:
        server.stop()
    tokenless = Server("127.0.0.1", 0, lambda: None, lambda: b"")
    try:
        assert ask(tokenless, "/challenge?c=" + MINE)[0] == 404
    finally:
        tokenless.stop()
