"""Judgement over time: real healthy jobs watched by a real `ddpwatch run` with a
webhook receiver, for minutes. Prints false pages per hour of healthy training,
the pauses /status named (by kind), and, with --faults, the time from each fault
to its page; with --pauses, the time from each hang at a pause site (a
DataLoader's workers blocked, a rank blocked in its evaluation, its checkpoint,
its logging call) to its page.

    python benchmarks/soak.py --minutes 30            # healthy jobs only (all five)
    python benchmarks/soak.py --minutes 3 --faults    # then faults mid-run
    python benchmarks/soak.py --minutes 3 --pauses    # then hangs at pause sites

Each job is a real job: torchrun jobs of tests/jobs/thirdparty/nanogpt_ddp.py
(rank 0 alone evaluates every few seconds; in another it evaluates and saves a
300 MB checkpoint, and that job writes heartbeats: DDPWATCH_AUTO=1; one fed by a
DataLoader whose workers are not persistent; one torch.compiled whose rank 1
recompiles mid-run) and a Lightning job (validation, ModelCheckpoint).
The daemon runs with its defaults but for a generic webhook and resolve_after_s
10 s; what is measured is what a user gets. Before the faults its pause_floor_s
is lowered by a reload (--fault-floor, 20 s), so that the busy-loop fault pages
within the run. tests/daemon/test_soak.py runs a short
version of the same in the suite (soak tests belong here).
"""
from __future__ import annotations

import argparse
import collections
import math
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Receiver, free_port, tagged_pids, wait_for  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THIRDPARTY = os.path.join(REPO, "tests", "jobs", "thirdparty")

# name -> environment of a nanoGPT-style job (tests/jobs/thirdparty/nanogpt_ddp.py)
JOBS = {
    "eval": {"DDPWATCH_TEST_EVAL_INTERVAL": "150", "DDPWATCH_TEST_EVAL_ITERS": "150"},
    # with heartbeats (DDPWATCH_AUTO=1, what `ddpwatch exec` sets): the waiting rank's
    # record says how long it has waited; the other job is judged without any
    "checkpoint": {"DDPWATCH_TEST_EVAL_INTERVAL": "200", "DDPWATCH_TEST_EVAL_ITERS": "10",
                   "DDPWATCH_TEST_CKPT_MB": "300", "DDPWATCH_AUTO": "1"},
    # Lightning validates on both ranks and saves from rank 0 behind a barrier
    # (tests/jobs/thirdparty/lightning_eval_ddp.py); no faults are given to it
    "lightning": {"script": "lightning_eval_ddp.py", "MASTER_PORT": "{port}"},
}
# Pauses of other kinds, without faults: a DataLoader whose workers are not
# persistent (every rank waits for its new workers at each epoch's start, ~10 s
# apart), and torch.compile with a cold cache whose rank 1 alone recompiles at
# step 400 (a new shape; tens of seconds on 2 cores) while rank 0 waits
MORE_JOBS = {
    "loader": {"DDPWATCH_TEST_LOADER": "1", "DDPWATCH_TEST_EPOCH_BATCHES": "60",
               "DDPWATCH_TEST_WORKER_INIT_S": "3", "DDPWATCH_TEST_EVAL_INTERVAL": "100000"},
    "compile": {"DDPWATCH_TEST_COMPILE": "1", "DDPWATCH_TEST_RECOMPILE_AT": "400",
                "DDPWATCH_TEST_EVAL_ITERS": "10", "DDPWATCH_TEST_EVAL_INTERVAL": "200",
                "TORCHINDUCTOR_CACHE_DIR": "{workdir}/inductor-cache"},
}


TAG = "DDPWATCH_SOAK_PROC"


