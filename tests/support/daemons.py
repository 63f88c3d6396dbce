"""A real `ddpwatch run` for the tests that watch with it (tests/daemon, tests/hostile,
tests/alerts, ...): DaemonRun starts one on loopback with its own config and state
directory, `get` asks it, and /status is read for the test's own job."""
from __future__ import annotations

import http.client
import json
import sys
import urllib.error
import urllib.request

from conftest import free_port, trainer, wait_until


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, OSError, http.client.HTTPException):  # refused, reset, cut
        return 0, b""


class DaemonRun:
    def __init__(self, start_job, tmp_path, hb_dir, config: dict, name="daemon", env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = tmp_path / f"{name}.yaml"
        self.state_dir = str(tmp_path / "state")
        self.write(config)
        self.start_job, self.name = start_job, name
        self.start(env)

    def write(self, config: dict) -> None:
        full = {"listen": f"127.0.0.1:{self.port}", "state_dir": self.state_dir,
                "heartbeat_dir": "", **config}
        self.config_path.write_text(json.dumps(full))  # JSON is YAML

    def start(self, env=None):
        self.job = self.start_job([sys.executable, "-m", "ddpwatch", "run", "--config",
                                   str(self.config_path)], env=env, name=self.name)
        wait_until(lambda: get(self.url + "/readyz")[0] == 200, 60, what="daemon ready")

    def status(self, token=None) -> dict:
        code, body = get(self.url + "/status", token)
        assert code == 200, (code, body)
        return json.loads(body)

    def metrics(self) -> str:
        return get(self.url + "/metrics")[1].decode()


def trainer_job(start_job, *faults):
    return start_job(trainer(*[f"--fault={f}" for f in faults]), name="trainer")


def rank_pid(status: dict, rank: int) -> int:
    return next(r["pid"] for r in status["ranks"] if r["rank"] == rank)


def ours(status: dict, trainer) -> dict:
    """This test's job in /status (the daemon sees every job on the node)."""
    pids = {p.pid for p in trainer.processes()}
    for job in status["jobs"]:
        if job["job"]["launcher_pid"] in pids or {r["pid"] for r in job["ranks"]} & pids:
            return job
    return {"job": {"verdict": "none", "culprits": []}, "ranks": []}


def our_status(daemon, trainer) -> dict:
    return ours(daemon.status(), trainer)


def with_heartbeats(status: dict, count: int = 2):
    """The job once `count` ranks are seen and each has written its record."""
    ranks = status["ranks"]
    return status if len(ranks) == count and all(
        r["signals"].get("hb_step") is not None for r in ranks) else None
