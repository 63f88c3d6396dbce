"""What watching costs a rank. Prints three figures, each taken within this one run:

1. the median cost of one heartbeat (a collective's entry, its exit, and both)
   - target <= 1 us;
2. a loop of 1-element all-reduces on 2 Gloo ranks, instrumented / bare, taken
   in alternating rounds inside one torchrun job - target <= 1.01. The same rounds
   also time the bare loop with 1 us of busy CPU before each call: on a machine
   where two ranks' main and Gloo threads share few cores, that calibrates what
   a microsecond of CPU on the critical path costs the loop;
3. trainer tokens/s instrumented / not (--no-ddpwatch), alternating runs of the
   bundled trainer on 2 CPU ranks (ABBA order, so a drift cancels) - the mean
   of the pairs' ratios with a 90% bootstrap interval - target >= 0.99.

Records go where they go in production: a fresh directory under /dev/shm.

    python benchmarks/heartbeat.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from pairs import ratio_summary, run_pairs  # benchmarks/pairs.py, beside this script


def heartbeat_cost(n: int) -> tuple[float, float, float]:
    from ddpwatch.heartbeat import OP_CODE, open_writer
    with tempfile.TemporaryDirectory() as d:
        w = open_writer(d, rank=0)
        enter, leave, clock = w.enter, w.exit, time.perf_counter_ns
        op = OP_CODE["all_reduce"]
        empty, entries, exits = [], [], []
        for _ in range(n):
            t0 = clock()
            t1 = clock()
            token = enter(op, 4)
            t2 = clock()
            leave(token)
            t3 = clock()
            empty.append(t1 - t0)
            entries.append(t2 - t1)
            exits.append(t3 - t2)
        w.close()
    timer = statistics.median(empty)  # the cost of reading the clock itself
    e, x = statistics.median(entries) - timer, statistics.median(exits) - timer
    both = statistics.median(entries + exits) - timer
    return e / 1e3, x / 1e3, both / 1e3


def allreduce_worker(rounds: int, per_round: int) -> None:
    """Runs on each rank under torchrun: alternate bare, instrumented and
    calibration rounds."""
    import torch
    import torch.distributed as dist

    import ddpwatch
    import ddpwatch.instrumentation  # noqa: F401
    ddpwatch.instrument()
    dist.init_process_group("gloo")
    wrapped = dist.all_reduce
    bare = wrapped.__ddpwatch_original__
    clock = time.perf_counter_ns

    def busy_1us_then_bare(tensor):
        until = clock() + 1000
        while clock() < until:
            pass
        bare(tensor)
    t = torch.ones(1)
    arms = {"bare": bare, "instrumented": wrapped, "busy_1us": busy_1us_then_bare}
    times: dict[str, list[float]] = {name: [] for name in arms}
    names = list(arms)
    for r in range(rounds):
        for name in names[:: 1 if r % 2 else -1]:
            fn = arms[name]
            dist.barrier()
            start = time.perf_counter()
            for _ in range(per_round):
                fn(t)
            times[name].append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        us = {k: sum(v) / (rounds * per_round) * 1e6 for k, v in times.items()}
        print(f"RATIO {ratio_summary(times['bare'], times['instrumented'])}"
              f"{rounds} paired rounds) bare_us={us['bare']:.1f} "
              f"instrumented_us={us['instrumented']:.1f} "
              f"bare+1us_busy_us={us['busy_1us']:.1f}", flush=True)
    dist.destroy_process_group()


def wrapper_cpu_us(n: int) -> float:
    """CPU cost of the instrumented wrapper alone: around a collective that does nothing."""
    import torch

    from ddpwatch import instrumentation as ins
    from ddpwatch.heartbeat import open_writer
    with tempfile.TemporaryDirectory(dir=shm_base()) as d:
        ins._writer = open_writer(d, rank=0)
        def nothing(tensor, op=None, group=None, async_op=False):
            return None
        wrapped, t = ins._wrap("all_reduce", nothing), torch.ones(1)
        best = []
        for fn in (nothing, wrapped, nothing, wrapped):
            start = time.perf_counter()
            for _ in range(n):
                fn(t)
            best.append((time.perf_counter() - start) / n)
        ins._writer.close()
    return (min(best[1], best[3]) - min(best[0], best[2])) * 1e6


def shm_base() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", *args]


def run(cmd: list[str], env: dict) -> str:
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"benchmark: {' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out.stdout


def trainer_tokens_per_s(env: dict, instrumented: bool, steps: int) -> float:
    cmd = torchrun(2, "-m", "trainer", f"--steps={steps}", "--device-type=cpu")
    if not instrumented:
        cmd.append("--no-ddpwatch")
    out = run(cmd, env)
    rates = [float(m) for m in re.findall(r"\[rank 0\].*tok/s (\d+(?:\.\d+)?)", out)]
    steady = rates[len(rates) // 5:]  # leave out warm-up steps
    if not steady:
        sys.exit(f"benchmark: no per-step tok/s in trainer output:\n{out[-2000:]}")
    return statistics.mean(steady)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--pairs", type=int, help="trainer run pairs (default 16, quick 2)")
    parser.add_argument("--worker", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        allreduce_worker(*args.worker)
        return
    quick = args.quick
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(dir=shm_base()) as hb:
        env["DDPWATCH_DIR"] = hb
        enter, leave, both = heartbeat_cost(50_000 if quick else 300_000)
        print(f"heartbeat cost, median: entry {enter:.2f} us, exit {leave:.2f} us, "
              f"any heartbeat {both:.2f} us (target <= 1 us)")
        print(f"instrumented wrapper around a collective, CPU: "
              f"{wrapper_cpu_us(50_000 if quick else 200_000):.2f} us per call (entry + exit "
              f"heartbeats included)")
        rounds, per_round = (6, 500) if quick else (40, 1000)
        out = run(torchrun(2, os.path.abspath(__file__), "--worker", str(rounds), str(per_round)), env)
        line = next(l for l in out.splitlines() if l.startswith("RATIO"))
        print(f"1-element all-reduce loop on 2 Gloo ranks, instrumented / bare: "
              f"{line.removeprefix('RATIO ')}; target <= 1.01")
        pairs, steps = (args.pairs or (2 if quick else 16)), (20 if quick else 100)
        off, on = run_pairs(pairs, lambda: trainer_tokens_per_s(env, False, steps),
                            lambda: trainer_tokens_per_s(env, True, steps))
        print(f"trainer tokens/s on 2 CPU ranks, instrumented / not: {ratio_summary(off, on)}"
              f"{statistics.mean(on):.0f} vs {statistics.mean(off):.0f} tok/s; {pairs} pairs of "
              f"{steps}-step runs; target >= 0.99)")


if __name__ == "__main__":
    main()
