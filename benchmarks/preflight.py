"""How long `ddpwatch preflight` takes on a passing two-node pair: this host (the
master, on its end of a veth) and a network namespace (the worker), both
started at once, timed from start until both have printed their tables.
Target: <= 10 s. Needs root, ip and a veth (as the tests' `netns` fixture).

    python benchmarks/preflight.py [--runs 5] [--params 124000000]
"""
from __future__ import annotations

from common import free_port  # benchmarks/common.py

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_S = 10.0


def make_netns() -> dict:
    tag = uuid.uuid4().hex[:6]
    net = 1 + int(tag, 16) % 250
    ns = {"name": f"ddpb{tag}", "host_if": f"dba{tag}", "peer_if": f"dbb{tag}",
          "host_addr": f"10.233.{net}.1", "peer_addr": f"10.233.{net}.2"}
    ex = ["ip", "netns", "exec", ns["name"]]
    for cmd in (["ip", "netns", "add", ns["name"]],
                ["ip", "link", "add", ns["host_if"], "type", "veth", "peer", "name", ns["peer_if"]],
                ["ip", "link", "set", ns["peer_if"], "netns", ns["name"]],
                ["ip", "addr", "add", f"{ns['host_addr']}/24", "dev", ns["host_if"]],
                ["ip", "link", "set", ns["host_if"], "up"],
                [*ex, "ip", "addr", "add", f"{ns['peer_addr']}/24", "dev", ns["peer_if"]],
                [*ex, "ip", "link", "set", ns["peer_if"], "up"],
                [*ex, "ip", "link", "set", "lo", "up"]):
        subprocess.run(cmd, check=True, capture_output=True)
    return ns


def drop_netns(ns: dict) -> None:
    subprocess.run(["ip", "netns", "del", ns["name"]], capture_output=True, check=False)
    subprocess.run(["ip", "link", "del", ns["host_if"]], capture_output=True, check=False)


def one_run(ns: dict, params: int) -> tuple[float, int, int]:
    args = [sys.executable, "-m", "ddpwatch", "preflight", "--master",
            f"{ns['host_addr']}:{free_port()}", "--params", str(params)]
    # signed, as the README asks users to run it
    env = dict(os.environ, PYTHONPATH=REPO, DDPWATCH_PREFLIGHT_SECRET=os.urandom(16).hex())
    started = time.monotonic()
    master = subprocess.Popen(args, env=dict(env, GLOO_SOCKET_IFNAME=ns["host_if"]), cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    worker = subprocess.Popen(["ip", "netns", "exec", ns["name"], *args],
                              env=dict(env, GLOO_SOCKET_IFNAME=ns["peer_if"]), cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        out_m, _ = master.communicate(timeout=120)
        out_w, _ = worker.communicate(timeout=120)
    finally:
        for p in (master, worker):
            if p.poll() is None:
                p.kill()
    elapsed = time.monotonic() - started
    if master.returncode or worker.returncode:
        print(out_m.decode(), out_w.decode(), sep="\n", file=sys.stderr)
    return elapsed, master.returncode, worker.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--params", type=int, default=124_000_000)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root for a network namespace", file=sys.stderr)
        return 2
    ns = make_netns()
    try:
        times = []
        for _ in range(args.runs):
            elapsed, code_m, code_w = one_run(ns, args.params)
            if (code_m, code_w) != (0, 0):
                print(f"a run did not pass (exit {code_m}/{code_w}): not a passing pair",
                      file=sys.stderr)
                return 1
            times.append(elapsed)
    finally:
        drop_netns(ns)
    worst = max(times)
    print(f"preflight of a passing two-node pair: median {statistics.median(times):.2f} s, "
          f"worst {worst:.2f} s over {len(times)} runs (target <= {TARGET_S:.0f} s: "
          f"{'met' if worst <= TARGET_S else 'MISSED'}, worst/target {worst / TARGET_S:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
