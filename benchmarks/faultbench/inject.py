"""The faults, given from outside the job where possible (signals, cgroups, CPU
competitors), and for each a check that the state was really reached before
anything is scored: a scenario whose injection did nothing raises NotReached and
fails loudly instead of scoring ddpwatch on a healthy job.

A fault is `kind` plus options (benchmarks/faults.yaml):
  signal   {signal: SIGSTOP, rank: R} or {signal: SIGTERM, to: launcher}
  handler  {action: raise|async-raise|gil|sleep|spin, rank: R}: SIGUSR2 to the rank,
           whose tests/jobs/thirdparty/faults.py acts on it (env set at the job's start)
  quota    {rank: R, percent: P}: the rank moved into a CPU cgroup with that quota
  compete  {rank: R, busy: N}: the rank pinned to the last CPU, N busy processes there
  duty     {rank: R, stop_s: S, run_s: S}: SIGSTOP and SIGCONT, over and over
  flag     {line: REGEX}: the job's own fault flag (args/env), seen when it prints the line
  fifo     {path: NAME, rank: R}: the file NAME of the job's directory replaced by a
           FIFO (an open() there waits for ever, as on a dead mount); reached
           when a process of the job waits in the kernel's wait_for_partner
  mute     {rank: R}: the job's metrics server (faultbench/logserver.py) stops
           answering; reached when a line went unanswered
  twin     {}: a second identical job started beside the first (a negative)
  link     {node: N}: two-node runs only: every packet between the nodes dropped on
           node N from mid-run (faultbench/nodes.py; `firewall` {node: N}, new
           connections dropped from before the start, is given there too)
  none     {}: nothing (a negative: healthy training, the job's own pauses)
Each returns an Injection: `at` (monotonic time of the fault), `what` (said in the
report) and `undo()`."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from .waiting import NotReached, wait_for

ACTIONS = ("raise", "async-raise", "gil", "sleep", "spin")  # "-now": in the handler


@dataclass
class Injection:
    at: float
    what: str
    undo_steps: list = field(default_factory=list)

    def undo(self) -> None:
        for step in reversed(self.undo_steps):
            try:
                step()
            except (OSError, RuntimeError, subprocess.SubprocessError):
                pass


def job_env(fault: dict) -> dict:
    """What the job's environment needs for `fault` (set at its start)."""
    if fault["kind"] == "handler":
        if fault["action"].removesuffix("-now") not in ACTIONS:
            raise ValueError(f"handler action {fault['action']!r} (known: {', '.join(ACTIONS)})")
        return {"DDPWATCH_TEST_ON_SIGUSR2": fault["action"]}
    return {}


