"""What another user's junk costs the daemon's tick. Each figure from
this one run, in a throwaway record directory (no jobs needed):

1. the heartbeats probe's CPU time with 20 000 junk `.hb` files in a directory vs an
   empty one - target: ratio <= 5, and <= 50 ms absolute (the old reader: 0.04 s
   tick -> 0.36-0.55 s)
2. the same with 30 forged records and 8 records being truncated and rewritten
   in a loop by another process
3. with --procs N (root): a real `ddpwatch run`'s RSS and median tick, alone and
   beside N processes of uid 65534 that look like Python by argv (each 4 KB of
   invalid UTF-8 args: tests/jobs/python_flood.py) - target with 3 000: <= 80 MB
   and <= 100 ms (before the per-user bound, observe/jobs/proctable.py
   `set_aside`: 34 -> 113 MB, 2 ms -> ~1 s)

    python benchmarks/hostile_scan.py [--files 20000] [--ticks 20]
    python benchmarks/hostile_scan.py --procs 3000
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

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


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^VmRSS:\s+(\d+)", f.read(), re.M).group(1)) / 1024


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return r.read().decode()


def _settled(url: str, pid: int, seconds: float) -> tuple[float, float, str]:
    """(peak RSS MB, median tick ms, last /metrics) over `seconds` of ticks."""
    ticks, rss, text = [], [], ""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = _scrape(url)
        ticks.append(float(re.search(r"^ddpwatch_tick_duration_seconds (\S+)$", text,
                                     re.M).group(1)))
        rss.append(_rss_mb(pid))
        time.sleep(1.0)
    return max(rss), statistics.median(ticks) * 1000, text


def procs(n: int) -> int:
    """Figure 3: a real daemon beside n look-alike Python processes of uid 65534."""
    if os.geteuid() != 0:
        print("--procs needs root (the flood runs as uid 65534)", file=sys.stderr)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = tempfile.mkdtemp(prefix="ddpw-bench-")
    config = os.path.join(base, "config.yaml")
    with open(config, "w") as f:
        json.dump({"listen": f"127.0.0.1:{port}", "state_dir": base, "tick_s": 1.0}, f)
    url = f"http://127.0.0.1:{port}"
    daemon = subprocess.Popen([sys.executable, "-m", "ddpwatch", "run", "--config", config],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    flood = None
    try:
        for _ in range(120):
            try:
                _scrape(url)
                break
            except OSError:
                time.sleep(0.5)
        rss0, tick0, _ = _settled(url, daemon.pid, 10)
        print(f"3. ddpwatch run alone: RSS {rss0:.1f} MB, median tick {tick0:.1f} ms")
        flood = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "jobs",
                                                              "python_flood.py"), str(n)],
                                 stdout=subprocess.PIPE, text=True, start_new_session=True)
        flood.stdout.readline()
        time.sleep(10)  # listed, read, and set aside
        rss1, tick1, text = _settled(url, daemon.pid, 15)
        left = re.search(r'^ddpwatch_left_out_total\{what="processes"\} (\S+)$', text, re.M)
        print(f"   beside {n} look-alike Python processes of uid 65534: RSS {rss1:.1f} MB, "
              f"median tick {tick1:.1f} ms, left out {left.group(1) if left else '-'}")
    finally:
        if flood is not None:
            os.killpg(flood.pid, signal.SIGKILL)
        daemon.terminate()
        daemon.wait(30)
        shutil.rmtree(base, ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--procs", type=int, default=0, help="figure 3 only, with this many "
                    "look-alike processes (root)")
    args = ap.parse_args()
    if args.procs:
        return procs(args.procs)
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
