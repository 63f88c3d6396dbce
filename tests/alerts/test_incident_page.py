"""The incident page of a real incident: `ddpwatch run` watching a 2-rank
trainer job whose rank 1 is SIGSTOPped. The page is opened from a copy of the
bundle (a laptop with no network) in headless Chromium, behind a recording
proxy that must see nothing; a screenshot is kept as a test artifact; the DOM
must show every rank's row, the culprit and the last collectives. A healthy
job has no incident page; once SIGCONT lets the job on, the page says when and
how the incident resolved."""
from __future__ import annotations

import os
import shutil
import signal
import sys

import html5lib

from conftest import need, wait_until
from daemons import DaemonRun, get, our_status, rank_pid, trainer_job
from pages import (CHROMIUM, NS, RecordingProxy, artifacts_dir, chromium, external_refs, parse,
                   png_size)
from ddpwatch.publish.page_list import incident_path

EXTERNAL = "https://ddpwatch.example/node1"


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
