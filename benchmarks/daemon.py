"""What the daemon costs and how fast it answers. Each figure from this one run:

1. trainer tokens/s with `ddpwatch run` watching / without (alternating runs) - target >= 0.99
2. time from an injected stall (SIGSTOP of rank 1) to the culprit in /status and to
   the webhook at a local receiver - target <= 5 s
3. the daemon's CPU share and RSS while it watches 8 ranks - target <= 1% of a core, <= 80 MB
4. tick time with 256 live rank records - target <= 50 ms median
5. tick time and CPU with 8 ranks beside 100, 1 000 and 5 000 idle processes -
   target: the last <= 1.2x the first

    python benchmarks/daemon.py [--quick] [--only NAME[,NAME...]] [--profile] [--save FILE]

The daemon's own cost, its tick and its flatness in one run: `--only cost,tick,flat`.

`--save FILE` (with --only tick) keeps the 256-rank job's last history as a
snapshot file, so the judgement alone can be timed and profiled without 256
processes: `ddpwatch diagnose --replay FILE`, or benchmarks/judge.py.
"""
from __future__ import annotations

from common import free_port, wait_for  # benchmarks/common.py

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from pairs import ratio_summary, run_pairs  # benchmarks/pairs.py, beside this script


def start(cmd, env, log=subprocess.DEVNULL):
    return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc) -> None:
    for p in psutil.Process(proc.pid).children(recursive=True) + [psutil.Process(proc.pid)]:
        try:
            p.resume()
        except psutil.Error:
            pass
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def trainer_cmd(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "trainer",
            "--device-type=cpu", *args]


