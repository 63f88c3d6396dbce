"""Alert webhooks against a real local HTTP receiver: signatures, payload shapes,
retries, Retry-After, give-ups, a hung receiver, shutdown, overflow and order."""
from __future__ import annotations

import base64
import email.utils
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO, free_port, wait_until
from crafted import alert

from ddpwatch.publish.alerts import (
    Alert,
    Dispatcher,
    alertmanager,
    build_sinks,
    generic,
    slack,
    verify_hub,
    verify_standard,
)
from ddpwatch.publish.alerts.dispatch import backoff_delay
from ddpwatch.publish.alerts.transport import parse_retry_after
from ddpwatch.errors import ConfigError

FAST = dict(base_delay_s=0.05, max_delay_s=0.2)
SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


@pytest.fixture
def receiver(receivers):
    return receivers()


@pytest.fixture
def dispatchers():
    """dispatchers(sinks, **kw) -> a Dispatcher, closed at teardown."""
    made = []

    def start(sinks, **kw) -> Dispatcher:
        made.append(Dispatcher(sinks, **{**FAST, **kw}))
        return made[-1]

    yield start
    for d in made:
        d.close(0)


def one(kind, url, **kw):
    return build_sinks([{"type": kind, "url": url, **kw}], source="test.yaml")[0]


class FakeSink:
    """In-process sink: `gate` holds send() (to fill the queue); records alerts."""

    def __init__(self, name="fake", resend_s=0.0, errors=()):
        self.name, self.resend_s = name, resend_s
        self.got: list[Alert] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # send() has been called: the alert is in flight
        self.errors = list(errors)

    def send(self, a):
        self.entered.set()
        self.gate.wait(10)
        if self.errors:
            raise self.errors.pop(0)
        self.got.append(a)


# --- generic: payload and signatures ---------------------------------------------
def test_generic_signed_message_verifies_with_both_schemes(receiver, dispatchers):
    d = dispatchers([one("generic", receiver.url, secret=SECRET)])
    d.submit(alert())
    req = receiver.wait_for(1)[0]
    assert req.path == "/hook" and req.headers["content-type"] == "application/json"
    doc = json.loads(req.body)
    assert doc == {"status": "firing", "incident_id": "inc-1", "node": "node-a", "job": "run-42",
                   "verdict": "hung_outside_collective", "culprits": [3],
                   "summary": alert().summary, "started_at": 1_700_000_000.0, "ended_at": 0.0,
                   "status_url": "http://node-a:19500/status", "incident_url": "",
                   "severity": "critical"}
    assert req.headers["webhook-signature"].startswith("v1,")
    assert verify_standard(SECRET, req.headers, req.body)
    assert verify_hub(SECRET, req.headers, req.body)
    wrong = "whsec_" + base64.b64encode(b"not the secret").decode()
    assert not verify_standard(wrong, req.headers, req.body)
    assert not verify_hub(wrong, req.headers, req.body)
    assert not verify_standard(SECRET, req.headers, req.body + b" ")
    assert not verify_hub(SECRET, req.headers, req.body.replace(b"3", b"4"))


def test_raw_secret_keys_with_its_bytes_and_retries_keep_the_message_id(receiver, dispatchers):
    receiver.respond((500, {}, 0))
    d = dispatchers([one("generic", receiver.url, secret="plain secret")])
    d.submit(alert())
    first, second = receiver.wait_for(2)[:2]
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    for req in (first, second):
        assert verify_standard("plain secret", req.headers, req.body)
        assert verify_hub("plain secret", req.headers, req.body)
    assert not verify_standard("whsec_" + base64.b64encode(b"plain secret").decode() + "x",
                               first.headers, first.body)
    d.submit(alert("resolved"))  # a different message: a different id
    assert receiver.wait_for(3)[2].headers["webhook-id"] != first.headers["webhook-id"]


def test_unsigned_generic_sends_no_signature_headers(receiver, dispatchers):
    dispatchers([one("generic", receiver.url)]).submit(alert())
    headers = receiver.wait_for(1)[0].headers
    assert "webhook-signature" not in headers and "x-hub-signature-256" not in headers


def test_standard_signature_rejects_stale_timestamps():
    body = generic.body_of(alert())
    headers = generic.sign(SECRET, body, generic.message_id(body), 1_000)
    assert verify_standard(SECRET, headers, body, now=1_000 + 299)
    assert not verify_standard(SECRET, headers, body, now=1_000 + 301)
    assert not verify_standard(SECRET, {}, body)
    # Key rotation: any one of several space-separated signatures may match.
    rotated = dict(headers, **{"webhook-signature": "v1,bm9wZQ== " + headers["webhook-signature"]})
    assert verify_standard(SECRET, rotated, body, now=1_000)


