"""The incident page of a real incident: `ddpwatch run` watching a 2-rank
trainer job whose rank 1 is SIGSTOPped. The page is opened from a copy of the
bundle (a laptop with no network) in headless Chromium, behind a recording
proxy that must see nothing; a screenshot is kept as a test artifact; the DOM
must show every rank's row, the culprit and the last collectives. A healthy
job has no incident page; once SIGCONT lets the job on, the page says when and
how the incident resolved."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse

import html5lib

from conftest import REPO, need, wait_until
from daemons import DaemonRun, get, our_status, rank_pid, trainer_job
from test_incident_page_unit import NS, external_refs, parse
from ddpwatch.publish.page_list import incident_path

EXTERNAL = "https://ddpwatch.example/node1"
CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--disable-default-apps", "--hide-scrollbars",
                  "--disable-extensions", "--no-default-browser-check")


def artifacts_dir() -> str:
    path = os.environ.get("DDPWATCH_ARTIFACTS") or os.path.join(REPO, "test-artifacts")
    os.makedirs(path, exist_ok=True)
    return path


class RecordingProxy:
    """Chromium's only way out (--proxy-server, loopback included): every
    connection it opens is recorded with its first line (CONNECT host:443, GET
    http://...) and refused an answer."""

    def __init__(self):
        self.seen: list[str] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._record, args=(conn,), daemon=True).start()

    def _record(self, conn):
        with conn:
            conn.settimeout(5)
            try:
                first = conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
            except OSError:
                first = ""
            # A connection closed before a byte was sent asked for nothing (Chromium
            # preconnects, and closes what it preconnected when it exits).
            if first:
                self.seen.append(first)

    def close(self):
        self.sock.close()


def chromium(start_job, tmp_path, proxy, url: str, *mode: str, out: str | None = None) -> list:
    """One headless Chromium run (its own process group, killed at teardown).
    Returns the requests it made off the machine that the page made: see
    page_requests."""
    netlog = str(tmp_path / f"netlog-{time.monotonic_ns()}.json")
    argv = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}",
            f"--proxy-server=http://127.0.0.1:{proxy.port}", "--proxy-bypass-list=<-loopback>",
            f"--log-net-log={netlog}", *mode, url]
    if out:  # --dump-dom writes the DOM to stdout; the job log keeps stderr
        argv = ["bash", "-c", 'exec "$@" >"$0"', out, *argv]
    before = len(proxy.seen)
    job = start_job(argv, name="chromium")
    code = job.wait(timeout=180)
    assert code == 0, job.output()[-3000:]
    return page_requests(netlog, proxy.seen[before:])


def page_requests(netlog: str, proxied: list[str]) -> list:
    """What the page asked the network for. Chromium itself phones home whatever
    the flags say (component updater, network time, accounts: seen here with
    --disable-background-networking --disable-component-update); its NetLog
    tells them apart: the browser's own requests have no initiator ("not an
    origin"), a page's carry the page's origin. Every request the proxy saw must
    be one of the browser's own, and no request may come from the page."""
    with open(netlog) as f:
        log = json.load(f)
    names = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    starts = [e["params"] for e in log["events"]
              if names.get(e["type"]) == "URL_REQUEST_START_JOB" and "url" in e.get("params", {})]
    from_page = [p["url"] for p in starts if not p["url"].startswith("file:")
                 and p.get("initiator") != "not an origin"]
    own_hosts = {urllib.parse.urlsplit(p["url"]).hostname for p in starts
                 if p.get("initiator") == "not an origin"}
    unexplained = [line for line in proxied if _proxied_host(line) not in own_hosts]
    return from_page + unexplained


def _proxied_host(line: str) -> str | None:
    """The host of a proxy request line: CONNECT host:443 / GET http://host/..."""
    method, _, rest = line.partition(" ")
    target = rest.split(" ", 1)[0]
    if method == "CONNECT":
        return target.rsplit(":", 1)[0].strip("[]")
    return urllib.parse.urlsplit(target).hostname


def png_size(path: str) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def our_incident(daemon, key):
    return next((i for i in daemon.status()["incidents"] if i["job"] == key), None)


