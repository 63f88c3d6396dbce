"""The alertmanager sink against a real Alertmanager (Debian's prometheus-alertmanager):
it must list our alert, route it to a webhook receiver, and resolve it."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from datetime import datetime

import pytest
from conftest import Receiver, free_port, need, wait_until
from crafted import alert

from ddpwatch.publish.alerts import Dispatcher, build_sinks

BINARY = "/usr/bin/prometheus-alertmanager"


@pytest.fixture
def receiver(receivers):
    return receivers()


@pytest.fixture
def start_alertmanager(tmp_path, receiver):
    """start_alertmanager(resolve_timeout="5m") -> base URL of an Alertmanager whose
    only route sends to `receiver` at once (tiny group_wait/group_interval)."""
    need(os.access(BINARY, os.X_OK), f"{BINARY} is missing (apt-get install prometheus-alertmanager)")
    procs = []

    def start(resolve_timeout: str = "5m") -> str:
        config = {  # JSON is YAML: no YAML writer needed
            "global": {"resolve_timeout": resolve_timeout},
            "route": {"receiver": "hook", "group_by": ["incident_id"], "group_wait": "100ms",
                      "group_interval": "300ms", "repeat_interval": "1h"},
            "receivers": [{"name": "hook", "webhook_configs": [
                {"url": receiver.url, "send_resolved": True}]}],
        }
        path = tmp_path / "alertmanager.yml"
        path.write_text(json.dumps(config))
        if shutil.which("amtool"):  # the config an operator would copy must be valid
            subprocess.run(["amtool", "check-config", str(path)], check=True,
                           capture_output=True, timeout=30)
        port = free_port()
        log = open(tmp_path / "alertmanager.log", "wb")
        procs.append((subprocess.Popen(
            [BINARY, f"--config.file={path}", f"--storage.path={tmp_path / 'am-data'}",
             f"--web.listen-address=127.0.0.1:{port}",
             "--cluster.listen-address=",  # empty: no gossip, no cluster settle wait
             "--log.level=debug"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True), log))
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _ready(url), timeout=30, interval=0.1, what="Alertmanager /-/ready")
        return url

    yield start
    for proc, log in procs:
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(grace)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def listed(url: str, incident_id: str) -> dict | None:
    """Our alert as GET /api/v2/alerts shows it (only unresolved alerts are listed)."""
    with urllib.request.urlopen(url + "/api/v2/alerts", timeout=5) as resp:
        alerts = json.load(resp)
    return next((a for a in alerts if a["labels"].get("incident_id") == incident_id), None)


def instant(rfc3339_text: str) -> float:
    return datetime.fromisoformat(rfc3339_text).timestamp()


def same_instant(rfc3339_text: str, ts: float) -> bool:
    """Go prints RFC3339 with trailing zeros trimmed ("35.05Z"): compare instants."""
    return abs(instant(rfc3339_text) - ts) < 0.001


def notified(receiver: Receiver, status: str, incident_id: str) -> dict | None:
    """The webhook notification Alertmanager sent for this incident and status."""
    for req in list(receiver.requests):
        doc = json.loads(req.body)
        for a in doc.get("alerts", []):
            if doc["status"] == status and a["labels"].get("incident_id") == incident_id:
                return a
    return None


@pytest.fixture
def dispatch():
    made = []

    def start(url: str, **options) -> Dispatcher:
        sinks = build_sinks([{"type": "alertmanager", "url": url, **options}], source="test")
        made.append(Dispatcher(sinks, base_delay_s=0.05, max_delay_s=0.5))
        return made[-1]

    yield start
    for d in made:
        d.close(0)


def test_alertmanager_lists_routes_and_resolves_our_alert(start_alertmanager, receiver, dispatch):
    url = start_alertmanager()
    d = dispatch(url, resend_s=0.5)
    started = time.time()
    d.submit(alert(iid="inc-am", started_at=started, culprits=(1, 3)))

    shown = wait_until(lambda: listed(url, "inc-am"), timeout=10, interval=0.1,
                       what="the alert in GET /api/v2/alerts")
    assert shown["labels"] == {"alertname": "DDPWatchStall", "verdict": "hung_outside_collective",
                               "job": "run-42", "node": "node-a", "severity": "critical",
                               "incident_id": "inc-am"}
    assert shown["annotations"]["culprits"] == "1,3"
    assert shown["annotations"]["summary"] == alert().summary
    assert shown["generatorURL"] == "http://node-a:19500/status"
    assert shown["status"]["state"] == "active"
    assert same_instant(shown["startsAt"], started)

    # Our lease (now + 4 x resend_s), not Alertmanager's resolve_timeout, and renewed.
    first_end = instant(shown["endsAt"])
    assert first_end - time.time() < 60  # 4 x 0.5 s, not resolve_timeout (5 m)
    wait_until(lambda: instant((listed(url, "inc-am") or shown)["endsAt"]) > first_end,
               timeout=10, interval=0.1, what="the lease renewed by a resend")

    fired = wait_until(lambda: notified(receiver, "firing", "inc-am"), timeout=10,
                       interval=0.1, what="Alertmanager's firing notification")
    assert fired["annotations"]["culprits"] == "1,3"

    ended = time.time()
    d.submit(alert("resolved", iid="inc-am", started_at=started, ended_at=ended, culprits=(1, 3)))
    wait_until(lambda: listed(url, "inc-am") is None, timeout=10, interval=0.1,
               what="the alert gone from the active list")
    resolved = wait_until(lambda: notified(receiver, "resolved", "inc-am"), timeout=10,
                          interval=0.1, what="Alertmanager's resolved notification")
    assert same_instant(resolved["endsAt"], ended)
    stats = d.stats()["alertmanager"]
    assert stats["failed"] == 0 and stats["sent"] >= 3  # firing, >= 1 resend, resolved

    n = len(receiver.requests)
    time.sleep(1.5)  # several resend periods: a resolved incident is not re-sent
    assert not any(json.loads(r.body)["status"] == "firing" for r in receiver.requests[n:])


def test_without_resends_alertmanager_resolves_by_itself(start_alertmanager, receiver, dispatch):
    """Why the sink re-sends: an alert not re-sent within resolve_timeout is resolved
    by Alertmanager itself, and receivers are told "resolved" while the job hangs."""
    url = start_alertmanager(resolve_timeout="1s")
    d = dispatch(url, resend_s=0)
    d.submit(alert(iid="inc-lease", started_at=time.time()))
    wait_until(lambda: listed(url, "inc-lease"), timeout=10, interval=0.1, what="listed")
    wait_until(lambda: notified(receiver, "resolved", "inc-lease"), timeout=15, interval=0.1,
               what="Alertmanager resolving an alert nobody resolved")
    assert d.stats()["alertmanager"]["sent"] == 1  # we only ever sent "firing"


def test_a_wrong_alertmanager_url_fails_fast(start_alertmanager, dispatch):
    url = start_alertmanager()
    d = dispatch(url + "/no-such-prefix")  # Alertmanager answers 404: retrying cannot help
    d.submit(alert(iid="inc-404"))
    wait_until(lambda: d.stats()["alertmanager"]["failed"] == 1, timeout=10, what="give-up")
    assert d.stats()["alertmanager"]["retried"] == 0