# --- slack ----------------------------------------------------------------------------
def test_slack_payload_shape(receiver, dispatchers):
    dispatchers([one("slack", receiver.url)]).submit(alert(culprits=(3, 5), summary="a <b> & c"))
    doc = json.loads(receiver.wait_for(1)[0].body)
    assert set(doc) == {"text", "blocks"} and "\n" not in doc["text"]
    assert "hung_outside_collective" in doc["text"] and "3, 5" in doc["text"]
    header, fields, summary, context = doc["blocks"]
    assert header["type"] == "header" and header["text"]["type"] == "plain_text"
    shown = " ".join(f["text"] for f in fields["fields"])
    for needle in ("hung_outside_collective", "3, 5", "node-a", "run-42"):
        assert needle in shown
    assert summary["text"]["text"] == "a &lt;b&gt; &amp; c"  # mrkdwn control chars escaped
    assert "http://node-a:19500/status" in context["elements"][0]["text"]

    done = slack.payload(alert("resolved"))
    assert done["text"].startswith("Resolved") and "Resolved" in done["blocks"][0]["text"]["text"]
    assert "90 s" in json.dumps(done["blocks"][1])


# --- delivery: retries and give-ups ---------------------------------------------------
def test_receiver_down_then_up_is_delivered_after_retries(receivers, dispatchers):
    port = free_port()
    d = dispatchers([one("generic", f"http://127.0.0.1:{port}/hook", timeout_s=1)],
                    max_attempts=200)
    d.submit(alert())
    wait_until(lambda: d.stats()["generic"]["retried"] >= 2, timeout=10, what="refused retries")
    r = receivers(port=port)
    wait_until(lambda: d.stats()["generic"]["sent"] == 1, timeout=10, what="delivery")
    assert len(r.wait_for(1)) == 1
    assert d.stats()["generic"] == dict(sent=1, failed=0, retried=d.stats()["generic"]["retried"],
                                        dropped=0, pending=0)


def test_500_then_200_is_retried(receiver, dispatchers):
    receiver.respond((500, {}, 0), (503, {}, 0))
    d = dispatchers([one("generic", receiver.url)])
    d.submit(alert())
    assert [r.status for r in receiver.wait_for(3)] == [500, 503, 200]
    wait_until(lambda: d.stats()["generic"]["sent"] == 1, timeout=5, what="sent")
    assert d.stats()["generic"]["retried"] == 2


def test_429_retry_after_is_honoured(receiver, dispatchers):
    receiver.respond((429, {"Retry-After": "1"}, 0))
    d = dispatchers([one("slack", receiver.url)], max_delay_s=5)
    d.submit(alert())
    first, second = receiver.wait_for(2, timeout=5)
    assert second.at - first.at >= 1.0  # full jitter alone would retry within 0.05 s


def test_400_is_not_retried(receiver, dispatchers):
    receiver.respond((400, {}, 0))
    d = dispatchers([one("slack", receiver.url)])
    d.submit(alert())
    wait_until(lambda: d.stats()["slack"]["failed"] == 1, timeout=5, what="give-up")
    time.sleep(0.3)  # several backoff periods: a retry would have arrived
    assert len(receiver.requests) == 1
    assert d.stats()["slack"] == dict(sent=0, failed=1, retried=0, dropped=0, pending=0)


def test_gives_up_after_max_attempts(receiver, dispatchers):
    receiver.respond(*[(502, {}, 0)] * 3)
    d = dispatchers([one("generic", receiver.url)], max_attempts=3)
    d.submit(alert())
    wait_until(lambda: d.stats()["generic"]["failed"] == 1, timeout=5, what="give-up")
    assert len(receiver.requests) == 3 and d.stats()["generic"]["retried"] == 2


def test_a_sink_bug_does_not_kill_its_worker(dispatchers):
    sink = FakeSink(errors=[RuntimeError("bug in a flavour")])
    d = dispatchers([sink])
    d.submit(alert(iid="a"))
    d.submit(alert(iid="b"))
    wait_until(lambda: [a.incident_id for a in sink.got] == ["b"], timeout=5, what="next alert")
    assert d.stats()["fake"]["failed"] == 1