def test_real_incident_page_in_headless_chromium(start_job, tmp_path, hb_dir, receivers):
    need(CHROMIUM is not None, "Debian package chromium (dev.sh DEBIAN_PACKAGES)")
    hook = receivers()
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {
        "webhooks": [{"type": "generic", "url": hook.url}], "resolve_after_s": 2,
        "external_url": EXTERNAL})
    trainer = trainer_job(start_job)
    # healthy, and far enough that the rings hold collectives to draw (past warm-up)
    healthy = wait_until(lambda: (lambda s: s if len(s["ranks"]) == 2 and s["job"]["verdict"] ==
                                  "healthy" and all(
                                      (r["signals"].get("hb_step") or 0) >= 4 and
                                      (r["signals"].get("hb_seq") or 0) >= 12
                                      for r in s["ranks"]) else None)(
        our_status(daemon, trainer)), 240, what="healthy job past its first steps")
    key = healthy["key"]
    # A healthy job has no incident page: still healthy three ticks later, nothing listed.
    tick = daemon.status()["tick"]
    wait_until(lambda: daemon.status()["tick"] >= tick + 3, 60, what="three more ticks")
    # resumed, a rank catching up is at most `slowing` (calm: watch/slow.py)
    assert our_status(daemon, trainer)["job"]["verdict"] in ("healthy", "warming_up", "slowing")
    assert our_incident(daemon, key) is None
    code, listing = get(daemon.url + "/incidents/")
    assert code == 200 and key not in listing.decode()
    assert not os.path.isdir(os.path.join(daemon.state_dir, "incidents")) or not any(
        key in name for name in os.listdir(os.path.join(daemon.state_dir, "incidents")))

    os.kill(rank_pid(healthy, 1), signal.SIGSTOP)
    # the bundle's page once it names rank 1 (a first draft may name both ranks)
    incident = wait_until(lambda: (lambda i: i if i and i["culprits"] == [1] and i["bundle"]
                                   and os.path.exists(os.path.join(i["bundle"], "report.html"))
                                   else None)(our_incident(daemon, key)), 90,
                          what="the incident's bundle naming rank 1")
    page_path = os.path.join(incident["bundle"], "report.html")
    wait_until(lambda: 'data-culprits="1"' in open(page_path).read(), 30, what="page of rank 1")
    laptop = tmp_path / "laptop-bundle"  # the bundle as someone copies it off the node
    shutil.copytree(incident["bundle"], laptop)
    html = (laptop / "report.html").read_text()
    html5lib.HTMLParser(strict=True).parse(html)  # valid HTML: any parse error raises
    assert external_refs(html) == []

    # served by the daemon too, with the same drawing
    code, served = get(daemon.url + incident_path(incident["id"]))
    assert code == 200 and 'data-culprits="1"' in served.decode()
    code, listing = get(daemon.url + "/incidents/")
    assert incident_path(incident["id"]) in listing.decode()
    # the webhook links to the page, at the external URL
    firing = wait_until(lambda: [b for b in hook.bodies() if b["status"] == "firing"
                                 and b["job"] == key], 30, what="firing webhook")
    assert firing[-1]["incident_url"] == EXTERNAL + incident_path(incident["id"])

    proxy = RecordingProxy()
    try:
        # The check can fail: a page with one remote image is caught.
        bad = tmp_path / "remote-image.html"
        bad.write_text('<!DOCTYPE html><html lang="en"><head><title>t</title></head><body>'
                       '<img alt="" src="http://page-request.invalid/x.png"></body></html>')
        caught = chromium(start_job, tmp_path, proxy, bad.as_uri(), "--dump-dom",
                          out=str(tmp_path / "bad-dom.html"))
        assert "http://page-request.invalid/x.png" in caught, (caught, proxy.seen)
        shot = os.path.join(artifacts_dir(), "incident-page-stopped-rank.png")
        url = (laptop / "report.html").as_uri()
        made = chromium(start_job, tmp_path, proxy, url, "--window-size=1280,2400",
                        f"--screenshot={shot}")
        print(f"\nscreenshot of the incident page: {shot}")
        assert png_size(shot) == (1280, 2400) and os.path.getsize(shot) > 50_000
        dom_path = str(tmp_path / "dom.html")
        made += chromium(start_job, tmp_path, proxy, url, "--dump-dom", out=dom_path)
        assert made == [], f"the page made external requests: {made} (proxy saw {proxy.seen})"
    finally:
        proxy.close()
    dom = html5lib.HTMLParser(namespaceHTMLElements=True).parse(open(dom_path).read())
    banner = dom.find(".//h:header[@id='verdict']", NS)
    assert banner is not None, "Chromium's DOM has no verdict banner"
    assert banner.get("data-culprits") == "1" and banner.get("data-verdict") == "stopped"
    culprit = "".join(dom.find(".//h:div[@id='culprit']", NS).itertext())
    assert culprit.startswith("culprit: rank 1 (pid ")
    rows = {g.get("data-rank"): g.get("class") for g in dom.iter(f"{{{NS['s']}}}g")
            if "rank-row" in (g.get("class") or "")}
    assert rows == {"0": "rank-row", "1": "rank-row culprit"}
    table = {tr.get("data-rank") for tr in
             dom.findall(".//h:table[@class='ranks']/h:tbody/h:tr", NS)}
    assert table == {"0", "1"}
    drawn = [(g.get("data-rank"), int(g.get("data-seq"))) for g in dom.iter(f"{{{NS['s']}}}g")
             if g.get("class") == "collective"]
    # both ranks' last collectives, from their rings, up to the one before the stall
    for rank in ("0", "1"):
        assert len([s for r, s in drawn if r == rank]) >= 4, drawn
    last_seq = max(s for r, s in drawn if r == "1")
    assert (("0", last_seq) in drawn and
            dom.find(f".//h:table[@class='lateness']/h:tbody/h:tr[@data-seq='{last_seq}']", NS)
            is not None)

    # SIGCONT: the incident resolves, and its page says when and how
    os.kill(rank_pid(healthy, 1), signal.SIGCONT)
    resolved = wait_until(lambda: (lambda i: i if i and i["state"] == "resolved" else None)(
        our_incident(daemon, key)), 90, what="resolved incident")
    page_path = os.path.join(resolved["bundle"], "report.html")
    wait_until(lambda: 'data-state="resolved"' in open(page_path).read(), 30,
               what="the page rewritten on resolve")
    tree = parse(open(page_path).read())
    (text,) = ["".join(e.itertext()) for e in tree.findall(".//h:div[@id='resolution']", NS)]
    # how: the job's verdict while it calmed (healthy, most likely; it is not gone)
    assert text.startswith("Resolved ") and resolved["resolution"] in text, text
    assert resolved["resolution"].startswith(("the job was judged ", "the job could not")), text
