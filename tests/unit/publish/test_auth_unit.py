"""Signed requests and proven answers (ddpwatch/signed/auth.py), pure: the
token never appears in what a client sends, and a server's answer is believed
only with a proof made with the token for this very request."""
from __future__ import annotations

import pytest

from ddpwatch.signed import auth

TOKEN = "s3cret-token-of-the-cluster"


def test_a_signed_request_is_accepted_once_and_never_carries_the_token():
    header, nonce = auth.sign_request(TOKEN, "GET", "/status?stacks=1", now=1000.0)
    assert TOKEN not in header and header.startswith(auth.SCHEME + " ")
    verifier = auth.Verifier(clock=lambda: 1010.0)
    assert verifier.check(TOKEN, header, "GET", "/status?stacks=1") == (True, nonce, "")
    assert verifier.check(TOKEN, header, "GET", "/status?stacks=1") == (
        False, "", "replayed request")


@pytest.mark.parametrize("token, method, target, why", [
    ("another-token", "GET", "/status", "wrong token"),
    (TOKEN, "GET", "/peer", "wrong token"),            # signed for /status, sent to /peer
    (TOKEN, "POST", "/status", "wrong token"),
])
def test_a_signature_holds_for_its_token_method_and_target_only(token, method, target, why):
    header, _ = auth.sign_request(TOKEN, "GET", "/status", now=1000.0)
    assert auth.Verifier(clock=lambda: 1000.0).check(token, header, method, target) == (
        False, "", why)


def test_a_signature_from_another_time_is_refused_and_says_by_how_much():
    header, _ = auth.sign_request(TOKEN, "GET", "/status", now=1000.0)
    ok, nonce, why = auth.Verifier(clock=lambda: 1000.0 + auth.WINDOW_S + 5).check(
        TOKEN, header, "GET", "/status")
    assert not ok and not nonce and "-305 s" in why and "set the clocks" in why


@pytest.mark.parametrize("value", [
    "", "Bearer wrong", "Basic dG9rZW4=", auth.SCHEME, f"{auth.SCHEME} ts=1, nonce=ab",
    f"{auth.SCHEME} ts=1, nonce=ab, mac=cd, mac=cd", f"{auth.SCHEME} ts=1, nonce=zz, mac=cd",
    f"{auth.SCHEME} " + "ts=1, " * 200 + "nonce=ab, mac=cd",
])
def test_anything_but_a_signature_or_the_bearer_token_is_refused(value):
    assert auth.Verifier().check(TOKEN, value, "GET", "/status") == (
        False, "", "token required")


def test_bearer_is_still_taken_and_no_token_means_open():
    assert auth.Verifier().check(TOKEN, f"Bearer {TOKEN}", "GET", "/status") == (True, "", "")
    assert auth.Verifier().check("", "", "GET", "/status") == (True, "", "")


def test_the_replay_memory_is_bounded_and_forgets_old_signatures():
    now = [1000.0]
    verifier = auth.Verifier(clock=lambda: now[0], max_nonces=8)
    for i in range(20):
        header, _ = auth.sign_request(TOKEN, "GET", "/peer", now=now[0], nonce=f"{i:04x}")
        assert verifier.check(TOKEN, header, "GET", "/peer")[0]
    assert len(verifier._seen) == 8
    now[0] += 3 * auth.WINDOW_S
    header, _ = auth.sign_request(TOKEN, "GET", "/peer", now=now[0], nonce="ffff")
    assert verifier.check(TOKEN, header, "GET", "/peer")[0]
    assert list(verifier._seen) == ["ffff"]


def test_an_answer_is_proven_only_for_its_nonce_status_and_body():
    proof = auth.answer_proof(TOKEN, "ab12", 200, b'{"node": "n1"}')
    assert auth.proven(TOKEN, "ab12", 200, b'{"node": "n1"}', proof)
    assert not auth.proven(TOKEN, "ab13", 200, b'{"node": "n1"}', proof)
    assert not auth.proven(TOKEN, "ab12", 200, b'{"node": "evil"}', proof)
    assert not auth.proven(TOKEN, "ab12", 503, b'{"node": "n1"}', proof)
    assert not auth.proven("other", "ab12", 200, b'{"node": "n1"}', proof)
    assert not auth.proven(TOKEN, "ab12", 200, b'{"node": "n1"}', None)
    assert not auth.proven(TOKEN, "ab12", 200, b'{"node": "n1"}', "")