# --- never block the daemon; bounded shutdown -----------------------------------------
def test_submit_returns_at_once_while_a_receiver_hangs(receivers, dispatchers):
    hung, healthy = receivers(), receivers()
    hung.respond(*[(200, {}, 3.0)] * 50)  # sleeps far past the 0.2 s timeout
    d = dispatchers([one("generic", hung.url, timeout_s=0.2, name="hung"),
                     one("generic", healthy.url, name="healthy")])
    for i in range(20):
        t0 = time.perf_counter()
        d.submit(alert(iid=f"inc-{i}"))
        assert time.perf_counter() - t0 < 0.05
    # The slow receiver delays only its own lane.
    assert len(healthy.wait_for(20, timeout=5)) == 20
    assert d.stats()["hung"]["sent"] == 0


def test_close_within_its_bound_returns_the_number_left(receiver, dispatchers):
    receiver.respond(*[(200, {}, 3.0)] * 50)
    d = dispatchers([one("generic", receiver.url, timeout_s=0.3)])
    for i in range(3):
        d.submit(alert(iid=f"inc-{i}"))
    receiver.wait_for(1)
    t0 = time.monotonic()
    assert d.close(0.5) == 3
    assert time.monotonic() - t0 < 0.9
    assert d.submit(alert(iid="late")) is False


def test_close_flushes_what_is_pending(receiver, dispatchers):
    d = dispatchers([one("generic", receiver.url)])
    for i in range(5):
        d.submit(alert(iid=f"inc-{i}"))
    assert d.close(5) == 0
    assert [json.loads(r.body)["incident_id"] for r in receiver.requests] == \
        [f"inc-{i}" for i in range(5)]


def test_close_cuts_a_long_backoff_short(receiver, dispatchers):
    receiver.respond((503, {"Retry-After": "30"}, 0))
    d = dispatchers([one("generic", receiver.url)], max_delay_s=60)
    d.submit(alert())
    receiver.wait_for(1)
    t0 = time.monotonic()
    assert d.close(2) == 0  # one prompt last try instead of waiting 30 s
    assert time.monotonic() - t0 < 1.5


def test_overflow_drops_the_oldest_and_counts_it(dispatchers):
    sink = FakeSink()
    sink.gate.clear()
    d = dispatchers([sink], queue_size=3)
    assert d.submit(alert(iid="0"))
    assert sink.entered.wait(5)
    assert all(d.submit(alert(iid=str(i))) for i in (1, 2, 3))
    assert d.submit(alert(iid="4")) is False  # "1" goes, the newest stays
    assert d.stats()["fake"]["dropped"] == 1 and d.stats()["fake"]["pending"] == 4
    sink.gate.set()
    wait_until(lambda: len(sink.got) == 4, timeout=5, what="delivery")
    assert [a.incident_id for a in sink.got] == ["0", "2", "3", "4"]


def test_firing_before_resolved_per_sink_despite_retries(receiver, dispatchers):
    receiver.respond((500, {}, 0), (200, {}, 0), (502, {}, 0), (200, {}, 0), (429, {}, 0))
    d = dispatchers([one("generic", receiver.url)])
    events = [("firing", "a"), ("firing", "b"), ("resolved", "a"), ("firing", "c"),
              ("resolved", "b"), ("resolved", "c")]
    for status, iid in events:
        d.submit(alert(status, iid))
    wait_until(lambda: d.stats()["generic"]["sent"] == 6, timeout=10, what="all sent")
    accepted = [(json.loads(r.body)["status"], json.loads(r.body)["incident_id"])
                for r in receiver.requests if r.status == 200]
    assert accepted == events


def test_resend_keeps_open_incidents_alive_until_resolved(dispatchers):
    sink = FakeSink(resend_s=0.1)
    d = dispatchers([sink])
    d.submit(alert(iid="a"))
    wait_until(lambda: len(sink.got) >= 3, timeout=5, what="resends")
    d.submit(alert("resolved", iid="a"))
    wait_until(lambda: sink.got[-1].status == "resolved", timeout=5, what="resolved")
    n = len(sink.got)
    time.sleep(0.35)
    assert len(sink.got) == n  # nothing open, nothing re-sent
    assert all(a.status == "firing" for a in sink.got[:-1])


