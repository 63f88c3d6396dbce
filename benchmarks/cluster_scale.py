"""The cluster view at scale: the alert rules over a simulated cluster of daemons.

    python benchmarks/cluster_scale.py [--nodes 256] [--ranks 8] [--only promtool|prometheus]

Each scenario (benchmarks/cluster_sim.py: stopped, lagging, straggler, node_down)
hides one culprit among nodes x ranks; two judges:

* promtool: `promtool test rules` over input series sampled from the model, the
  shipped rules (annotations left out); at three times per scenario every alert
  of the rule file must fire with exactly the expected label sets (most: none).
  At most 32 nodes x 8: promtool's test engine refuses larger queries.
* prometheus: a real Prometheus (a fresh one per scenario) scrapes one simulated
  daemon per node (one process here serving every node on its own loopback
  port, rendered by the daemon's own metrics code) with the shipped rules loaded,
  until the scenario's alerts fire; every alert that names a rank or node, firing
  or pending, must name the culprit's. Measured meanwhile from Prometheus's own
  /metrics and API: series per node, series in the head, each rule group's
  evaluation time and Prometheus's resident memory.

Ports are picked at run time; Prometheus and the exporters are stopped and the
temporary directories removed at the end, on SIGTERM and Ctrl-C too.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_sim as sim  # noqa: E402
from common import free_port  # noqa: E402
from ddpwatch.publish.metrics import SPECS, to_families  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = os.path.join(REPO, "rules", "prometheus", "ddpwatch-alerts.yaml")
RANKED = ("rank", "instance")   # labels that point at a place in the cluster
_SPEC_INDEX = {name: i for i, name in enumerate(SPECS)}
# promtool test rules (2.42) evaluates with a query limit of 10 000 samples: at
# 256 x 8 the rules' selectors of ddpwatch_rank_state alone hold 30 720 series
# ("query processing would load too many samples into memory"); so does 64 x 8
# (7 680, with the query's intermediate vectors). 32 x 8 passes; the full size
# is judged by the real Prometheus.
PROMTOOL_NODES = 32


# ------------------------------------------------------------------ promtool

def promtool_files(tmp: str, nodes: int, rpn: int, scenarios=sim.SCENARIOS,
                   clusters=None) -> list[str]:
    """One `promtool test rules` file per scenario in `tmp` (and the rules
    without annotations beside them)."""
    with open(RULES) as f:
        rules = yaml.safe_load(f)
    rules_file = os.path.join(tmp, "rules.yaml")
    with open(rules_file, "w") as f:
        yaml.safe_dump(sim.without_annotations(rules), f, sort_keys=False)
    clusters = clusters or [sim.Cluster(s, nodes, rpn, f"run-{s}", 180.0) for s in scenarios]
    paths = []
    for c in clusters:
        path = os.path.join(tmp, f"{c.scenario}_test.yaml")
        with open(path, "w") as f:
            f.write(sim.promtool_test(rules_file, rules, [c]))
        paths.append(path)
    return paths


def run_promtool(paths: list[str], promtool: str = "promtool") -> list[tuple[str, int, str, float]]:
    """(file, exit status, output, seconds) of `promtool test rules` on each file,
    as many at a time as there are cores."""
    def one(path):
        started = time.monotonic()
        done = subprocess.run([promtool, "test", "rules", path], capture_output=True, text=True,
                              timeout=900, check=False)
        return path, done.returncode, done.stdout + done.stderr, time.monotonic() - started
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(one, paths))


def promtool_run(nodes: int, rpn: int) -> bool:
    tmp = tempfile.mkdtemp(prefix="ddpwatch-scale-")
    try:
        started = time.monotonic()
        paths = promtool_files(tmp, nodes, rpn)
        made = time.monotonic() - started
        results = run_promtool(paths)
        total = time.monotonic() - started
        print(f"promtool test rules, {nodes} nodes x {rpn} ranks: input made in {made:.1f} s, "
              f"{total:.1f} s in all")
        ok = True
        for path, rc, out, seconds in results:
            size = os.path.getsize(path) / 1e6
            name = os.path.basename(path).removesuffix("_test.yaml")
            print(f"  {name:10s} {'PASS' if rc == 0 else 'FAIL'} in {seconds:.1f} s ({size:.0f} MB of input)")
            if rc:
                ok = False
                print(out[-4000:])
        return ok
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------ simulated daemons

class _Families:
    def __init__(self, families):
        self._families = families

    def collect(self):
        return self._families


class Renderer:
    """A node's /metrics text as the daemon renders it (metrics.to_families, then
    prometheus_client's generate_latest), byte for byte, at a fraction of the
    cost: the text is rendered in full once per set of series, and later
    scrapes with the same series only put their values in (floatToGoString, as
    generate_latest writes them). 256 nodes scraped every 5 s are 51 renders a
    second on the same two cores as Prometheus."""

    def __init__(self):
        self._keys: tuple | None = None
        self._chunks: list[str] = []
        self._order: list[int] = []

    def text(self, rows: list) -> bytes:
        order = sorted(range(len(rows)), key=lambda i: (_SPEC_INDEX[rows[i][0]], i))
        keys = tuple((rows[i][0], rows[i][1]) for i in order)
        if keys != self._keys:
            text = generate_latest(_Families(to_families(rows))).decode()
            chunks, cur = [], []
            for line in text.splitlines(keepends=True):
                if line.startswith("#"):
                    cur.append(line)
                    continue
                cur.append(line.rpartition(" ")[0] + " ")
                chunks.append("".join(cur))
                cur = ["\n"]
            chunks.append("".join(cur))
            if len(chunks) != len(rows) + 1:  # not one line per row: render in full each time
                return text.encode()
            self._keys, self._chunks, self._order = keys, chunks, order
        out = [self._chunks[0]]
        for i, chunk in zip(self._order, self._chunks[1:]):
            out += [floatToGoString(rows[i][2]), chunk]
        return "".join(out).encode()


class Exporters:
    """One loopback port per node, serving what that node's daemon would: the
    current cluster's rows at the time of the scrape, rendered by the daemon's
    metrics code (503 while the node is down: the scrape fails, `up` is 0)."""

    def __init__(self, nodes: int):
        self.nodes = nodes
        self.cluster: sim.Cluster | None = None
        self.t0 = 0.0
        self.ports: list[int] = []
        self.renders = 0
        self.render_s = 0.0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._servers = []
        self._renderers = [Renderer() for _ in range(nodes)]

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the simulated exporters did not start")

    def play(self, cluster: sim.Cluster | None) -> None:
        self.cluster, self.t0 = cluster, time.time()

    def instance(self, node: int) -> str:
        return f"127.0.0.1:{self.ports[node]}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def listen():
            for node in range(self.nodes):
                server = await asyncio.start_server(
                    lambda r, w, node=node: self._serve(node, r, w), "127.0.0.1", 0, backlog=64)
                self._servers.append(server)
                self.ports.append(server.sockets[0].getsockname()[1])
            self._ready.set()
        self._loop.run_until_complete(listen())
        self._loop.run_forever()
        for server in self._servers:
            server.close()
        self._loop.close()

    def _body(self, node: int) -> bytes | None:
        cluster = self.cluster
        if cluster is None:
            return None
        started = time.perf_counter()
        rows = cluster.rows(node, time.time() - self.t0)
        body = None if rows is None else self._renderers[node].text(rows)
        self.renders += 1
        self.render_s += time.perf_counter() - started
        return body

    async def _serve(self, node: int, reader, writer) -> None:
        try:
            while True:  # keep-alive: Prometheus reuses its connection
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"GET "):
                    break
                body = self._body(node)
                if body is None:
                    writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; "
                                 b"charset=utf-8\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)


# ------------------------------------------------------------------ a real Prometheus

class Prometheus:
    def __init__(self, binary: str, targets: list[str], interval_s: int, tmp: str):
        self.tmp = tmp
        config = {"global": {"scrape_interval": f"{interval_s}s",
                             "evaluation_interval": f"{interval_s}s"},
                  "rule_files": [RULES],
                  "scrape_configs": [{"job_name": sim.SCRAPE_JOB,
                                      "static_configs": [{"targets": targets}]}]}
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            yaml.safe_dump(config, f)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(os.path.join(tmp, "prometheus.log"), "wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("prometheus exited:\n" + self.log_tail())
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError("prometheus did not get ready:\n" + self.log_tail())

    def log_tail(self) -> str:
        with open(os.path.join(self.tmp, "prometheus.log"), errors="replace") as f:
            return f.read()[-3000:]

    def api(self, path: str, **params) -> dict:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=30) as r:
            return json.load(r)

    def query(self, expr: str) -> list:
        return self.api("/api/v1/query", query=expr)["data"]["result"]

    def alerts(self) -> list[dict]:
        return self.api("/api/v1/alerts")["data"]["alerts"]

    def own_metrics(self) -> dict[tuple, float]:
        """Prometheus's own /metrics: {(name, (label, value)...): value}."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as r:
            text = r.read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.log.close()


