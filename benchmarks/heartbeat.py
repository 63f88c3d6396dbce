"""What watching costs a rank. Prints three figures, each taken within this one run:

1. the median cost of one heartbeat (a collective's entry, its exit, and both),
   for the C core and the pure-Python one - target <= 1 us; and the CPU of the
   whole wrapper around a collective, for both;
2. a loop of 1-element all-reduces on 2 Gloo ranks, instrumented / bare, in
   several torchrun jobs - target <= 1.01. Inside a job the arms take turns
   call by call (see allreduce_worker); a job's figure is the ratio of its
   per-call medians, and the figure printed is the mean over the jobs, with a
   90% bootstrap interval that resamples jobs and blocks of calls inside them
   (report_loop), and the ratio of the means beside it. Three more arms run in
   the same loop: the pure-Python wrapper; the bare call after 1 us of busy CPU,
   which calibrates what a microsecond on the critical path costs this loop
   when two ranks' threads share few cores; and bare called through a C
   pass-through, the floor for any wrapper in C (it must call torch's Python
   function from C, which enters the interpreter afresh);
3. trainer tokens/s instrumented / not - target >= 0.99. First, the trainer's
   step in blocks that take turns inside one 2-rank job (instrumented, not, not
   again: benchmarks/trainer_blocks.py says why and how), in several jobs, with
   a 90% bootstrap interval over jobs and rounds; the two uninstrumented arms'
   ratio is the control, and a fourth arm with torch's own Python all-reduce
   comm hook shows what any Python DDP comm hook costs. Then whole runs of the bundled trainer (`python -m
   trainer`, and with --no-ddpwatch) in rounds of the same three arms
   (benchmarks/pairs.py): the end-to-end figure, whose control shows how far
   this machine's run-to-run noise (5-10% per run) leaves it from resolving 1%.

Records go where they go in production: a fresh directory under /dev/shm.

    python benchmarks/heartbeat.py [--quick] [--only cost|loop|trainer] [--loop-jobs N]
                                   [--trainer-jobs N] [--rounds N] [--pairs N]
                                   [--runs-json FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from pairs import ratio_summary, run_rounds  # benchmarks/pairs.py, beside this script
import blocks  # benchmarks/blocks.py
import trainer_blocks  # benchmarks/trainer_blocks.py


@contextlib.contextmanager
def pure_python(on: bool):
    """Writers opened inside use the pure-Python core (and so get Python wrappers)."""
    old = os.environ.get("DDPWATCH_PURE_PYTHON")
    os.environ["DDPWATCH_PURE_PYTHON"] = "1" if on else ""
    try:
        yield
    finally:
        if old is None:
            del os.environ["DDPWATCH_PURE_PYTHON"]
        else:
            os.environ["DDPWATCH_PURE_PYTHON"] = old


def heartbeat_cost(n: int, python: bool) -> tuple[float, float, float]:
    from ddpwatch.heartbeat import OP_CODE, open_writer
    with tempfile.TemporaryDirectory(dir=shm_base()) as d, pure_python(python):
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


def allreduce_worker(calls: int, blocks: int, out_path: str) -> None:
    """Runs on each rank under torchrun. The arms take turns call by call, in an
    order shuffled afresh every four calls (the same on both ranks), and each
    call is timed from its start to the next call's start, so an arm's exit work
    counts against it. Why so: this loop's speed drifts between modes tens of
    percent apart as the scheduler moves the ranks' threads, and only arms that
    share every mode compare. Why shuffled: a call also waits for the peer's
    exit work of the call before, so every arm must follow every arm equally."""
    import torch
    import torch.distributed as dist

    import ddpwatch
    from ddpwatch.rank import instrumentation as ins
    from ddpwatch.heartbeat import open_writer
    ddpwatch.instrument()
    dist.init_process_group("gloo")
    c_wrapped = dist.all_reduce
    bare = c_wrapped.__ddpwatch_original__
    # The pure-Python reference, writing its own record, for comparison in this run.
    c_writer = ins._writer
    with tempfile.TemporaryDirectory(dir=shm_base()) as d, pure_python(True):
        ins._writer = open_writer(d, rank=dist.get_rank())
        py_wrapped = ins._wrap("all_reduce", bare)
        py_writer, ins._writer = ins._writer, c_writer
    clock = time.perf_counter_ns

    def busy_1us_then_bare(tensor):
        until = clock() + 1000
        while clock() < until:
            pass
        bare(tensor)
    # bare called from C code, as any C wrapper must call it: the floor for one.
    c_passthrough = functools.partial(bare)
    arms = {"bare": bare, "instrumented": c_wrapped, "python": py_wrapped,
            "busy_1us": busy_1us_then_bare, "passthrough": c_passthrough}
    rng, order = random.Random(0), []
    for _ in range(calls // len(arms)):
        cycle = list(arms)
        rng.shuffle(cycle)
        order += cycle
    fns = [arms[name] for name in order]
    t = torch.ones(1)
    stamps = [0] * (len(fns) + 1)
    dist.barrier()
    for i, fn in enumerate(fns):
        stamps[i] = clock()
        fn(t)
    stamps[-1] = clock()
    py_writer.close()
    if dist.get_rank() == 0:
        us = {name: [] for name in arms}
        for i, name in enumerate(order):
            us[name].append((stamps[i + 1] - stamps[i]) / 1e3)
        with open(out_path, "w") as f:
            json.dump(us, f)
    dist.destroy_process_group()


def report_loop(jobs: list[dict[str, list[float]]], blocks: int, draws: int = 400) -> str:
    """Ratios of per-call medians to bare, averaged over the jobs, each with a 90%
    bootstrap interval that resamples jobs and then blocks of calls inside each
    (blocks, not calls: neighbouring calls share a scheduler mode, so they are not
    independent; jobs too: one job's estimate differs from the next one's by more
    than its own interval, so an interval from one job alone is too narrow)."""
    import numpy as np
    arms = [name for name in jobs[0] if name != "bare"]
    split = []  # per job: arm -> (blocks, calls per block)
    for job in jobs:
        n = len(job["bare"]) // blocks
        split.append({name: np.asarray(v[:n * blocks]).reshape(blocks, n) for name, v in job.items()})

    def ratios(picked_jobs, picked_blocks):
        out = {(stat, name): [] for stat in ("median", "mean") for name in arms}
        for j, b in zip(picked_jobs, picked_blocks):
            pooled = {name: split[j][name][b].ravel() for name in split[j]}
            for name in arms:
                out["median", name].append(np.median(pooled[name]) / np.median(pooled["bare"]))
                out["mean", name].append(pooled[name].mean() / pooled["bare"].mean())
        return {key: float(np.mean(v)) for key, v in out.items()}
    everything = list(range(blocks))
    point = ratios(range(len(jobs)), [everything] * len(jobs))
    per_job = [ratios([j], [everything]) for j in range(len(jobs))]
    rng = np.random.default_rng(0)
    boot = {key: [] for key in point}
    for _ in range(draws):
        picked = rng.integers(len(jobs), size=len(jobs))
        drawn = ratios(picked, [rng.integers(blocks, size=blocks) for _ in picked])
        for key, value in drawn.items():
            boot[key].append(value)

    def interval(key):
        low, high = np.percentile(boot[key], [5, 95])
        return f"{low:.3f}-{high:.3f}"

    def summary(name):
        each = ", ".join(f"{r['median', name]:.3f}" for r in per_job)
        return (f"{point['median', name]:.3f} (90% interval {interval(('median', name))} over "
                f"{len(jobs)} jobs x {blocks} blocks; jobs {each}; ratio of means "
                f"{point['mean', name]:.3f}, {interval(('mean', name))})")
    medians = {name: np.mean([np.median(job[name]) for job in jobs]) for name in jobs[0]}
    calls = sum(len(job["bare"]) for job in jobs)
    return (f"{summary('instrumented')}; pure-Python wrapper {summary('python')}; "
            f"bare after 1 us busy CPU {summary('busy_1us')}; bare called through a C "
            f"pass-through (functools.partial) {summary('passthrough')}; per-call medians, mean over jobs: "
            f"bare {medians['bare']:.1f} us, C {medians['instrumented']:.1f} us, Python "
            f"{medians['python']:.1f} us, busy {medians['busy_1us']:.1f} us, pass-through "
            f"{medians['passthrough']:.1f} us; {calls} calls per arm")


def wrapper_cpu_us(n: int, python: bool) -> float:
    """CPU cost of the instrumented wrapper alone: around a collective that does nothing."""
    import torch

    from ddpwatch.rank import instrumentation as ins
    from ddpwatch.heartbeat import open_writer
    with tempfile.TemporaryDirectory(dir=shm_base()) as d, pure_python(python):
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
    parser.add_argument("--trainer-jobs", type=int, help="2-rank jobs of the trainer's step in "
                        "blocks (default 4, quick 1)")
    parser.add_argument("--rounds", type=int, help="rounds of blocks per job (default 48: "
                        "every order of the four arms twice; quick 4)")
    parser.add_argument("--pairs", type=int, help="rounds of whole trainer runs (default 12: "
                        "every order of the three arms twice; quick 2; 0 skips them)")
    parser.add_argument("--only", choices=("cost", "loop", "trainer"), help="one part only")
    parser.add_argument("--runs-json", metavar="FILE", help="write every trainer run's "
                        "tokens/s, by arm and in round order, to FILE")
    parser.add_argument("--loop-jobs", type=int, help="separate 2-rank jobs the loop runs "
                        "(default 5, quick 1)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        calls, blocks, out_path = args.worker
        allreduce_worker(int(calls), int(blocks), out_path)
        return
    quick = args.quick
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(dir=shm_base()) as hb:
        env["DDPWATCH_DIR"] = hb
        if args.only in (None, "cost"):
            for python in (False, True):
                which = "pure Python" if python else "C"
                enter, leave, both = heartbeat_cost(50_000 if quick else 300_000, python)
                print(f"heartbeat cost ({which}), median: entry {enter:.2f} us, exit {leave:.2f} us, "
                      f"any heartbeat {both:.2f} us (target <= 1 us)")
            for python in (False, True):
                cost = wrapper_cpu_us(50_000 if quick else 200_000, python)
                print(f"instrumented wrapper around a collective ({'pure Python' if python else 'C'}), "
                      f"CPU: {cost:.2f} us per call (entry + exit heartbeats included)")
        if args.only in (None, "loop"):
            calls, blocks = (40_000, 10) if quick else (160_000, 40)
            jobs = []
            for _ in range(args.loop_jobs or (1 if quick else 5)):
                with tempfile.NamedTemporaryFile(suffix=".json") as out:
                    run(torchrun(2, os.path.abspath(__file__), "--worker", str(calls), str(blocks),
                                 out.name), env)
                    jobs.append(json.load(out))
            print(f"1-element all-reduce loop on 2 Gloo ranks, instrumented / bare, per-call "
                  f"medians: {report_loop(jobs, blocks)}; target <= 1.01")
        if args.only in (None, "trainer"):
            trainer_in_blocks(env, args.trainer_jobs or (1 if quick else 4),
                              args.rounds or (4 if quick else 48), 10 if quick else 20)
            rounds = 2 if quick else 12 if args.pairs is None else args.pairs
            if rounds:
                trainer_in_runs(env, rounds, 20 if quick else 100, args.runs_json)


def trainer_in_blocks(env: dict, jobs: int, rounds: int, steps: int) -> None:
    script = os.path.join(REPO, "benchmarks", "trainer_blocks.py")
    results = blocks.collect(jobs, lambda out: run(
        torchrun(2, script, str(rounds), str(steps), out), env))
    figures = trainer_blocks.report(results)
    on, control = figures["on"], figures["control"]
    rate, plain = blocks.tokens_per_s(results, "on")
    print(f"trainer tokens/s on 2 CPU ranks, instrumented / not, the trainer's step in blocks "
          f"taking turns inside a job: {on[0]:.3f} (90% interval {on[1]:.3f}-{on[2]:.3f}; "
          f"{rate:.0f} vs {plain:.0f} tok/s; {jobs} jobs x {rounds} rounds of {steps}-step blocks; "
          f"{results[0]['heartbeats_per_step']:.1f} heartbeats per instrumented step; target >= 0.99)")
    print(f"  control, the second uninstrumented arm / the first: {control[0]:.3f} "
          f"(90% interval {control[1]:.3f}-{control[2]:.3f}, the noise floor of the line above)")
    hook = figures["torch_python_hook"]
    print(f"  reference, uninstrumented with torch's own Python all-reduce comm hook / not: "
          f"{hook[0]:.3f} (90% interval {hook[1]:.3f}-{hook[2]:.3f}: what any Python DDP "
          f"comm hook costs)")


def trainer_in_runs(env: dict, rounds: int, steps: int, runs_json: str | None) -> None:
    runs = run_rounds(rounds, {
        "off": lambda: trainer_tokens_per_s(env, False, steps),
        "off_again": lambda: trainer_tokens_per_s(env, False, steps),
        "on": lambda: trainer_tokens_per_s(env, True, steps)})
    off, again, on = runs["off"], runs["off_again"], runs["on"]
    # The two uninstrumented arms are the same treatment: the baseline is both.
    both = [(a + b) / 2 for a, b in zip(off, again)]
    print(f"trainer tokens/s, whole runs of the bundled trainer, instrumented / not (both "
          f"uninstrumented arms): {ratio_summary(both, on)}{statistics.mean(on):.0f} vs "
          f"{statistics.mean(both):.0f} tok/s; {rounds} rounds of {steps}-step runs)")
    print(f"  control, the second uninstrumented arm / the first: "
          f"{ratio_summary(off, again)}the noise floor of the line above)")
    if runs_json:
        with open(runs_json, "w") as f:
            json.dump({"steps": steps, "tokens_per_s": runs}, f, indent=1)

if __name__ == "__main__":
    main()
