"""How often a 2-rank job aborts at exit right after its last collective, with
ddpwatch and without it.

Each run is tests/jobs/exit_after_async.py under torchrun: a few all-reduces
(async and each waited on, sync, or DDP's), then the end of the script. A run aborted if a rank printed
"terminate called" (torch 2.13's exit race, callbacks.py explains it).

    python benchmarks/exit_aborts.py [--runs N] [--mode async|sync|ddp]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(REPO, "tests", "jobs", "exit_after_async.py")


def aborted(mode: str, plain: bool, env: dict) -> bool:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           JOB, mode] + (["--plain"] if plain else [])
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    said = out.stdout + out.stderr
    if "terminate called" in said:
        return True
    if out.returncode != 0:
        sys.exit(f"exit_aborts: the job failed otherwise:\n{said[-3000:]}")
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per arm (default 10)")
    parser.add_argument("--mode", choices=("async", "sync", "ddp"), default="async")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as hb:
        env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", DDPWATCH_DIR=hb)
        counts = {False: 0, True: 0}
        for _ in range(args.runs):  # the arms alternate, so both see the same machine
            for plain in (False, True):
                counts[plain] += aborted(args.mode, plain, env)
    print(f"runs that aborted at exit ({args.mode} work, 2 Gloo ranks): with ddpwatch "
          f"{counts[False]} of {args.runs}, without {counts[True]} of {args.runs}")


if __name__ == "__main__":
    main()