class Readings:
    """Prometheus's cost, read every few seconds while a scenario runs."""

    def __init__(self):
        self.rss: list[float] = []
        self.head: list[float] = []
        self.groups: dict[str, list[float]] = {}

    def take(self, prom: Prometheus) -> None:
        own = prom.own_metrics()
        for (name, labels), value in own.items():
            if name == "process_resident_memory_bytes":
                self.rss.append(value)
            elif name == "prometheus_tsdb_head_series":
                self.head.append(value)
            elif name == "prometheus_rule_group_last_duration_seconds" and value > 0:
                group = dict(labels)["rule_group"].rsplit(";", 1)[-1]
                self.groups.setdefault(group, []).append(value)


def _place(alert: dict) -> dict:
    return {k: alert["labels"][k] for k in RANKED if k in alert["labels"]}


def prometheus_scenario(binary: str, exporters: Exporters, scenario: str, nodes: int, rpn: int,
                        interval_s: int, onset_s: float, timeout_s: float) -> dict:
    """One scenario against a fresh Prometheus: until every expected alert fires
    (or timeout_s after the onset). Returns what was seen and measured."""
    cluster = sim.Cluster(scenario, nodes, rpn, f"run-{scenario}", onset_s)
    want = cluster.expected(onset_s + 240.0, exporters.instance)  # every alert it makes
    # the 2m-`for:` alerts over 2m windows: stopped and lagging ranks also wait
    # least, later; the scenario is judged once its main alerts fire
    main = {name: labels for name, labels in want.items()
            if not (scenario in ("stopped", "lagging") and name == "DDPWatchStragglerWaitsLeast")}
    tmp = tempfile.mkdtemp(prefix="ddpwatch-prom-")
    prom = Prometheus(binary, [exporters.instance(n) for n in range(nodes)], interval_s, tmp)
    readings, fired, wrong, transient = Readings(), {}, [], {}
    culprit = {"instance": exporters.instance(cluster.culprit.node),
               "rank": str(cluster.culprit.rank)}
    try:
        prom.wait_ready()
        exporters.play(cluster)
        deadline = time.time() + onset_s + timeout_s
        last_reading = 0.0
        while time.time() < deadline:
            now = time.time()
            if now - last_reading >= interval_s:
                readings.take(prom)
                last_reading = now
            alerts = prom.alerts()
            tau = now - exporters.t0 - onset_s
            for a in alerts:
                name, place = a["labels"]["alertname"], _place(a)
                expected = [{k: v for k, v in labels.items() if k in RANKED}
                            for labels in want.get(name, [])]
                if a["state"] == "firing" and name not in fired and place in expected:
                    fired[name] = tau
                elsewhere = not all(culprit.get(k, v) == v for k, v in place.items())
                if elsewhere and a["state"] != "firing":
                    # e.g. while the fault's first scrapes come in, ranks on nodes not
                    # yet scraped since look behind: `for:` is what keeps that quiet
                    when = "after the fault" if tau >= 0 else "before the fault"
                    transient.setdefault((name, when), set()).add(tuple(sorted(place.items())))
                elif elsewhere or (not place and name not in want and a["state"] == "firing"):
                    wrong.append((round(tau, 1), a["state"], name, a["labels"]))
            if set(main) <= set(fired):
                break
            time.sleep(2)
        readings.take(prom)
        per_node = prom.query(f'scrape_samples_scraped{{job="{sim.SCRAPE_JOB}"}}')
        per_node = [float(s["value"][1]) for s in per_node if float(s["value"][1]) > 0]
        durations = prom.query(f'scrape_duration_seconds{{job="{sim.SCRAPE_JOB}"}}')
        durations = [float(s["value"][1]) for s in durations]
        return {"scenario": scenario, "onset": onset_s, "culprit": cluster.culprit, "main": sorted(main),
                "fired": fired, "wrong": wrong, "transient": transient, "readings": readings,
                "per_node": per_node,
                "scrape_s": durations}
    finally:
        exporters.play(None)  # every node answers 503 until the next scenario
        prom.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def prometheus_run(nodes: int, rpn: int, interval_s: int, onset_s: float, timeout_s: float,
                   scenarios) -> bool:
    binary = shutil.which("prometheus")
    if binary is None:
        print("prometheus is not installed (Debian: apt install prometheus)")
        return False
    exporters = Exporters(nodes)
    exporters.start()
    ok = True
    try:
        print(f"Prometheus scraping {nodes} simulated daemons x {rpn} ranks every {interval_s} s "
              f"(evaluation every {interval_s} s), a fresh one per scenario")
        for scenario in scenarios:
            onset = onset_s if onset_s is not None else 150.0 if scenario == "straggler" else 30.0
            out = prometheus_scenario(binary, exporters, scenario, nodes, rpn, interval_s,
                                      onset, timeout_s)
            ok &= report(out, exporters)
    finally:
        exporters.stop()
    return ok


