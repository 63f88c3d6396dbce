"""What grouping ranks started by hand (the wire_groups probe) adds to the
daemon's pass, on a node with many Python processes that are no rank.

Starts N idle Python processes (no torch: nothing to group, each one a candidate
the probe must rule out), then times the sampler's survey with and without the
probe over PASSES passes one tick apart. The probe's clock is advanced one tick
per pass (a daemon's seconds, run back to back), so its libtorch rechecks come
as often as in a daemon: every TORCH_RECHECK_S per process. No torch is started:
no lock needed.

    python benchmarks/wire_scan.py [--processes 100] [--passes 30]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from ddpwatch.observe.jobs import tcp_discovery  # noqa: E402
from ddpwatch.observe.probes import ProbeContext  # noqa: E402
from ddpwatch.observe.sampler import Sampler  # noqa: E402

OFF = ("traffic", "exits", "host")  # node probes that measure other things


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=100)
    parser.add_argument("--passes", type=int, default=30)
    parser.add_argument("--tick", type=float, default=1.0, help="daemon seconds per pass")
    args = parser.parse_args()
    idle = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            for _ in range(args.processes)]
    try:
        time.sleep(3.0)  # exec'd and settled
        now = [0.0]
        ctx = ProbeContext(clock=lambda: now[0])
        reads = [0]
        real = tcp_discovery.uses_torch

        def counted(procfs, pid):
            reads[0] += 1
            return real(procfs, pid)
        tcp_discovery.uses_torch = counted
        for label, with_wire in (("without wire_groups", False), ("with wire_groups", True)):
            with Sampler(ctx, lambda name: name not in OFF) as sampler:
                times, per_pass, probe = [], [], []
                for _ in range(args.passes):
                    before = reads[0]
                    start = time.perf_counter()
                    survey = sampler.survey(wire=with_wire)
                    survey.jobs()
                    times.append(time.perf_counter() - start)
                    per_pass.append(reads[0] - before)
                    probe += [p.duration_s for p in survey.probes if p.name == "wire_groups"]
                    now[0] += args.tick
            print(f"{label}: first pass {times[0] * 1e3:.1f} ms, median of the rest "
                  f"{statistics.median(times[1:]) * 1e3:.1f} ms, max {max(times[1:]) * 1e3:.1f} "
                  f"ms; maps read: first pass {per_pass[0]}, then {sum(per_pass[1:])} over "
                  f"{args.passes - 1} passes")
            if probe:
                print(f"  the wire_groups probe itself: first pass {probe[0] * 1e3:.1f} ms, "
                      f"median of the rest {statistics.median(probe[1:]) * 1e3:.1f} ms, "
                      f"max {max(probe[1:]) * 1e3:.1f} ms")
        print(f"({args.processes} idle Python processes started; "
              f"{sum(1 for _ in os.listdir('/proc') if _.isdigit())} processes on the node)")
    finally:
        for p in idle:
            p.kill()
        for p in idle:
            p.wait()


if __name__ == "__main__":
    main()
