"""What `ddpwatch exec` costs an unmodified trainer: tokens/s under exec / plain,
target >= 0.99. Two figures, each taken within this one run:

1. The trainer's step in blocks taking turns inside 2-rank jobs started under
   `ddpwatch exec` (benchmarks/exec_blocks.py: everything exec installed, on and
   off, and off again as the control), in several jobs, with a 90% bootstrap
   interval over jobs and rounds. This resolves 1%; separate runs do not.
2. Whole runs of the bundled trainer with --no-ddpwatch (so it never calls
   ddpwatch: an unmodified script) under `ddpwatch exec -- torchrun ...` and plain
   `torchrun ...`, with a second plain arm as the control, in rounds that cycle
   through every order of the three arms (benchmarks/pairs.py). The end-to-end
   figure, start-up included; its control shows how far run-to-run noise (5-10%
   per run on a 2-core VM) leaves it from resolving 1%.

Records go to a fresh directory under /dev/shm, where they go in production.

    python benchmarks/exec_cost.py [--quick] [--jobs N] [--rounds N] [--runs N] [--steps N]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import blocks  # benchmarks/blocks.py, beside this script
import exec_blocks
from pairs import ratio_summary, run_rounds  # benchmarks/pairs.py

EXEC = [sys.executable, "-m", "ddpwatch", "exec", "--"]


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node=2", *args]


def run(cmd: list[str], env: dict) -> str:
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"benchmark: {' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out.stdout + out.stderr


def in_blocks(env: dict, jobs: int, rounds: int, steps: int) -> None:
    script = os.path.join(REPO, "benchmarks", "exec_blocks.py")
    results = blocks.collect(jobs, lambda out: run(
        [*EXEC, *torchrun(script, str(rounds), str(steps), out)], env))
    figures = exec_blocks.report(results)
    on, control = figures["exec"], figures["control"]
    rate, plain = blocks.tokens_per_s(results, "exec")
    print(f"unmodified trainer step under ddpwatch exec / plain, tokens/s, blocks taking turns "
          f"inside a job: {on[0]:.3f} (90% interval {on[1]:.3f}-{on[2]:.3f}; "
          f"{rate:.0f} vs {plain:.0f} tok/s; {jobs} jobs x "
          f"{rounds} rounds of {steps}-step blocks; {results[0]['heartbeats_per_step']:.1f} "
          f"heartbeats per step; target >= 0.99)")
    print(f"  control, the second plain arm / the first: {control[0]:.3f} "
          f"(90% interval {control[1]:.3f}-{control[2]:.3f}, the noise floor of the line above)")


def tokens_per_s(env: dict, under_exec: bool, steps: int) -> float:
    cmd = torchrun("-m", "trainer", f"--steps={steps}", "--device-type=cpu", "--no-ddpwatch")
    out = run([*EXEC, *cmd] if under_exec else cmd, env)
    rates = [float(m) for m in re.findall(r"\[rank 0\].*tok/s (\d+(?:\.\d+)?)", out)]
    steady = rates[len(rates) // 5:]  # leave out warm-up steps
    if not steady:
        sys.exit(f"benchmark: no per-step tok/s in trainer output:\n{out[-2000:]}")
    return statistics.mean(steady)


def records_written(hb: str) -> int:
    return sum(1 for name in os.listdir(hb) if name.endswith(".hb")) if os.path.isdir(hb) else 0


def in_runs(env: dict, rounds: int, steps: int) -> None:
    before = records_written(env["DDPWATCH_DIR"])
    runs = run_rounds(rounds, {
        "off": lambda: tokens_per_s(env, False, steps),
        "off_again": lambda: tokens_per_s(env, False, steps),
        "exec": lambda: tokens_per_s(env, True, steps)})
    # The arms are what they say: exec runs wrote a record per rank, plain ones none.
    written = records_written(env["DDPWATCH_DIR"]) - before
    if written != 2 * rounds:
        sys.exit(f"benchmark: {written} records for {rounds} exec runs of 2 ranks")
    off, again, on = runs["off"], runs["off_again"], runs["exec"]
    both = [(a + b) / 2 for a, b in zip(off, again)]
    print(f"unmodified trainer, whole runs, tokens/s under ddpwatch exec / plain: "
          f"{ratio_summary(both, on)}{statistics.mean(on):.0f} vs {statistics.mean(both):.0f} "
          f"tok/s; {rounds} rounds of {steps}-step runs)")
    print(f"  control, the second plain arm / the first: {ratio_summary(off, again)}"
          f"the noise floor of the line above)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, not a measurement")
    parser.add_argument("--jobs", type=int, help="2-rank jobs of blocks (default 4, quick 1)")
    parser.add_argument("--rounds", type=int, help="rounds of blocks per job (default 48, "
                        "every order of the three arms 8 times; quick 6)")
    parser.add_argument("--runs", type=int, help="rounds of whole runs (default 12; quick 1; "
                        "0 skips them)")
    parser.add_argument("--steps", type=int, help="steps per whole run (default 100, quick 20)")
    args = parser.parse_args()
    quick = args.quick
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPWATCH")}
    env.update(PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as hb:
        env["DDPWATCH_DIR"] = hb
        in_blocks(env, args.jobs or (1 if quick else 4), args.rounds or (6 if quick else 48),
                  10 if quick else 20)
        rounds = 1 if quick and args.runs is None else 12 if args.runs is None else args.runs
        if rounds:
            in_runs(env, rounds, args.steps or (20 if quick else 100))


if __name__ == "__main__":
    main()