class Proc:
    """A process of ours and everything it started, killed on close. torchrun
    starts each worker in a session of its own, and a worker whose agent died is
    re-parented: an environment tag finds them all (tests/conftest.py does the
    same). A spinning rank left behind would load every later measurement."""

    def __init__(self, argv, env, log_path):
        self.log = open(log_path, "wb")
        self.log_path = log_path
        self.tag = uuid.uuid4().hex
        self.proc = subprocess.Popen(argv, env=dict(env, **{TAG: self.tag}), stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, cwd=REPO)

    def pids(self) -> list[int]:
        """Every process now running with this one's tag in its environment."""
        return tagged_pids(TAG, self.tag)

    def output(self) -> str:
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def close(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            left = self.pids()
            if not left:
                break
            for sig in (signal.SIGCONT, signal.SIGKILL):
                for pid in left:
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
            time.sleep(0.1)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()


# What tests/jobs/thirdparty/faults.py `announce` prints once a rank's group is up.
# Searched anywhere in the output, not per line: two ranks share one stdout, and
# one rank's line can land in the middle of the other's (a Lightning job's two
# announcements once came out as one line, and the second rank was never seen).
ANNOUNCE = re.compile(r"thirdparty: rank=(\d+) local_rank=\d+ world=\d+ pid=(\d+)")
READY = re.compile(r"rank (\d+) pid (\d+) ready")  # tests/jobs/pausesites.py's


def rank_pids(job: Proc) -> dict[int, int]:
    """rank -> pid, from the lines the job's ranks print once their group is up."""
    out = job.output()
    return {int(rank): int(pid) for rank, pid in ANNOUNCE.findall(out) + READY.findall(out)}


class Soak:
    """Jobs, a daemon watching them with a webhook, and /status read every second."""

    def __init__(self, workdir: str, jobs: dict[str, dict], faults: dict[str, str] = None,
                 config: dict | None = None):
        self.workdir = workdir
        self.receiver = Receiver()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.hb_dir = os.path.join(workdir, "hb")
        cfg = {"listen": f"127.0.0.1:{self.port}", "state_dir": os.path.join(workdir, "state"),
               "heartbeat_dir": self.hb_dir,
               "webhooks": [{"type": "generic", "url": self.receiver.url}], **(config or {})}
        path = self.config_path = os.path.join(workdir, "ddpwatch.yaml")
        self.config = cfg
        with open(path, "w") as f:
            json.dump(cfg, f)  # JSON is YAML
        self.env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                        DDPWATCH_DIR=self.hb_dir, PYTHONPATH=REPO)
        self.procs: list[Proc] = []
        self.daemon = self._start([sys.executable, "-m", "ddpwatch", "run", "--config", path],
                                  {}, "daemon")
        self.jobs: dict[str, Proc] = {}
        self.store_ports: dict[str, int] = {}
        for name, env in jobs.items():
            port = free_port()
            self.store_ports[name] = port
            env = {k: v.replace("{port}", str(port)).replace("{workdir}", workdir)
                   for k, v in env.items()}
            script = os.path.join(THIRDPARTY, env.pop("script", "nanogpt_ddp.py"))
            argv = ([sys.executable, script] if "lightning" in os.path.basename(script) else
                    [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                     "--master_addr=127.0.0.1", f"--master_port={port}", script])
            self.jobs[name] = self._start(
                argv,
                dict(env, DDPWATCH_TEST_OUT=workdir, DDPWATCH_TEST_FAULT_FILE=self.fault_file(name),
                     DDPWATCH_TEST_FAULT=(faults or {}).get(name, "")), name)
        self.readings: list[tuple[float, dict]] = []
        self._done = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    def reconfigure(self, **changes) -> None:
        """Rewrite the daemon's config and reload it (SIGHUP), as an operator
        would; returns once the daemon logged the reload. Its jobs' history stays."""
        self.config = dict(self.config, **changes)
        with open(self.config_path + ".new", "w") as f:
            json.dump(self.config, f)
        os.replace(self.config_path + ".new", self.config_path)
        before = self.daemon.output().count("reloaded ")
        os.kill(self.daemon.proc.pid, signal.SIGHUP)
        wait_for(lambda: self.daemon.output().count("reloaded ") > before, 30, "the reload")

    def fault_file(self, name: str) -> str:
        return os.path.join(self.workdir, f"{name}.fault")

    def fault(self, name: str, spec: str) -> float:
        """Give job `name` a fault now (nanogpt_ddp.py DDPWATCH_TEST_FAULT_FILE)."""
        with open(self.fault_file(name), "a") as f:
            f.write(spec + "\n")
        return time.monotonic()

    def _start(self, argv, env, name) -> Proc:
        proc = Proc(argv, dict(self.env, **env), os.path.join(self.workdir, f"{name}.log"))
        self.procs.append(proc)
        return proc

    def _poll(self):
        while not self._done.wait(1.0):
            try:
                with urllib.request.urlopen(self.url + "/status", timeout=10) as r:
                    self.readings.append((time.monotonic(), json.loads(r.read())))
            except (OSError, ValueError, http.client.HTTPException):  # a cut answer
                continue

    def wait_started(self, timeout: float = 240.0) -> float:
        """Until every job's two ranks announced themselves and the daemon judged
        each; returns when."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.daemon.proc.poll() is None:
            if all(len(rank_pids(j)) == 2 for j in self.jobs.values()) and len(
                    self.job_status()) >= len(self.jobs):
                return time.monotonic()
            time.sleep(0.5)
        raise RuntimeError("jobs did not start: " + "; ".join(
            f"{n}: {j.output()[-400:]}" for n, j in self.jobs.items()) + "\n" + self.seen())

    def seen(self) -> str:
        """What the daemon showed last, for a failure's message: how old its last
        /status reading is, each job there with its ranks' pids, its log's tail."""
        lines = [f"the daemon exited {self.daemon.proc.returncode}"
                 if self.daemon.proc.poll() is not None else "the daemon runs",
                 f"{len(self.readings)} /status readings"]
        if self.readings:
            at, status = self.readings[-1]
            lines.append(f"last {time.monotonic() - at:.1f}s ago:")
            lines += [f"  {j.get('key')} {j['job'].get('verdict')} as {self.name_of(j)}: "
                      + " ".join(f"{r.get('rank')}={r.get('pid')}" for r in j.get("ranks", ()))
                      for j in status.get("jobs", ())]
        lines.append("ranks announced: " + "; ".join(
            f"{n} {rank_pids(j)}" for n, j in self.jobs.items()))
        return "\n".join(lines) + "\ndaemon log:\n" + self.daemon.output()[-3000:]

    def job_status(self) -> dict[str, dict]:
        """job name -> its last /status entry (matched by the ranks' pids)."""
        if not self.readings:
            return {}
        status = self.readings[-1][1]
        return {name: entry for name, entry in ((self.name_of(j), j) for j in status["jobs"])
                if name}

    def name_of(self, job_entry: dict) -> str | None:
        pids = {r.get("pid") for r in job_entry.get("ranks", ())}
        for name, proc in self.jobs.items():
            if pids & set(rank_pids(proc).values()):
                return name
        return None

    def label_of(self, name: str) -> str | None:
        entry = self.job_status().get(name)
        return entry.get("key") if entry else None

    def pauses_seen(self) -> dict[str, collections.Counter]:
        """job name -> Counter of pause kinds named in /status readings."""
        seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for _, status in self.readings:
            for entry in status["jobs"]:
                name = self.name_of(entry)
                pause = entry.get("pause") or {}
                if name and pause.get("kind"):
                    seen[name][pause["kind"]] += 1
        return seen

    LOOK = ("cpu_ratio", "runqueue_wait_ratio", "state", "running_share", "peer_idle_s",
            "rank_links_idle_s", "stack", "stack_top", "pause_kind", "competitors")

    def around(self, label: str, at: float, before: float = 20.0) -> str:
        """What /status said of job `label` in the readings from `before` seconds
        before `at` to 3 s after it: each rank's verdict, rule and the signals a
        false page turns on, for a failure's message (CI keeps nothing else)."""
        lines = []
        for t, status in self.readings:
            if not at - before <= t <= at + 3:
                continue
            for entry in status.get("jobs", ()):
                if entry.get("key") != label:
                    continue
                lines.append(f"  {t - at:+.1f}s {self.name_of(entry)} {entry['job'].get('verdict')}")
                for r in entry.get("ranks", ()):
                    sig = r.get("signals") or {}
                    lines.append(f"    rank {r.get('rank')} {r.get('verdict')} ({r.get('rule')}) "
                                 + " ".join(f"{k}={sig[k]!r}" for k in self.LOOK
                                            if sig.get(k) is not None)[:600])
        return "\n".join(lines) or "  no /status reading of it then"

    def describe(self, firing: list[tuple[float, dict]], began: float) -> str:
        """False pages for a failure's message: each with the job's name and the
        readings before it (around)."""
        return "\n".join(
            f"+{t - began:.1f}s {m.get('job')} {m.get('verdict')}: {m.get('summary')}\n"
            + self.around(m.get("job"), t) for t, m in firing)

    def verdicts_seen(self) -> dict[str, collections.Counter]:
        seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for _, status in self.readings:
            for entry in status["jobs"]:
                name = self.name_of(entry)
                if name:
                    seen[name][entry["job"]["verdict"]] += 1
        return seen

    def close(self):
        self._done.set()
        for proc in reversed(self.procs):
            proc.close()
        self.receiver.close()


def pages_since(soak: Soak, name: str, since: float) -> list[tuple[float, dict]]:
    label = soak.label_of(name)
    return [(t, m) for t, m in soak.receiver.firing(label) if t >= since]


def resolved_since(soak: Soak, name: str, since: float) -> bool:
    label = soak.label_of(name)
    with soak.receiver.lock:
        return any(m.get("status") == "resolved" and m.get("job") == label and t >= since
                   for t, m in soak.receiver.messages)


def long_factor(output: str, floor_s: float, margin_s: float = 15.0) -> int:
    """How many times its usual length the long evaluation takes: 10, or enough
    for it to outlast `floor_s` by `margin_s`, by the job's evaluations so far
    (nanogpt_ddp.py prints each one's seconds)."""
    took = sorted(float(s) for s in re.findall(r"val loss [\d.]+ \(([\d.]+)s\)", output))
    usual = took[len(took) // 2] if took else 0.0
    return max(10, math.ceil((floor_s + margin_s) / usual)) if usual > 0 else 10


def faults(soak: Soak, timeout: float = 300.0, floor_s: float = 20.0) -> dict[str, dict]:
    """Faults mid-run, two at a time (one per job): a stopped rank and a 10x
    evaluation, then a rank waiting on a lock and one busy-looping where no pause
    ran before. Per fault: seconds to its first page, and pages of the incident."""
    out = {}

    def measure(fault, name, began):
        first = wait_for(lambda: pages_since(soak, name, began), timeout, f"{fault}'s page")
        out[fault] = {"job": name, "to_page_s": round(first[0][0] - began, 1),
                      "summary": first[0][1].get("summary", ""),
                      "incident": first[0][1].get("incident_id"), "since": began}
        return first[0][0]

    def count(fault):
        """Firing messages of the fault's incident, and of any other incident of its
        job since the fault began (with their verdicts)."""
        got = out[fault]
        firing = pages_since(soak, got["job"], got["since"])
        got["pages"] = sum(m.get("incident_id") == got["incident"] for _, m in firing)
        got["other"] = [m.get("verdict") for _, m in firing
                        if m.get("incident_id") != got["incident"]]
        got["verdicts"] = [m.get("verdict") for _, m in firing
                           if m.get("incident_id") == got["incident"]]

    # 1. rank 1 of the checkpoint job stopped; rank 0's next evaluation 10x as long,
    # or longer where evaluations are fast: it must outlast the floor by a margin,
    # or it ends a tick after it became a hang and opens no incident
    stop_pid = rank_pids(soak.jobs["checkpoint"])[1]
    soak.fault("eval", f"longeval:{long_factor(soak.jobs['eval'].output(), floor_s)}")
    long_began = wait_for(lambda: "long eval started" in soak.jobs["eval"].output() and
                          time.monotonic(), timeout, "the long evaluation")
    os.kill(stop_pid, signal.SIGSTOP)
    stopped = time.monotonic()
    measure("stopped", "checkpoint", stopped)
    os.kill(stop_pid, signal.SIGCONT)
    measure("long-eval", "eval", long_began)
    for name, since, fault in (("checkpoint", stopped, "stopped"), ("eval", long_began,
                                                                     "long-eval")):
        wait_for(lambda: resolved_since(soak, name, since), timeout, f"{fault} resolved")
        count(fault)
    # 2. rank 1 of the checkpoint job waits on a lock; rank 1 of the eval job spins
    locked = soak.fault("checkpoint", "lock:1")
    spun = soak.fault("eval", "spin:1")
    measure("lock", "checkpoint", locked)
    measure("spin", "eval", spun)
    count("lock")
    count("spin")
    return out


# Hangs where pauses usually are (docs/judgement-over-time.md "Is anybody working?"),
# in tests/jobs/pausesites.py: a FIFO put where a file was (an open() that waits
# forever: a mount that stalled, a pipe whose other end died), or a metrics server
# that stops answering. name -> (the job's flags, the path blocked, the culprit)
PAUSE_HANGS = {
    "loader-persistent": (["--workers", "2", "--persistent"], "data-rank1.bin", 1),
    "loader-forked": (["--workers", "2"], "data-rank1.bin", 1),
    "evaluation": (["--workers", "0", "--eval-every", "6"], "val.bin", 0),
    "checkpoint": (["--workers", "0", "--ckpt-every", "6"], "ckpt-rank0.pt", 0),
    "logging": (["--workers", "0", "--log-every", "4"], "", 0),
}


def pause_hangs(soak: Soak, timeout: float = 180.0) -> dict[str, dict]:
    """Each hang class in a job of its own, one after another, beside the soak's
    jobs: seconds from the fault to the first page, the rank it names and by
    which rule, and the incident's firing messages after 10 s more."""
    out = {}
    for name, (flags, blocked, culprit) in PAUSE_HANGS.items():
        data = os.path.join(soak.workdir, name)
        server = silent = None
        if not blocked:  # a metrics server that answers, then stops answering
            server, silent = _metrics_server()
            flags = flags + ["--log-to", f"127.0.0.1:{server.getsockname()[1]}"]
        port = free_port()
        job = soak.jobs[name] = soak._start(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
             "--master_addr=127.0.0.1", f"--master_port={port}",
             os.path.join(REPO, "tests", "jobs", "pausesites.py"), "--dir", data, *flags],
            {}, name)
        try:
            wait_for(lambda: "rank 1 step 3\n" in job.output() and soak.label_of(name),
                     timeout, f"{name}: past step 3 and watched")
            if blocked:
                os.mkfifo(os.path.join(data, "fifo"))
                os.replace(os.path.join(data, "fifo"), os.path.join(data, blocked))
            else:
                silent.set()
            began = time.monotonic()
            first = wait_for(lambda: pages_since(soak, name, began), timeout, f"{name}'s page")
            entry = soak.job_status().get(name, {})
            rule = next((r.get("rule") for r in entry.get("ranks", ())
                         if r.get("rank") == culprit), "?")
            time.sleep(10)  # then count: one incident, one page
            firing = pages_since(soak, name, began)
            out[name] = {"to_page_s": round(first[0][0] - began, 1),
                         "culprits": first[0][1].get("culprits"), "expected": [culprit],
                         "verdict": first[0][1].get("verdict"), "rule": rule,
                         "pages": len(firing)}
        finally:
            job.close()
            del soak.jobs[name]  # its log is closed: the jobs looked up by pid are live ones
            if server is not None:
                server.close()
    return out


def _metrics_server():
    """A line server on loopback that answers each line until `silent` is set."""
    import socket
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    silent = threading.Event()

    def serve():
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            f = conn.makefile("rb")
            while f.readline():
                if silent.is_set():
                    threading.Event().wait(86400)  # accepted, read, never answered
                conn.sendall(b"ok\n")
    threading.Thread(target=serve, daemon=True).start()
    return server, silent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0,
                        help="healthy training watched (after the jobs started)")
    parser.add_argument("--faults", action="store_true",
                        help="then inject faults mid-run and time their pages")
    parser.add_argument("--floor", type=float, default=300.0,
                        help="pause_floor_s of the daemon while healthy (default 300, the "
                             "daemon's own)")
    parser.add_argument("--fault-floor", type=float, default=20.0,
                        help="pause_floor_s for the faults, set by a reload (SIGHUP) before "
                             "them, so that the busy loop pages within the run (default 20)")
    parser.add_argument("--pauses", action="store_true",
                        help="then each hang at a pause site (tests/jobs/pausesites.py), "
                             "timed to its page")
    parser.add_argument("--jobs", choices=("all", "faulted", "more"), default="all",
                        help="all five jobs; the three the faults are given to (eval, "
                             "checkpoint, lightning); or the DataLoader and compile jobs")
    args = parser.parse_args()
    jobs = {"all": {**JOBS, **MORE_JOBS}, "faulted": JOBS, "more": MORE_JOBS}[args.jobs]
    if args.faults and args.jobs == "more":
        parser.error("--faults needs the eval and checkpoint jobs (--jobs all or faulted)")
    # a timeout's SIGTERM ends the run through `finally`: no job left behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    names = list(jobs)
    with tempfile.TemporaryDirectory(prefix="soak-") as workdir:
        soak = Soak(workdir, jobs, config={"pause_floor_s": args.floor,
                                           "resolve_after_s": 10})
        try:
            started = soak.wait_started()
            end = started + args.minutes * 60
            while time.monotonic() < end:
                time.sleep(min(5.0, max(0.0, end - time.monotonic())))
            hours = (time.monotonic() - started) / 3600
            # the daemon watches every job on the node: only ours count here
            ours = {soak.label_of(name) for name in names}
            firing = [(t, m) for t, m in soak.receiver.firing() if m.get("job") in ours]
            print(f"healthy training watched: {hours * 60:.1f} min, {len(names)} job(s) "
                  f"({', '.join(names)}), 2 CPU ranks each, pause_floor_s {args.floor:g}")
            print(f"false pages: {len(firing)} firing message(s), "
                  f"{len(firing) / hours / len(names):.2f} per job-hour (target 0)")
            if firing:
                print(soak.describe(firing, started))
            for name in names:
                print(f"  {name}: verdicts {dict(soak.verdicts_seen().get(name, {}))}; "
                      f"pauses named {dict(soak.pauses_seen().get(name, {}))}")
            if args.faults:
                if args.fault_floor != args.floor:
                    soak.reconfigure(pause_floor_s=args.fault_floor)
                    print(f"faults with pause_floor_s {args.fault_floor:g} (reloaded)")
                for fault, got in faults(soak, floor_s=args.fault_floor).items():
                    print(f"fault {fault} ({got['job']} job): first page after "
                          f"{got['to_page_s']}s, {got['pages']} firing message(s) for the "
                          f"incident ({', '.join(got['verdicts'])}), other incidents' "
                          f"{got['other'] or 'none'}; {got['summary'][:160]}")
            if args.pauses:
                for name, got in pause_hangs(soak).items():
                    right = "right" if got["culprits"] == got["expected"] else "WRONG"
                    print(f"pause hang {name}: first page after {got['to_page_s']}s naming "
                          f"rank(s) {got['culprits']} ({right}; {got['verdict']}, rule "
                          f"{got['rule']}), {got['pages']} firing message(s)")
        finally:
            soak.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
