"""The demo: the bundled trainer on 2 CPU ranks with a fault injected, watched by ddpwatch.

1. starts the daemon, `ddpwatch run`, on a free port;
2. starts `torchrun --nproc_per_node=2 -m trainer` with rank 1 set to hang outside
   any collective at step 15 (it sleeps, as a rank stuck in I/O or a lock would);
3. shows the ranks' live progress from their heartbeats (`ddpwatch ranks`) until
   the daemon's /status names a culprit, then prints `ddpwatch status` and the
   one-shot `ddpwatch diagnose` report with evidence and remedy;
4. stops the job and the daemon. Exit status 0 when the culprit named is rank 1.

    python scripts/demo.py [--fault SPEC] [--expect-culprit N]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddpwatch(*args: str, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddpwatch", *args], env=env, text=True,
                          capture_output=True, timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description="ddpwatch demo")
    parser.add_argument("--fault", default="hang:rank=1:step=15")
    parser.add_argument("--expect-culprit", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    hb_dir = tempfile.mkdtemp(prefix="ddpwatch-demo-")
    env = dict(os.environ, DDPWATCH_DIR=hb_dir, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    log = open(os.path.join(hb_dir, "trainer.log"), "w")
    daemon_log = open(os.path.join(hb_dir, "daemon.log"), "w")
    port = free_port()
    config = os.path.join(hb_dir, "config.yaml")
    with open(config, "w") as f:
        json.dump({"listen": f"127.0.0.1:{port}", "state_dir": os.path.join(hb_dir, "state")}, f)
    print(f"$ ddpwatch run --listen 127.0.0.1:{port}   (log: {daemon_log.name})")
    daemon = subprocess.Popen([sys.executable, "-m", "ddpwatch", "run", "--config", config],
                              env=env, cwd=REPO, stdout=daemon_log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    env["DDPWATCH_URL"] = f"http://127.0.0.1:{port}"
    env["DDPWATCH_LOG"] = daemon_log.name
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "trainer",
           "--steps=0", "--device-type=cpu", f"--fault={args.fault}"]
    print(f"$ {' '.join(cmd[2:])}\n  (trainer log: {log.name})\n")
    job = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        return watch(job, daemon, env, args)
    finally:
        for proc in (job, daemon):  # torchrun tears its workers down on SIGTERM
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        daemon_log.close()


def daemon_status(env) -> dict | None:
    try:
        with urllib.request.urlopen(env["DDPWATCH_URL"] + "/status", timeout=5) as r:
            return json.load(r)
    except OSError:
        return None


def watch(job, daemon, env, args) -> int:
    deadline = time.monotonic() + args.timeout
    stall_seen = None
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            print(f"the daemon exited ({daemon.returncode}); its log: {env['DDPWATCH_LOG']}")
            return 1
        if job.poll() is not None:
            print(f"the job ended (exit {job.returncode}) before the daemon named a culprit")
            return 1
        out = ddpwatch("ranks", "--json", env=env)
        ranks = json.loads(out.stdout)["ranks"] if out.returncode == 0 else []
        if ranks:
            print("  ".join(f"rank {r['rank']}: step {r['step']:>3} seq {r['collective_seq']:>4} "
                            f"{r['op']:<22} {r['in_collective_s']:5.1f}s in op" for r in ranks))
        if stall_seen is None and max((r["in_collective_s"] for r in ranks), default=0) > 0.5:
            stall_seen = time.monotonic()
        status = daemon_status(env)
        if status and status["job"]["culprits"]:
            break
        time.sleep(1.0)
    else:
        print("the daemon named no culprit before the time-out")
        return 1
    waited = f"{time.monotonic() - stall_seen:.0f} s after the stall" if stall_seen else "now"
    print(f"\nGloo would wait 30 minutes; the daemon named the culprit {waited}:\n")
    print(f"$ ddpwatch status --url {env['DDPWATCH_URL']}")
    table = ddpwatch("status", "--url", env["DDPWATCH_URL"], env=env)
    print(table.stdout + table.stderr)
    print(f"$ ddpwatch diagnose {job.pid}")
    report = ddpwatch("diagnose", str(job.pid), env=env)
    print(report.stdout + report.stderr)
    culprits = status["job"]["culprits"]
    return 0 if culprits == [args.expect_culprit] else 1


if __name__ == "__main__":
    sys.exit(main())