def _mib(values: list[float]) -> str:
    return f"{max(values) / 2**20:.0f} MiB" if values else "?"


def _ms(values: list[float]) -> str:
    if not values:
        return "?"
    return f"median {statistics.median(values) * 1e3:.0f} ms, max {max(values) * 1e3:.0f} ms"


def report(out: dict, exporters: Exporters) -> bool:
    c, r = out["culprit"], out["readings"]
    missing = [name for name in out["main"] if name not in out["fired"]]
    ok = not missing and not out["wrong"]
    fired = ", ".join(f"{name} after {tau:.0f} s" for name, tau in sorted(
        out["fired"].items(), key=lambda kv: kv[1]))
    print(f"\n{out['scenario']} (fault {out['onset']:.0f} s after the start): culprit rank "
          f"{c.rank} on node {c.node} "
          f"({exporters.instance(c.node)}): {'PASS' if ok else 'FAIL'}")
    print(f"  fired, from the fault: {fired or 'nothing'}")
    if missing:
        print(f"  never fired: {', '.join(missing)}")
    for wrong in out["wrong"][:10]:
        print(f"  fires for another place: {wrong}")
    for (name, when), places in sorted(out["transient"].items()):
        print(f"  pending for another place {when}, never firing: {name} for {len(places)} "
              f"ranks or nodes")
    per_node = out["per_node"]
    if per_node:
        print(f"  series per node {statistics.median(per_node):.0f} (min {min(per_node):.0f}, "
              f"max {max(per_node):.0f}), scraped in all {sum(per_node):.0f}; head series "
              f"{max(r.head or [0]):.0f}")
    for group, values in sorted(r.groups.items()):
        print(f"  rule group {group}: {_ms(values)} per evaluation ({len(values)} readings)")
    print(f"  prometheus resident memory: max {_mib(r.rss)} (last {_mib(r.rss[-1:])})")
    if out["scrape_s"]:
        print(f"  scrape duration {_ms(out['scrape_s'])}; exporters rendered "
              f"{exporters.renders} scrapes, {exporters.render_s / max(exporters.renders, 1) * 1e3:.1f} ms each")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--ranks", type=int, default=8, help="ranks per node")
    ap.add_argument("--only", choices=("promtool", "prometheus"))
    ap.add_argument("--promtool-nodes", type=int, default=PROMTOOL_NODES,
                    help="nodes for the promtool judge (default %(default)s: promtool's test "
                         "engine refuses a query over 10 000 samples)")
    ap.add_argument("--scenarios", default=",".join(sim.SCENARIOS))
    ap.add_argument("--interval", type=int, default=5, help="scrape and evaluation interval, s")
    ap.add_argument("--onset", type=float, default=None,
                    help="healthy seconds before the fault (default: 30, and 150 for the "
                         "straggler, whose rules need their 2m windows filled)")
    ap.add_argument("--timeout", type=float, default=360.0,
                    help="seconds after the fault to wait for a scenario's alerts")
    args = ap.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    # SIGTERM ends the run through the finally blocks (Prometheus stopped, temp dirs gone)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ok = True
    if args.only in (None, "promtool"):
        if shutil.which("promtool") is None:
            print("promtool is not installed (Debian: apt install prometheus)")
            ok = False
        else:
            ok &= promtool_run(min(args.nodes, args.promtool_nodes), args.ranks)
    if args.only in (None, "prometheus"):
        ok &= prometheus_run(args.nodes, args.ranks, args.interval, args.onset, args.timeout,
                             scenarios)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