# --- pure parts ------------------------------------------------------------------------
def test_retry_after_seconds_and_http_dates():
    now = 1_700_000_000.0
    assert parse_retry_after("1", now) == 1.0
    assert parse_retry_after(" 2.5 ", now) == 2.5
    assert parse_retry_after(email.utils.formatdate(now + 7, usegmt=True), now) == 7.0
    assert parse_retry_after(email.utils.formatdate(now - 7, usegmt=True), now) == 0.0
    assert parse_retry_after("soon", now) is None and parse_retry_after(None, now) is None


def test_backoff_is_full_jitter_capped():
    top = lambda lo, hi: hi
    assert [backoff_delay(n, 0.5, 60, top) for n in range(9)] == \
        [0.5, 1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff_delay(3, 0.5, 60, lambda lo, hi: lo) == 0.0


def test_alertmanager_payload_and_endpoint():
    firing, = alertmanager.payload(alert(culprits=(3, 5)), now=1_700_000_100.0, resend_s=60)
    assert firing["labels"] == {"alertname": "DDPWatchStall", "verdict": "hung_outside_collective",
                                "job": "run-42", "node": "node-a", "severity": "critical",
                                "incident_id": "inc-1"}
    assert firing["annotations"]["culprits"] == "3,5"
    assert firing["startsAt"] == "2023-11-14T22:13:20.000Z"
    assert firing["endsAt"] == "2023-11-14T22:19:00.000Z"  # now + 4 x resend_s
    assert firing["generatorURL"] == "http://node-a:19500/status"
    assert "endsAt" not in alertmanager.payload(alert(), 0, resend_s=0)[0]
    resolved, = alertmanager.payload(alert("resolved"), now=1e10, resend_s=60)
    assert resolved["endsAt"] == "2023-11-14T22:14:50.000Z"
    assert alertmanager.endpoint("http://am:9093/") == "http://am:9093/api/v2/alerts"
    assert alertmanager.endpoint("http://h/am/api/v2/alerts") == "http://h/am/api/v2/alerts"


# --- config ------------------------------------------------------------------------------
@pytest.mark.parametrize("items, needle", [
    ([{"type": "pagerduty", "url": "http://x"}], "webhooks[0]: type: 'pagerduty'"),
    ([{"type": "slack", "url": "http://x"}, {"type": "slack", "url": "http://y", "secret": "s"}],
     "webhooks[1]: unknown key 'secret'"),
    ([{"type": "generic"}], "webhooks[0]: url: missing"),
    ([{"type": "generic", "url": "ftp://x/secret-path"}], "webhooks[0]: url: expected http"),
    ([{"type": "generic", "url": "http://x", "timeout_s": "5"}], "webhooks[0]: timeout_s: expected"),
    ([{"type": "generic", "url": "http://x", "timeout_s": 0}], "webhooks[0]: timeout_s: must be > 0"),
    ([{"type": "generic", "url": "http://x", "secret": "whsec_!!"}], "webhooks[0]: secret: "),
    ([{"type": "alertmanager", "url": "http://x", "resend_s": -1}], "webhooks[0]: resend_s: "),
    ([{"type": "generic", "url": "http://x", "name": "a"}, {"type": "slack", "url": "http://y", "name": "a"}],
     "webhooks[1]: name: 'a'"),
    (["http://x"], "webhooks[0]: expected a mapping"),
    ([{"type": "slack", "url": "http://x:99999/secret-path"}], "webhooks[0]: url: bad port"),
])
def test_build_sinks_errors_name_source_item_and_key(items, needle):
    with pytest.raises(ConfigError) as err:
        build_sinks(items, source="/etc/ddpwatch/config.yaml")
    assert str(err.value).startswith("/etc/ddpwatch/config.yaml: ")
    assert needle in str(err.value)
    assert "secret-path" not in str(err.value)


def test_build_sinks_names_and_defaults():
    sinks = build_sinks([{"type": "slack", "url": "https://hooks.example/T/B/X"},
                         {"type": "generic", "url": "http://a"},
                         {"type": "generic", "url": "http://b", "timeout_s": 2, "name": "pager"}])
    assert [s.name for s in sinks] == ["slack", "generic-1", "pager"]
    assert sinks[1].timeout_s == 5.0 and sinks[2].timeout_s == 2.0
    assert "T/B/X" not in repr(sinks[0])
    assert build_sinks([]) == [] and build_sinks(None) == []


def test_importing_alerts_does_not_import_torch():
    code = "import sys, ddpwatch.publish.alerts; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                   env=dict(os.environ, PYTHONPATH=REPO))
