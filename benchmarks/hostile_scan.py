"""What another user's junk costs the daemon's tick. Each figure from
this one run, in a throwaway record directory (no jobs needed):

1. the heartbeats probe's CPU time with 20 000 junk `.hb` files in a directory vs an
   empty one - target: ratio <= 5, and <= 50 ms absolute (the old reader: 0.04 s
   tick -> 0.36-0.55 s)
2. the same with 30 forged records and 8 records being truncated and rewritten
   in a loop by another process

    python benchmarks/hostile_scan.py [--files 20000] [--ticks 20]
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from ddpwatch.heartbeat import layout  # noqa: E402
from ddpwatch.observe.jobs.discovery import ProcInfo  # noqa: E402
from ddpwatch.observe.probes import Pass, ProbeContext  # noqa: E402
from ddpwatch.observe.probes.heartbeats import HeartbeatsProbe  # noqa: E402


def record(pid: int, rank: int) -> bytes:
    head = layout.pack_header(
        pid=pid, rank=rank, local_rank=rank, world_size=64, uid=os.getuid(), started_at=1.0,
        started_wall=time.time(), run_id="bench", hostname="h", torch_version="", backend="gloo",
        device_type="cpu", compute_dtype="float32", data_fingerprint="", data_batches=-1,
        data_shards=-1)
    return (head + layout.SEQ.pack(2)).ljust(layout.RECORD_SIZE, b"\0")


def racer(directory: str) -> None:
    good = record(os.getpid(), 100)
    fds = [os.open(os.path.join(directory, f"rank{100 + i}-pid{os.getpid()}.hb"),
                   os.O_RDWR | os.O_CREAT, 0o600) for i in range(8)]
    n = 0
    while True:
        for fd in fds:
            os.pwrite(fd, good, 0)
            os.ftruncate(fd, (n * 977) % len(good))
            n += 1


def probe_ms(directory: str, ticks: int) -> float:
    ctx = ProbeContext(heartbeat_dir=directory)
    probe = HeartbeatsProbe()  # as the daemon's: gone writers' records and listings kept
    seen = Pass(table={os.getpid(): ProcInfo(os.getpid(), 1, (), {})})
    times = []
    for _ in range(ticks + 1):
        start = time.process_time()  # CPU: the racer spins on a core of its own
        probe.run(ctx, seen, ())
        times.append(time.process_time() - start)
    return statistics.median(times[1:]) * 1000  # the first fills the caches


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--ticks", type=int, default=20)
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="ddpw-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                            else None)
    try:
        empty, junk = os.path.join(base, "empty"), os.path.join(base, "junk")
        os.mkdir(empty), os.mkdir(junk)
        for i in range(args.files):
            with open(os.path.join(junk, f"junk{i}.hb"), "wb") as f:
                f.write(b"junk" * (i % 7))
        base_ms, junk_ms = probe_ms(empty, args.ticks), probe_ms(junk, args.ticks)
        print(f"1. heartbeats probe: empty {base_ms:.2f} ms, {args.files} junk files "
              f"{junk_ms:.2f} ms (+{junk_ms - base_ms:.2f} ms)")
        blob = record(1, 1)
        for i in range(30):
            with open(os.path.join(junk, f"rank{i}-pid1.hb"), "wb") as f:
                f.write(blob)
        proc = multiprocessing.Process(target=racer, args=(junk,), daemon=True)
        proc.start()
        time.sleep(0.5)
        race_ms = probe_ms(junk, args.ticks)
        proc.terminate()
        print(f"2. with 30 forged records and 8 racing ones: {race_ms:.2f} ms")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
