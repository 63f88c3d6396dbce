"""The incident page as a reader's browser sees it: parsed strictly (html5lib),
every reference that would fetch something off the page, and the page opened in
headless Chromium behind a proxy that records any request leaving the machine
(tests/alerts, tests/daemon, tests/unit/publish)."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import struct
import threading
import time
import urllib.parse

import html5lib

from conftest import REPO

NS = {"h": "http://www.w3.org/1999/xhtml", "s": "http://www.w3.org/2000/svg"}


def parse(html: str):
    """Strict HTML5 parsing: any parse error (bad nesting, stray tag) raises."""
    return html5lib.HTMLParser(strict=True, namespaceHTMLElements=True).parse(html)


def external_refs(html: str) -> list[str]:
    """Every reference in the markup that would make a browser fetch something
    off the page: any URL-bearing attribute that is not a fragment or a relative
    path, and url()/@import in styles (attributes and <style>)."""
    tree = parse(html)
    refs = []
    for el in tree.iter():
        for name, value in el.attrib.items():
            local = name.rsplit("}", 1)[-1].lower()
            if local in ("src", "href", "action", "poster", "data", "srcset", "formaction",
                         "background", "manifest", "ping"):
                if re.match(r"\s*([a-z][a-z0-9+.-]*:|//)", value, re.I):
                    refs.append(value)
            if local == "style" and re.search(r"url\(|@import", value, re.I):
                refs.append(value)
        if str(el.tag).endswith("}style") and re.search(r"url\(|@import", el.text or "", re.I):
            refs.append(el.text)
    return refs


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