def state(pid: int) -> str:
    """/proc/PID/stat's state letter; '' when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def gone(pid: int) -> bool:
    return state(pid) in ("", "Z", "X")


@dataclass
class Context:
    """What some faults need besides the job: a second job, its directory, its
    metrics server."""
    start_twin: object = None
    workdir: str = ""
    logserver: object = None
    pair: object = None  # the two nodes of a two-node run (faultbench/nodes.py Pair)
    undo: list = field(default_factory=list)  # what the fault being given must undo


def inject(fault: dict, job, ranks: dict[int, int], ctx: Context) -> Injection:
    """The fault given; its undo steps are registered as it goes, so that one whose
    state is never reached is undone before NotReached leaves (a busy process, a
    cgroup or a stop/resume thread must not outlive the run)."""
    kind = fault["kind"]
    if kind not in KINDS:
        raise ValueError(f"fault kind {kind!r} (known: {', '.join(KINDS)})")
    ctx.undo = []
    try:
        inj = KINDS[kind](fault, job, ranks, ctx)
    except BaseException:
        Injection(0.0, "", ctx.undo).undo()
        raise
    inj.undo_steps = ctx.undo + inj.undo_steps
    return inj


def _signal(fault, job, ranks, ctx):
    sig = getattr(signal, fault["signal"])
    if fault.get("to") == "launcher":
        pid = job.launcher_pid
        os.kill(pid, sig)
        at = time.monotonic()
        # the whole job asked to stop: every process of it ends
        wait_for(lambda: not job.pids(), 90, f"the job gone after {fault['signal']} to its "
                 "launcher", job.output)
        return Injection(at, f"{fault['signal']} to the launcher (pid {pid})")
    pid = ranks[fault["rank"]]
    os.kill(pid, sig)
    at = time.monotonic()
    inj = Injection(at, f"{fault['signal']} to rank {fault['rank']} (pid {pid})")
    if sig == signal.SIGSTOP:
        ctx.undo.append(lambda: os.kill(pid, signal.SIGCONT))
        wait_for(lambda: state(pid) == "T", 5, f"rank {fault['rank']} stopped (state T)")
    elif "handled" in fault:
        # a job that handles the signal itself (Lightning: it may end or hang in
        # its handler): reached when the job's own line says the handler ran
        line = re.compile(fault["handled"])
        wait_for(lambda: line.search(job.output()), 30,
                 f"rank {fault['rank']}'s handler of {fault['signal']} ({fault['handled']!r})",
                 job.output)
    else:
        wait_for(lambda: gone(pid), 30, f"rank {fault['rank']} gone after {fault['signal']}",
                 job.output)
    return inj


FAULT_LINE = re.compile(r"thirdparty: fault (\S+) pid=(\d+) at=([\d.]+)")


def _handler(fault, job, ranks, ctx):
    pid = ranks[fault["rank"]]
    os.kill(pid, signal.SIGUSR2)
    sent = time.monotonic()

    def said():
        return next(((a, float(t)) for a, p, t in FAULT_LINE.findall(job.output())
                     if int(p) == pid), None)
    action, wall = wait_for(said, 30, f"rank {fault['rank']} to act on SIGUSR2 "
                            "(DDPWATCH_TEST_ON_SIGUSR2 set, faults.py imported?)", job.output)
    if action != fault["action"]:
        raise NotReached(f"rank {fault['rank']} did {action}, not {fault['action']}")
    # the handler ran at `wall` (its own clock): the fault's moment on ours
    at = min(time.monotonic(), max(sent, time.monotonic() - (time.time() - wall)))
    inj = Injection(at, f"{action} in rank {fault['rank']} (pid {pid}), at SIGUSR2")
    if action.removesuffix("-now") in ("raise", "async-raise"):
        wait_for(lambda: gone(pid), 30, f"rank {fault['rank']} ended by its exception",
                 job.output)
    else:
        want = "R" if action.startswith("spin") else "S"
        wait_for(lambda: _mostly(pid, want), 15, f"rank {fault['rank']} in state {want}")
    return inj


def _mostly(pid: int, letter: str, n: int = 10) -> bool:
    """The main thread in state `letter` in most of n readings 50 ms apart."""
    seen = 0
    for _ in range(n):
        seen += state(pid) == letter
        time.sleep(0.05)  # readings spread over half a second: one is no evidence
    return seen > n // 2


def _cpu_cgroup() -> tuple[str, str]:
    """A CPU cgroup hierarchy to make a child in (as tests/thirdparty does)."""
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        with open("/sys/fs/cgroup/cgroup.controllers") as f:
            if "cpu" in f.read().split():
                return "v2", "/sys/fs/cgroup"
    if os.path.exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
        return "v1", "/sys/fs/cgroup/cpu"
    raise NotReached("no CPU cgroup hierarchy to set a quota in")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _throttled(group: str) -> int:
    with open(os.path.join(group, "cpu.stat")) as f:
        return int(dict(line.split() for line in f)["nr_throttled"])


def _quota(fault, job, ranks, ctx):
    version, root = _cpu_cgroup()
    pid = ranks[fault["rank"]]
    group = os.path.join(root, f"ddpwatch-faultbench-{os.getpid()}-{pid}")
    os.mkdir(group)
    inj = Injection(0.0, f"rank {fault['rank']} (pid {pid}) in a cgroup with "
                         f"{fault['percent']}% of a CPU")

    def remove():
        try:
            _write(os.path.join(root, "cgroup.procs"), str(pid))
        except OSError:
            pass  # gone with its job
        wait_for(lambda: _rmdir(group), 30, f"{group} removed")
    ctx.undo.append(remove)
    quota = int(fault["percent"]) * 1000
    if version == "v2":
        _write(os.path.join(root, "cgroup.subtree_control"), "+cpu")
        _write(os.path.join(group, "cpu.max"), f"{quota} 100000")
    else:
        _write(os.path.join(group, "cpu.cfs_period_us"), "100000")
        _write(os.path.join(group, "cpu.cfs_quota_us"), str(quota))
    _write(os.path.join(group, "cgroup.procs"), str(pid))
    inj.at = time.monotonic()
    before = _throttled(group)
    wait_for(lambda: _throttled(group) > before + 3, 10, f"rank {fault['rank']} throttled")
    return inj


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _schedstat(pid: int) -> tuple[float, float]:
    run = wait = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
        except OSError:
            continue
        run, wait = run + int(fields[0]) / 1e9, wait + int(fields[1]) / 1e9
    return run, wait


def _compete(fault, job, ranks, ctx):
    """Busy processes on the rank's CPU, each in a session of its own: with autogroup
    scheduling, loops started from one session take at most half of a core from a
    job in another (README "A rank starved of CPU")."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise NotReached("compete needs 2 CPUs")
    pid = ranks[fault["rank"]]
    mine, theirs = cpus[-1], ",".join(str(c) for c in cpus[:-1])
    for rank, other in ranks.items():
        subprocess.run(["taskset", "-a", "-p", "-c", str(mine) if rank == fault["rank"]
                        else theirs, str(other)], check=True, stdout=subprocess.DEVNULL)
    busy = [subprocess.Popen(["taskset", "-c", str(mine), sys.executable, "-c",
                              "while True: pass"], start_new_session=True,
                             stdin=subprocess.DEVNULL) for _ in range(int(fault["busy"]))]
    at = time.monotonic()
    inj = Injection(at, f"rank {fault['rank']} (pid {pid}) pinned to CPU {mine} beside "
                        f"{len(busy)} busy processes")

    def stop():
        for p in busy:
            p.kill()
        for p in busy:
            p.wait(timeout=30)
    ctx.undo.append(stop)

    def starved():
        r0, w0 = _schedstat(pid)
        time.sleep(1.0)  # a measurement window, not a synchronisation
        r1, w1 = _schedstat(pid)
        return (w1 - w0) / max(1e-9, (r1 - r0) + (w1 - w0)) > 0.3
    wait_for(starved, 15, f"rank {fault['rank']} waiting for its CPU over 30% of the time")
    return inj


