"""The cluster view against a real Prometheus (Debian `prometheus`, `promtool`).

There is no Grafana here: every PromQL query of grafana/ddpwatch.json runs against
a Prometheus that scrapes a small HTTP server serving /metrics for a crafted
two-rank view (rank 1 a straggler and culprit), with the alert rules loaded.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from conftest import REPO, free_port, need, wait_until
from prometheus_client import CONTENT_TYPE_LATEST
from crafted import ALERT_STATS, PEERS, daemon_view, paused_job, straggler_job

from ddpwatch.publish.metrics import make_registry, render
from ddpwatch.judge.vocabulary import NAMES as VERDICTS

DASHBOARD = os.path.join(REPO, "grafana", "ddpwatch.json")
ALERTS = os.path.join(REPO, "rules", "prometheus", "ddpwatch-alerts.yaml")
ALERTS_TEST = os.path.join(REPO, "tests", "fixtures", "metrics", "alerts_test.yaml")
DDP_JOB = "run-42"


def dashboard_panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out += [p] + dashboard_panels(p) if p.get("panels") else [p]
    return [p for p in out if p.get("type") != "row"]


def substitute(expr: str, instance: str) -> str:
    """What Grafana sends for the test's variable values: a regex, escaped once for
    the regex and once for the PromQL string (Grafana's prometheusRegularEscape)."""
    values = {"job": DDP_JOB, "instance": re.escape(instance).replace("\\", "\\\\"),
              "__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values[m.group(1) or m.group(2)], expr)


# ------------------------------------------------------------------ no server needed

def test_dashboard_verdict_mappings_follow_rules_verdicts():
    """The verdict panels encode verdicts as VERDICTS indexes: a new verdict must
    be added to the dashboard too."""
    with open(DASHBOARD) as f:
        dash = json.load(f)
    assert dash["schemaVersion"] >= 39
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["DS_PROMETHEUS", "instance", "job"]
    coded = [p for p in dashboard_panels(dash)
             if any('verdict="unknown"' in t["expr"] for t in p["targets"])]
    assert {p["title"] for p in coded} == {"Job verdict", "Rank state"}
    for p in coded:
        (mapping,) = p["fieldConfig"]["defaults"]["mappings"]
        assert [mapping["options"][str(i)]["text"] for i in range(len(VERDICTS))] == list(VERDICTS)
        expr = p["targets"][0]["expr"]
        assert [(v, int(i)) for v, i in re.findall(r'verdict="(\w+)"\} \* (\d+)', expr)] == [
            (v, i) for i, v in enumerate(VERDICTS)]
    for p in dashboard_panels(dash):
        assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p["title"]


def test_dashboard_verdict_panels_are_generated_from_the_vocabulary():
    """A new verdict is a vocabulary line: the generator brings the dashboard along."""
    done = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "dashboard_verdicts.py"),
                           "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_checks_the_rules_and_their_unit_tests():
    promtool = shutil.which("promtool")
    need(promtool is not None, "promtool is not installed (Debian: apt install prometheus)")
    for args in (["check", "rules", ALERTS], ["test", "rules", ALERTS_TEST]):
        out = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120,
                             check=False)
        assert out.returncode == 0, out.stdout + out.stderr


# ------------------------------------------------------------------ a real Prometheus

