"""One real `ddpwatch run` for the whole benchmark, with a generic webhook
receiver and /status read every half second (benchmarks/soak.py does the same
for its soak). A scenario that wants other daemon settings gets them by a reload
(SIGHUP), as an operator would."""
from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import threading
import time
import urllib.request

from common import Receiver

from .jobs import Job
from .waiting import free_port, wait_for

# The daemon's settings for the benchmark; a scenario's `daemon:` overrides them.
# resolve_after_s short, so that one scenario's incident is closed before the next.
# uid_incidents and uid_bundles: every job here is one user's, a death every
# minute or so; the daemon's per-user bucket against floods (10 at once, one a
# minute: publish/limits.py Buckets) held the 22nd run's page back (a full run,
# 2026-11-28), which scored the bucket, not the judgement
BASE_CONFIG = {"resolve_after_s": 10, "uid_incidents": 10000, "uid_bundles": 10000}


class Watch:
    def __init__(self, workdir: str):
        self.workdir = workdir
        self.receiver = Receiver()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.hb_dir = os.path.join(workdir, "hb")
        self.config_path = os.path.join(workdir, "ddpwatch.yaml")
        self.base = {"listen": f"127.0.0.1:{self.port}",
                     "state_dir": os.path.join(workdir, "state"), "heartbeat_dir": self.hb_dir,
                     "webhooks": [{"type": "generic", "url": self.receiver.url}], **BASE_CONFIG}
        self.settings: dict = {}
        self._write()
        self.daemon = Job([sys.executable, "-m", "ddpwatch", "run", "--config",
                           self.config_path], {}, os.path.join(workdir, "daemon.log"),
                          announce="", heartbeats=False, hb_dir=self.hb_dir)
        self.readings: list[tuple[float, dict]] = []
        self._done = threading.Event()
        wait_for(lambda: self._get("/readyz") is not None, 60, "the daemon ready",
                 self.daemon.output)
        threading.Thread(target=self._poll, daemon=True).start()

    def _write(self):
        with open(self.config_path + ".new", "w") as f:
            json.dump({**self.base, **self.settings}, f)  # JSON is YAML
        os.replace(self.config_path + ".new", self.config_path)

    def configure(self, settings: dict) -> None:
        """The daemon with the base config and `settings` (a reload when they change)."""
        if settings == self.settings:
            return
        self.settings = dict(settings)
        self._write()
        before = self.daemon.output().count("reloaded ")
        os.kill(self.daemon.proc.pid, signal.SIGHUP)
        wait_for(lambda: self.daemon.output().count("reloaded ") > before, 30, "the reload",
                 self.daemon.output)

    def _get(self, path: str):
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as r:
                return r.read()
        except (OSError, http.client.HTTPException):
            return None

    def _poll(self):
        while not self._done.wait(0.5):
            body = self._get("/status")
            if body:
                try:
                    self.readings.append((time.monotonic(), json.loads(body)))
                except ValueError:
                    continue

    def job_of(self, pids, since: float = 0.0) -> tuple[float, dict] | None:
        """The last /status entry (with its time) of the job holding any of `pids`."""
        for t, status in reversed(self.readings):
            if t < since:
                break
            for job in status.get("jobs", ()):
                if {r.get("pid") for r in job.get("ranks", ())} & set(pids):
                    return t, job
        return None

    def entries(self, key: str, since: float) -> list[tuple[float, dict]]:
        """Every /status entry of job `key` read since `since`."""
        return [(t, job) for t, status in self.readings if t >= since
                for job in status.get("jobs", ()) if job.get("key") == key]

    def close(self):
        self._done.set()
        self.daemon.close()
        self.receiver.close()
