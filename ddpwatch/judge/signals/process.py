"""Process family: what /proc says of a rank over the window. Pure."""
from __future__ import annotations

from ...observe.snapshot import Snapshot
from .lookup import Window, proc_of
from .spec import NUMBER, declare, one_of

SIGNALS = declare(
    ("pid", int, "process id"),
    ("rank", int, "global rank (env or heartbeat), -1 unknown"),
    ("world_size", int, "world size, -1 unknown", "count"),
    ("alive", bool, "the rank's process exists"),
    ("state", one_of("R", "S", "D", "T", "t", "Z", "X", "I"),
     "process state letter (proc(5)): R running, S sleeping, D disk, T stopped, t stopped "
     "by a tracer, Z zombie, X dead, I idle kernel thread"),
    ("cpu_ratio", NUMBER, "CPU used over the window, in cores (1.0 = one core busy)", "cores"),
    ("runqueue_wait_ratio", NUMBER,
     "time the rank's threads waited for a CPU over the window, in cores", "cores"),
    ("cpu_wait_share", NUMBER,
     "share of the time its threads wanted a CPU that they spent waiting for one (run-queue "
     "wait over run time plus wait, schedstat): near 0 on a free CPU, n/(n+1) beside n busy "
     "processes", "share"),
    ("cpus", str, "the CPUs the rank may run on (its affinity), e.g. 1 or 0-1"),
    ("competitors", str, "other processes that ran on those CPUs through the window (state R "
                         "at both ends, CPU time grown): the busiest, with their share of a "
                         "core"),
    ("orphan", bool, "a leftover: its parent is gone (re-parented to init), it makes no "
                     "progress and no rank of its job is alive beside it (launch.orphan "
                     "decides, after the peers)"),
    ("intra_op_threads", int, "OMP_NUM_THREADS of the rank (torch's default: all cores)", "count"),
    ("window_s", NUMBER, "seconds between the oldest and newest snapshot", "s"),
    ("all_ranks_local", bool, "every rank of the job runs on this node (master on loopback, "
                              "or LOCAL_WORLD_SIZE == WORLD_SIZE)"),
    ("launcher_only", bool, "a launcher with no rank processes"),
)

IDLE_CPU = 0.05  # cores: below this a rank is not computing
LOCAL_ADDRS = frozenset(("127.0.0.1", "localhost", "::1"))


def measure(history: tuple[Snapshot, ...], pid: int) -> dict:
    w = Window(history[0], history[-1])
    now, before = proc_of(w.last, pid), proc_of(w.first, pid)
    s: dict = {"pid": pid, "window_s": round(w.seconds, 3), "alive": now is not None}
    if now is None:
        return s
    env = now.env
    if (not env and before is not None and before.env
            and before.start_time_s == now.start_time_s):
        # An exiting process's environ reads empty once its memory is released
        # (a rank tearing down after a peer died), and an environment does not
        # change but by exec: the same process's earlier reading stands.
        env = before.env
    s["state"] = now.state
    s["rank"] = int(env["RANK"]) if env.get("RANK", "").isdigit() else -1
    s["world_size"] = int(env["WORLD_SIZE"]) if env.get("WORLD_SIZE", "").isdigit() else -1
    s["orphan"] = now.ppid == 1
    # Where the peers are: with the master on loopback every rank runs here.
    s["all_ranks_local"] = env.get("MASTER_ADDR", "") in LOCAL_ADDRS or env.get(
        "LOCAL_WORLD_SIZE", "-") == env.get("WORLD_SIZE")
    omp = env.get("OMP_NUM_THREADS", "")
    s["intra_op_threads"] = int(omp) if omp.isdigit() else None
    if before is not None and w.seconds > 0 and now.cpu_seconds >= 0 and before.cpu_seconds >= 0:
        s["cpu_ratio"] = round((now.cpu_seconds - before.cpu_seconds) / w.seconds, 3)
        # -1 marks an unreadable schedstat: leave those threads out
        wait_now = sum(t.sched.runqueue_wait_s for t in now.threads if t.sched.runqueue_wait_s >= 0)
        wait_before = sum(t.sched.runqueue_wait_s for t in before.threads
                          if t.sched.runqueue_wait_s >= 0)
        s["runqueue_wait_ratio"] = round(max(wait_now - wait_before, 0.0) / w.seconds, 3)
        share = wait_share(before.threads, now.threads)
        if share is not None:
            s["cpu_wait_share"] = share
    if now.cpus_allowed:
        s["cpus"] = cpu_list(now.cpus_allowed)
        named = competing(w.first.competitors, w.last.competitors, set(now.cpus_allowed))
        if named is not None:
            s["competitors"] = named
    return s


def wait_share(before, now) -> float | None:
    """Run-queue wait over (run + wait) of the threads seen at both ends of the
    window (a thread that started or ended inside it has no difference), None
    when nothing ran or waited or schedstat is unreadable."""
    then = {t.tid: t.sched for t in before if t.sched.run_s >= 0}
    run = wait = 0.0
    for t in now:
        old = then.get(t.tid)
        if old is None or t.sched.run_s < 0:
            continue
        run += max(t.sched.run_s - old.run_s, 0.0)
        wait += max(t.sched.runqueue_wait_s - old.runqueue_wait_s, 0.0)
    return round(wait / (run + wait), 3) if run + wait > 0 else None


COMPETING_CPU = 0.03  # cores over the window: below, a process only passed by (8 busy
# processes beside a rank on one core get about 0.1 each)
SHOWN = 3


def cpu_list(cpus) -> str:
    """(0, 1, 2, 5) -> '0-2,5'."""
    runs, out = [], []
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    for a, b in runs:
        out.append(str(a) if a == b else f"{a}-{b}")
    return ",".join(out)


def competing(first, last, cpus: set[int]) -> str | None:
    """The processes running on `cpus` at both ends of the window, busiest first
    ("4 processes: python pid 812 25%, ..."); None when not looked at."""
    if first is None or last is None or last.taken_at <= first.taken_at:
        return None
    seconds = last.taken_at - first.taken_at
    then = {c.pid: c for c in first.procs}
    busy = []
    for c in last.procs:
        old = then.get(c.pid)
        if old is not None and c.processor in cpus and old.comm == c.comm:
            share = (c.cpu_seconds - old.cpu_seconds) / seconds
            if share >= COMPETING_CPU:
                busy.append((share, c))
    if not busy:
        return None
    busy.sort(key=lambda sc: -sc[0])
    shown = ", ".join(f"{c.comm} pid {c.pid} {share:.0%}" for share, c in busy[:SHOWN])
    more = f" and {len(busy) - SHOWN} more" if len(busy) > SHOWN else ""
    return f"{len(busy)} process{'es' if len(busy) > 1 else ''}: {shown}{more}"