def start_daemon(env, hb_dir, state, extra=None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cfg = os.path.join(state, f"config-{port}.yaml")
    with open(cfg, "w") as f:
        json.dump({"listen": f"127.0.0.1:{port}", "state_dir": state, **(extra or {})}, f)
    proc = start([sys.executable, "-m", "ddpwatch", "run", "--config", cfg], env)
    url = f"http://127.0.0.1:{port}"
    wait(lambda: get(url + "/readyz") is not None, 60)
    return proc, url


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read()
    except OSError:
        return None


def wait(pred, timeout, what="a condition"):
    try:
        return wait_for(pred, timeout, what, interval=0.05)
    except TimeoutError:
        sys.exit(f"benchmark: {what} was not reached within {timeout:.0f} s")


def tokens_per_s(env, steps) -> float:
    out = subprocess.run(trainer_cmd(2, f"--steps={steps}"), env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=900).stdout
    rates = [float(x) for x in re.findall(r"\[rank 0\].*tok/s (\d+(?:\.\d+)?)", out)]
    return statistics.mean(rates[len(rates) // 5:])


def overhead(env, hb_dir, state, pairs, steps) -> str:
    def watched():
        daemon, _ = start_daemon(env, hb_dir, state)
        try:
            return tokens_per_s(env, steps)
        finally:
            stop(daemon)
    off, on = run_pairs(pairs, lambda: tokens_per_s(env, steps), watched)
    return (f"trainer tokens/s with the daemon watching / without: {ratio_summary(off, on)}"
            f"{statistics.mean(on):.0f} vs {statistics.mean(off):.0f}; {pairs} pairs of "
            f"{steps}-step runs; target >= 0.99)")


def time_to_culprit(env, hb_dir, state) -> str:
    arrivals = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            arrivals.append(time.monotonic())
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass
    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    hook_url = f"http://127.0.0.1:{hook.server_address[1]}/"
    daemon, url = start_daemon(env, hb_dir, state,
                               {"webhooks": [{"type": "generic", "url": hook_url}]})
    job = start(trainer_cmd(2, "--steps=0"), env)
    try:
        def status():
            body = get(url + "/status")
            return json.loads(body) if body else None
        wait(lambda: (s := status()) and len(s["ranks"]) == 2 and s["job"]["verdict"] == "healthy",
             240, "a healthy 2-rank job in /status")
        pid = next(r["pid"] for r in status()["ranks"] if r["rank"] == 1)
        t0 = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        wait(lambda: status()["job"]["culprits"] == [1], 60, "the culprit in /status")
        to_status = time.monotonic() - t0
        wait(lambda: arrivals, 60, "the webhook")
        to_hook = arrivals[0] - t0
        os.kill(pid, signal.SIGCONT)
    finally:
        stop(job)
        stop(daemon)
        hook.shutdown()
    return (f"injected stall (SIGSTOP rank 1) to culprit in /status: {to_status:.2f} s, to the "
            f"webhook: {to_hook:.2f} s (target <= 5 s; tick 1 s)")


def cost_8_ranks(env, hb_dir, state, seconds) -> str:
    """The same 8-rank job watched by a daemon reading no window evidence
    (reading_s: 0) and then by one with the default readings between ticks."""
    job = start(trainer_cmd(8, "--steps=0"), env)
    figures = []
    try:
        for name, extra in (("no readings between ticks", {"reading_s": 0}),
                            ("readings between ticks (default)", {})):
            daemon, url = start_daemon(env, hb_dir, state, extra)
            try:
                # measured once the job trains (a starting job is looked at in detail)
                wait(lambda: (b := get(url + "/status")) and len(json.loads(b)["ranks"]) == 8
                     and json.loads(b)["job"]["verdict"] == "healthy", 300,
                     "a healthy 8-rank job in /status")
                proc = psutil.Process(daemon.pid)
                t0, c0, m0 = time.monotonic(), sum(proc.cpu_times()[:2]), main_cpu(proc)
                time.sleep(seconds)  # measuring over a fixed window is the point here
                elapsed = time.monotonic() - t0
                share = (sum(proc.cpu_times()[:2]) - c0) / elapsed
                # the main thread runs the ticks; the others read the ranks
                # between ticks (observe/window/between.py) and serve HTTP
                main = (main_cpu(proc) - m0) / elapsed
                rss = proc.memory_info().rss
                verdict = json.loads(get(url + "/status"))["job"]["verdict"]
            finally:
                stop(daemon)
            figures.append(f"{name}: {share:.2%} of a core (ticks {main:.2%}, other threads "
                           f"{share - main:.2%}), RSS {rss / 2**20:.0f} MiB "
                           f"(job verdict at the end: {verdict})")
    finally:
        stop(job)
    return (f"daemon watching 8 ranks over {seconds:.0f} s each (target <= 1%, <= 80 MB): "
            + "; ".join(figures))


def main_cpu(proc: psutil.Process) -> float:
    """CPU seconds of the process's main thread (its thread id is its pid)."""
    for t in proc.threads():
        if t.id == proc.pid:
            return t.user_time + t.system_time
    return 0.0


RECORD_WRITER = """
import os, sys, time
from ddpwatch.heartbeat import open_writer
w = open_writer(rank=int(os.environ['RANK']))
while True:
    w.exit(w.enter(1, 4)); w.step(1); time.sleep(0.5)
"""


def tick_256(env, hb_dir, ticks, profile=False, save=None) -> str:
    stages: dict[str, list[float]] = {}
    kept: list[bool] = []
    durations, _, where, _ = ticks_of(env, hb_dir, 256, ticks, profile, save=save,
                                      stages=stages, kept=kept)
    looked = [d for d, k in zip(durations, kept) if not k]
    steady = [d for d, k in zip(durations, kept) if k]
    split = (f"; the {len(looked)} ticks that looked at the job: median "
             f"{_ms(looked)}, the {len(steady)} that kept its look (a steady job: "
             f"docs/architecture.md): median {_ms(steady)}")
    return (f"tick with 256 live rank records: median "
            f"{statistics.median(durations) * 1e3:.0f} ms, max {max(durations) * 1e3:.0f} ms "
            f"over {ticks} ticks a second apart (target <= 50 ms){split}\n"
            f"  where the ticks that looked go (median ms a tick): "
            + where_it_goes(durations, stages, [not k for k in kept])
            + ("\n" + where if where else ""))


def _ms(durations: list[float]) -> str:
    return f"{statistics.median(durations) * 1e3:.0f} ms" if durations else "-"


def where_it_goes(durations: list[float], stages: dict[str, list[float]],
                  chosen: list[bool] | None = None) -> str:
    """The probes' own timings (ProbeStatus.duration_s, as /metrics exports them),
    the biggest first, and what is left of the tick: the process table, finding
    the jobs, judging them (over time too) and publishing. Unprofiled: cProfile
    (--profile) inflates Python-heavy work (the judgement) about 3x against
    system calls (the probes)."""
    chosen = chosen if chosen is not None and any(chosen) else [True] * len(durations)
    rest = [d - sum(per[i] for per in stages.values()) for i, d in enumerate(durations)
            if chosen[i]]
    parts = sorted(((statistics.median([x for x, c in zip(v, chosen) if c]), name)
                    for name, v in stages.items()), reverse=True)
    shown = [f"{name} {ms * 1e3:.1f}" for ms, name in parts if ms >= 0.0005]
    return ", ".join(shown + [f"not in a probe (table, discovery, judgement) "
                              f"{statistics.median(rest) * 1e3:.1f}"])


IDLE = "i=0; while [ $i -lt {n} ]; do sleep 3600 & i=$((i+1)); done; wait"


def ticks_of(env, hb_dir, ranks: int, ticks: int, profile: bool = False,
             between_s: float = 1.0, save: str | None = None,
             stages: dict | None = None,
             kept: list | None = None) -> tuple[list[float], float, str, dict]:
    """`ranks` record-writing ranks of one job (RECORD_WRITER), a daemon's tick
    run in this process `ticks` times, a second apart: the durations, the CPU
    seconds the ticks took, (with `profile`) where they went, and how many
    ticks did what costs more (listed /proc, looked at the job in detail), and
    how many processes the ticks read. `stages`, when given, gets each probe's
    time in each tick (probe name -> seconds, one per tick); `kept`, when given,
    whether each tick kept the job's last look (a steady job: docs/architecture.md
    "Steady jobs"). The ranks are read between ticks by the daemon's own
    reading thread, as in production: its CPU during a tick is the tick's."""
    port = free_port()
    procs = []
    try:
        for rank in range(ranks):
            e = dict(env, RANK=str(rank), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port), LOCAL_RANK=str(rank))
            procs.append(start([sys.executable, "-c", RECORD_WRITER], e))
        from ddpwatch.heartbeat import read_dir
        wait(lambda: len(read_dir(hb_dir)[0]) >= ranks, 300)
        from ddpwatch.config import load
        from ddpwatch.daemon import Daemon, collect_less, load_rules
        os.environ["DDPWATCH_DIR"] = hb_dir
        cfg = load(None, {"state_dir": tempfile.mkdtemp()})
        daemon = Daemon(cfg, load_rules(cfg))
        collect_less()  # as `ddpwatch run` does (commands/run.py)
        stop = threading.Event()
        daemon.between.start(stop, lambda: None)  # the readings between ticks
        for _ in range(3):  # the first ticks learn the node; measured: the steady state
            daemon.tick()   # (a second apart: what started just before is young, and
            time.sleep(between_s)  # a young process is read each tick until it is not)
        profiler = None
        if profile:
            import cProfile
            profiler = cProfile.Profile()
        durations, cpu = [], 0.0
        notes = {"listed /proc": 0, "in detail": 0, "processes read": 0, "looks kept": 0}
        for _ in range(ticks):
            time.sleep(between_s)  # a tick a second, as the daemon's loop runs them
            c0 = time.process_time()
            if profiler:
                profiler.enable()
            kept_before = daemon.judging.looks_kept
            view = daemon.tick()
            if profiler:
                profiler.disable()
            notes["looks kept"] += daemon.judging.looks_kept - kept_before
            if kept is not None:
                kept.append(daemon.judging.looks_kept > kept_before)
            cpu += time.process_time() - c0
            durations.append(view.tick_duration_s)
            if stages is not None:
                per: dict[str, float] = {}
                for p in view.probes:  # a probe may run more than once a tick
                    per[p.name] = per.get(p.name, 0.0) + p.duration_s
                for name in set(per) | set(stages):
                    stages.setdefault(name, [0.0] * (len(durations) - 1)).append(
                        per.get(name, 0.0))
            notes["listed /proc"] += daemon.sampler.listed_proc()
            notes["processes read"] += daemon.sampler.processes_read()
            notes["in detail"] += any(p.name == "competitors" for p in view.probes)
            judged = sum(len(j.judgement.ranks) for j in view.jobs)
        if judged != ranks:
            raise RuntimeError(f"{judged} ranks judged of {ranks}")
        where = ""
        if profiler:
            import io
            import pstats
            out = io.StringIO()
            stats = pstats.Stats(profiler, stream=out)
            stats.sort_stats("cumulative").print_stats(30)  # which stage
            stats.sort_stats("tottime").print_stats(30)     # which function, itself
            where = out.getvalue()
        if save:
            from ddpwatch.observe.snapshot import save as save_history
            (watched,) = daemon.watched.values()
            save_history(tuple(watched.history), save)
        stop.set()
        daemon.close()
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    return durations, cpu, where, notes


def flat(env, hb_dir, ticks, counts=(100, 1000, 5000)) -> str:
    """Tick time and CPU with 8 ranks and `counts` idle processes beside them
    (`sleep`s of one shell, as a node's agents, exporters and shells are)."""
    figures, first = [], None
    for n in counts:
        idle = start(["sh", "-c", IDLE.format(n=n)], env)
        try:
            wait(lambda: len(psutil.Process(idle.pid).children()) >= n, 300,
                 f"{n} idle processes")
            durations, cpu, _, notes = ticks_of(env, hb_dir, 8, ticks)
        finally:
            os.killpg(idle.pid, signal.SIGKILL)
            idle.wait()
        median = statistics.median(durations)
        first = first or (median, cpu)
        figures.append(f"{n} idle: tick median {median * 1e3:.1f} ms "
                       f"({median / first[0]:.2f}x, max {max(durations) * 1e3:.0f} ms), "
                       f"CPU {cpu / ticks:.1%} of a core ({cpu / first[1]:.2f}x; "
                       + ", ".join(f"{k} {v}" for k, v in notes.items()) + ")")
    return (f"8 ranks beside idle processes, {ticks} ticks a second apart each "
            f"(target: the last <= 1.2x the first): " + "; ".join(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    names = ("overhead", "stall", "cost", "tick", "flat")
    parser.add_argument("--only", metavar="NAME[,NAME]",
                        help=f"only these, comma-separated: {', '.join(names)}")
    parser.add_argument("--profile", action="store_true",
                        help="with --only tick: where the tick's time goes (cProfile)")
    parser.add_argument("--save", metavar="FILE",
                        help="with --only tick: the job's last history, as a snapshot file")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else set(names)
    if not only <= set(names):
        parser.error(f"--only: no such figure: {', '.join(sorted(only - set(names)))}")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # where records live in production
    with tempfile.TemporaryDirectory(dir=shm) as hb_dir, tempfile.TemporaryDirectory() as state:
        env = dict(os.environ, DDPWATCH_DIR=hb_dir, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
        runs = {
            "overhead": lambda: overhead(env, hb_dir, state, 2 if args.quick else 8,
                                         20 if args.quick else 100),
            "stall": lambda: time_to_culprit(env, hb_dir, state),
            "cost": lambda: cost_8_ranks(env, hb_dir, state, 10 if args.quick else 30),
            "tick": lambda: tick_256(env, hb_dir, 5 if args.quick else 20, args.profile,
                                     args.save),
            # past REVISIT_S (30 s): the idle processes' revisits are in the figure
            "flat": lambda: flat(env, hb_dir, 5 if args.quick else 40),
        }
        for name, run in runs.items():
            if name in only:
                print(run(), flush=True)


if __name__ == "__main__":
    main()
