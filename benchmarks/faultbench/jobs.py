"""A real job of the benchmark: started in a session of its own with a tag in its
environment, its ranks found, and everything it started killed on close
(torchrun puts each worker in a session of its own and a worker whose launcher
died is re-parented: the tag finds them all, as tests/conftest.py `Job` and
benchmarks/soak.py `Proc` do)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

from common import tagged_pids

from .catalogue import HERE

REPO = os.path.dirname(HERE)
TAG = "DDPWATCH_FAULTBENCH_PROC"
# what each kind of job prints once a rank is up: rank -> pid
ANNOUNCE = {
    # tests/jobs/thirdparty/faults.py announce()
    "thirdparty": re.compile(r"thirdparty: rank=(\d+) local_rank=\d+ world=\d+ pid=(\d+)"),
    # tests/jobs/plain_ddp.py and tests/jobs/pausesites.py
    "ready": re.compile(r"rank (\d+) pid (\d+) ready"),
}


# what each kind of job prints once a rank has trained a step: rank
TRAINS = {
    "thirdparty": re.compile(r"thirdparty: rank=(\d+) step=\d+ trains"),
    "ready": re.compile(r"rank (\d+) step \d+"),
    "env": re.compile(r"\[rank (\d+)\] step \d+/"),  # trainer/train.py's step lines
}


def tagged(tag: str) -> list[int]:
    return tagged_pids(TAG, tag)


def _environ(pid: int) -> dict:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(i.decode("utf-8", "replace").split("=", 1) for i in items if b"=" in i)


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def expand(argv, env: dict, port: int, workdir: str, logport: int = 0
           ) -> tuple[list[str], dict]:
    """The catalogue's placeholders filled in: {python} {bin} {repo} {port} {dir}
    {logport} (the run's metrics server, faultbench/logserver.py)."""
    values = {"python": sys.executable, "bin": os.path.dirname(sys.executable),
              "repo": REPO, "port": str(port), "dir": workdir, "logport": str(logport)}

    def fill(text):
        return str(text).format(**values)
    return [fill(a) for a in argv], {k: fill(v) for k, v in env.items()}


class Job:
    def __init__(self, argv, env: dict, log_path: str, announce: str, heartbeats: bool,
                 hb_dir: str):
        full = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=REPO,
                    DDPWATCH_DIR=hb_dir, **env)
        full.pop("DDPWATCH_AUTO", None)
        if heartbeats:  # what a user types: ddpwatch exec -- <their launch command>
            argv = [sys.executable, "-m", "ddpwatch", "exec", "--", *argv]
        self.tag = uuid.uuid4().hex
        self.argv = list(argv)
        self.announce = announce
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.argv, env=dict(full, **{TAG: self.tag}),
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     cwd=REPO)

    @property
    def launcher_pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def pids(self) -> list[int]:
        return tagged(self.tag)

    def ranks(self) -> dict[int, int]:
        """rank -> pid: from the lines the ranks print, or (announce: env) from the
        RANK in the environment of torchrun's workers."""
        if self.announce in ANNOUNCE:
            return {int(r): int(p) for r, p in ANNOUNCE[self.announce].findall(self.output())}
        found = {}
        for pid in self.pids():
            env = _environ(pid)
            cmd = _cmdline(pid)
            if "RANK" in env and "torch.distributed.run" not in cmd and not any(
                    os.path.basename(a) in ("torchrun", "accelerate") for a in cmd[:2]):
                found[int(env["RANK"])] = pid
        return found

    def trained(self, nranks: int) -> bool:
        """Every rank printed that it trained a step."""
        seen = {int(r) for r in TRAINS[self.announce].findall(self.output())}
        return seen >= set(range(nranks))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            left = self.pids()
            if not left:
                break
            for sig in (signal.SIGCONT, signal.SIGKILL):  # a stopped one must not linger
                for pid in left:
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
            time.sleep(0.1)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()


def missing(needs) -> str:
    """Why a run cannot run here ('' when it can): a Python package or a command."""
    for need in needs:
        if need.startswith("cmd:"):
            if shutil.which(need[4:]) is None:
                return f"{need[4:]} is not installed"
            continue
        if need == "root":
            if os.geteuid() != 0:
                return "needs root"
            continue
        try:
            __import__(need)
        except ImportError:
            return f"the {need} package is not installed"
    return ""