def _duty(fault, job, ranks, ctx):
    pid = ranks[fault["rank"]]
    done = threading.Event()
    cycles = [0]

    def cycle():
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            done.wait(float(fault["stop_s"]))
            os.kill(pid, signal.SIGCONT)
            cycles[0] += 1
            done.wait(float(fault["run_s"]))
    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    at = time.monotonic()
    inj = Injection(at, f"rank {fault['rank']} (pid {pid}) stopped {fault['stop_s']} s "
                        f"and resumed for {fault['run_s']} s, over and over")

    def stop():
        done.set()
        thread.join(timeout=5)
        os.kill(pid, signal.SIGCONT)
    ctx.undo.append(stop)
    wait_for(lambda: cycles[0] >= 3 and not gone(pid), 10, "three stop/resume cycles")
    return inj


def _flag(fault, job, ranks, ctx):
    pattern = re.compile(fault["line"])
    wait_for(lambda: pattern.search(job.output()), float(fault.get("within_s", 120)),
             f"the job's own fault ({fault['line']!r} in its output)", job.output)
    return Injection(time.monotonic(), f"the job's fault flag ({fault['line']})")


def _waiting_on_fifo(pids) -> bool:
    """A thread of any of `pids` waits in open() of a FIFO for its other end."""
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                    if f.read().strip() == "wait_for_partner":
                        return True
            except OSError:
                continue
    return False


def _fifo(fault, job, ranks, ctx):
    path = os.path.join(ctx.workdir, fault["path"])
    tmp = f"{path}.fifo"
    os.mkfifo(tmp)
    os.replace(tmp, path)  # atomically: a reader opens the file or the FIFO, never nothing
    at = time.monotonic()
    inj = Injection(at, f"{fault['path']} replaced by a FIFO (open() blocks)")
    wait_for(lambda: _waiting_on_fifo(job.pids()), float(fault.get("reach_s", 60)),
             f"a process of the job blocked opening {fault['path']}", job.output)
    return inj


def _mute(fault, job, ranks, ctx):
    ctx.logserver.mute()
    at = time.monotonic()
    wait_for(lambda: ctx.logserver.unanswered > 0, 60,
             "a line the muted metrics server left unanswered", job.output)
    return Injection(at, "the metrics server stopped answering")


def _twin(fault, job, ranks, ctx):
    twin = ctx.start_twin()
    ctx.undo.append(twin.close)
    wait_for(lambda: len(twin.ranks()) >= len(ranks), 240, "the twin job's ranks",
             twin.output)
    return Injection(time.monotonic(), "a second identical job beside it")


def _link(fault, job, ranks, ctx):
    if ctx.pair is None:
        raise ValueError("fault kind 'link' needs a two-node framework (nodes: 2)")
    from .nodes import link_down  # nodes.py builds on this module
    return link_down(fault, job, ranks, ctx)


def _none(fault, job, ranks, ctx):
    if not all(not gone(p) for p in ranks.values()):
        raise NotReached("a rank of the healthy job is gone")
    return Injection(time.monotonic(), "nothing")


KINDS = {"signal": _signal, "handler": _handler, "quota": _quota, "compete": _compete,
         "duty": _duty, "flag": _flag, "fifo": _fifo, "mute": _mute, "twin": _twin,
         "link": _link, "none": _none}