class _Metrics(BaseHTTPRequestHandler):
    registry = None

    def do_GET(self):
        body = render(self.registry)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def exporter():
    """/metrics for a view that makes progress: one step per second since start."""
    start, ticks = time.monotonic(), iter(range(1, 1 << 30))

    def get_view():
        # with a pause's series too (the time-by-state and pause panels)
        job = dataclasses.replace(straggler_job(time.monotonic() - start, key=DDP_JOB),
                                  over_time=paused_job().over_time)
        return daemon_view([job], tick=next(ticks), peers=PEERS, alert_stats=ALERT_STATS)
    handler = type("Handler", (_Metrics,), {"registry": make_registry(get_view)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def prometheus(exporter, tmp_path_factory):
    binary = shutil.which("prometheus")
    need(binary is not None, "prometheus is not installed (Debian: apt install prometheus)")
    tmp = tmp_path_factory.mktemp("prometheus")
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [ALERTS],
              "scrape_configs": [{"job_name": "ddpwatch",
                                  "static_configs": [{"targets": [exporter]}]}]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(tmp / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def ready():
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False
        wait_until(ready, timeout=60, what="prometheus to be ready")
        # Enough samples for rate() over 1m, and every rule evaluated once.
        wait_until(lambda: _value(url, "count_over_time(ddpwatch_up[1m])") >= 4,
                   timeout=60, what="four scrapes of the exporter")
        wait_until(lambda: (rules := _rules(url)) and all(r.get("health") == "ok" for r in rules),
                   timeout=60, what="every rule evaluated")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


def _api(url: str, path: str, **params) -> dict:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    try:
        with urllib.request.urlopen(f"{url}{path}{query}", timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as err:  # 400 for a bad query: the body says why
        return json.load(err)


def _query(url: str, expr: str) -> dict:
    return _api(url, "/api/v1/query", query=expr)


def _value(url: str, expr: str) -> float:
    result = _query(url, expr).get("data", {}).get("result", [])
    return float(result[0]["value"][1]) if result else 0.0


def _rules(url: str) -> list[dict]:
    groups = _api(url, "/api/v1/rules").get("data", {}).get("groups", [])
    return [r for g in groups for r in g["rules"]]


def test_every_dashboard_query_runs_and_finds_the_crafted_data(prometheus, exporter):
    with open(DASHBOARD) as f:
        dash = json.load(f)
    problems = []
    targets = [(p["title"], t) for p in dashboard_panels(dash) for t in p["targets"]]
    assert len(targets) >= 15
    for title, target in targets:
        expr = substitute(target["expr"], exporter)
        answer = _query(prometheus, expr)
        if answer.get("status") != "success":
            problems.append(f"{title}: {answer.get('error')}\n{expr}")
        elif not answer["data"]["result"]:
            problems.append(f"{title}: empty result\n{expr}")
    assert not problems, "\n\n".join(problems)


def test_dashboard_variables_resolve(prometheus, exporter):
    with open(DASHBOARD) as f:
        dash = json.load(f)
    found = {}
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
        assert m, var["query"]
        answer = _query(prometheus, substitute(m.group(1), exporter))
        assert answer["status"] == "success", answer
        found[var["name"]] = {s["metric"].get(m.group(2)) for s in answer["data"]["result"]}
    assert found == {"instance": {exporter}, "job": {DDP_JOB}}


def test_crafted_values_arrive_as_exported(prometheus, exporter):
    sel = f'ddp_job="{DDP_JOB}", instance="{exporter}"'
    assert _value(prometheus, f'ddpwatch_rank_arrival_lateness_seconds{{{sel}, rank="1"}}') == 0.3
    assert _value(prometheus, f'rate(ddpwatch_rank_tokens_total{{{sel}, rank="0"}}[1m])') > 0
    # The scrape job keeps its own label: the DDP job did not become `exported_job`.
    states = f'count(ddpwatch_rank_state{{job="ddpwatch", ddp_job="{DDP_JOB}"}})'
    assert _value(prometheus, states) == 2 * len(VERDICTS)


def test_alert_rules_load_healthy_and_name_the_culprit(prometheus, exporter):
    with open(ALERTS) as f:
        shipped = {r.get("alert") or r.get("record") for g in yaml.safe_load(f)["groups"]
                   for r in g["rules"]}
    loaded = _rules(prometheus)
    assert {r["name"] for r in loaded} == shipped
    assert [r for r in loaded if r["health"] != "ok"] == []

    def culprit_alert():
        alerts = _api(prometheus, "/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "DDPWatchCulprit"]
    (alert,) = wait_until(culprit_alert, timeout=30, what="DDPWatchCulprit pending or firing")
    assert alert["state"] in ("pending", "firing")
    assert {k: alert["labels"][k] for k in ("ddp_job", "rank", "verdict", "instance")} == {
        "ddp_job": DDP_JOB, "rank": "1", "verdict": "straggler", "instance": exporter}
