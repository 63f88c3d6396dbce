"""The judgement alone: `classify.judge` over a saved history, timed (and with
--profile, where its time goes). No processes: the history comes from a
snapshot file, e.g. the 256-rank job of `benchmarks/daemon.py --only tick
--save FILE`, or a replay fixture of tests/fixtures/snapshots.

    python benchmarks/judge.py FILE [--times N] [--profile]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--times", type=int, default=20)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    from ddpwatch.judge import classify, rules
    from ddpwatch.observe.snapshot import load, load_remote
    history, remote = load(args.file), load_remote(args.file)
    shipped = rules.load_default()
    classify.judge(history, shipped, remote)  # the first builds caches: not timed
    profiler = None
    if args.profile:
        import cProfile
        profiler = cProfile.Profile()
    durations = []
    for _ in range(args.times):
        t0 = time.perf_counter()
        if profiler:
            profiler.enable()
        judgement = classify.judge(history, shipped, remote)
        if profiler:
            profiler.disable()
        durations.append(time.perf_counter() - t0)
    print(f"judging {len(judgement.ranks)} ranks over {len(history)} snapshots: median "
          f"{statistics.median(durations) * 1e3:.1f} ms, max {max(durations) * 1e3:.1f} ms "
          f"over {args.times} judgements (job verdict: {judgement.job.verdict})")
    if profiler:
        import pstats
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
