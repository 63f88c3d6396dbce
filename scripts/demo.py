"""The demo: the bundled trainer on 2 CPU ranks with a fault injected, watched by ddpwatch.

1. starts `torchrun --nproc_per_node=2 -m trainer` with rank 1 set to hang outside
   any collective at step 15 (it sleeps, as a rank stuck in I/O or a lock would);
2. shows the ranks' live progress from their heartbeats (`ddpwatch ranks`);
3. once a rank has sat in a collective for a few seconds, runs `ddpwatch diagnose`,
   which names the culprit with evidence and a remedy;
4. stops the job. Exit status 0 when the culprit named is rank 1.

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
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "trainer",
           "--steps=0", "--device-type=cpu", f"--fault={args.fault}"]
    print(f"$ {' '.join(cmd[2:])}\n  (trainer log: {log.name})\n")
    job = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        return watch(job, env, args)
    finally:
        job.send_signal(signal.SIGTERM)  # torchrun tears its workers down on SIGTERM
        try:
            job.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
        log.close()


def watch(job, env, args) -> int:
    deadline = time.monotonic() + args.timeout
    stalled_since = None
    while time.monotonic() < deadline:
        if job.poll() is not None:
            print(f"the job ended (exit {job.returncode}) before a stall was seen")
            return 1
        out = ddpwatch("ranks", "--json", env=env)
        ranks = json.loads(out.stdout)["ranks"] if out.returncode == 0 else []
        if ranks:
            print("  ".join(f"rank {r['rank']}: step {r['step']:>3} seq {r['collective_seq']:>4} "
                            f"{r['op']:<22} {r['in_collective_s']:5.1f}s in op" for r in ranks))
        stuck = max((r["in_collective_s"] for r in ranks), default=0.0)
        if stuck > 3.0:
            stalled_since = stalled_since or time.monotonic()
            break
        time.sleep(1.0)
    else:
        print("no stall seen before the time-out")
        return 1
    print("\nA rank has waited in a collective for over 3 s. Gloo would wait 30 minutes;")
    print(f"ddpwatch names the culprit now:\n\n$ ddpwatch diagnose {job.pid}")
    started = time.monotonic()
    report = ddpwatch("diagnose", str(job.pid), env=env)
    print(report.stdout + report.stderr)
    as_json = ddpwatch("diagnose", "--json", str(job.pid), env=env)
    culprits = json.loads(as_json.stdout)["job"]["culprits"] if as_json.stdout else []
    print(f"(diagnose took {time.monotonic() - started:.1f}s; culprits: {culprits})")
    return 0 if culprits == [args.expect_culprit] else 1


if __name__ == "__main__":
    sys.exit(main())
