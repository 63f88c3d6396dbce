"""Process probe: what /proc says about each rank, its threads and its launch.

READ is `read_process` / `_read_thread` / `run` (tiny, impure: files under
`ctx.procfs`); PARSE is `parse_*` and `env_from_cmdline` (pure, tested on saved
fixtures; torchrun's flags are read by ddpwatch/launchers.py `torchrun_args`, with
the other launchers' conventions). Counters are cumulative (cpu seconds,
schedstat): the classifier takes deltas between two snapshots, so CPU% is never
computed here.

Unknown numbers are -1 (never 0: a blind watcher must not look idle or healthy).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from functools import cached_property

from ... import codec
from ...launchers import ENV_VARS as LAUNCHER_ENV, torchrun_args
from ..budget import MAX_THREADS, MAX_WORKERS
from . import Look, Pass, ProbeContext, failure, register

CLK_TCK = os.sysconf("SC_CLK_TCK")

# Only these variables leave the host: an environment can hold secrets. Torch's,
# NCCL's and ddpwatch's own, and every variable the table of launchers reads (ranks,
# worlds, what groups a job: ddpwatch/launchers.py ENV_VARS).
ENV_ALLOW = frozenset((
    "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
    "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "DDPWATCH_DIR", "TORCH_DISTRIBUTED_DEBUG",
)) | LAUNCHER_ENV


@dataclass(frozen=True)
class SchedStat:
    """/proc/PID/task/TID/schedstat. Run-queue wait growing while run time does not
    is a CPU-starved thread (straggler); neither growing is a blocked one."""
    run_s: float
    runqueue_wait_s: float
    timeslices: int


NO_SCHEDSTAT = SchedStat(-1.0, -1.0, -1)  # kernel without CONFIG_SCHED_INFO, or unreadable


@dataclass(frozen=True)
class StatFields:
    """The fields of /proc/PID/stat that ddpwatch uses (times in seconds)."""
    pid: int
    comm: str
    state: str
    ppid: int
    pgrp: int
    session: int
    cpu_seconds: float
    num_threads: int
    start_time_s: float
    processor: int
    tty_nr: int = 0    # its controlling terminal (0: none)
    tpgid: int = -1    # that terminal's foreground process group


@dataclass(frozen=True)
class ThreadObs:
    tid: int
    comm: str
    state: str
    wchan: str  # kernel function the thread sleeps in ("" when running/unknown)
    cpu_seconds: float
    processor: int  # CPU it last ran on
    sched: SchedStat


@dataclass(frozen=True)
class IoCounters:
    """/proc/PID/io, cumulative: bytes passed to read()/write() and their kin
    (rchar, wchar: files, pipes, terminals; not send/recv on sockets, which the
    sockets probe counts) and bytes it made storage fetch or take (read_bytes,
    write_bytes). Whether a rank that waits outside the collectives still works:
    a checkpoint written, a DataLoader's batches read from its workers' pipes
    (docs/judgement-over-time.md "Is anybody working?"). Its owner's or root's
    to read."""
    rchar: int
    wchar: int
    read_bytes: int
    write_bytes: int


@dataclass(frozen=True)
class WorkerObs:
    """A child process of a rank, one that may work for it while it waits: a
    DataLoader's worker, torch.compile's, a subprocess it runs. Cumulative
    counters, as a rank's; -1 unknown."""
    pid: int
    state: str = ""
    start_time_s: float = -1.0
    cpu_seconds: float = -1.0
    runqueue_wait_s: float = -1.0  # its main thread's (/proc/PID/schedstat)
    io: IoCounters | None = None


@dataclass(frozen=True)
class ProcessObs:
    """One pid. `error` is "" when observed, else what `failure` made of it
    ("gone", "denied: ...": see `outcome`) and the other fields keep their defaults."""
    pid: int
    error: str = ""
    ppid: int = -1
    pgrp: int = -1
    comm: str = ""
    cmdline: tuple[str, ...] = ()
    state: str = ""  # R S D T(SIGSTOP) t(debugger stop) Z X I
    uid: int = -1
    tracer_pid: int = 0  # non-zero: a debugger (or py-spy --native) is attached
    start_time_s: float = -1.0  # since boot; with pid it identifies the process (pid reuse)
    cpu_seconds: float = -1.0
    num_threads: int = -1
    rss_bytes: int = -1
    cpus_allowed: tuple[int, ...] = ()
    threads: tuple[ThreadObs, ...] = ()
    children: tuple[int, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # allow-listed ENV_ALLOW only
    env_source: str = ""  # "environ" | "cmdline" (environ unreadable/empty) | "none"
    torchrun: dict[str, str] = field(default_factory=dict)  # launcher flags, if a launcher
    io: IoCounters | None = None  # None: unreadable (another user's, without root)
    # its children but the job's own processes (MAX_WORKERS at most): who may
    # work for it while it waits (judge/signals/work.py)
    workers: tuple[WorkerObs, ...] = ()


@dataclass(frozen=True)
class Processes:
    taken_at: float  # ctx.clock() when read
    uptime_s: float
    clk_tck: int
    procs: tuple[ProcessObs, ...]

    @cached_property
    def by_pid(self) -> dict[int, ProcessObs]:
        """pid -> the first of its readings without an error: judging 256 ranks
        looks each up several times (judge/signals/lookup.py proc_of)."""
        return {p.pid: p for p in reversed(self.procs) if not p.error}


# ---------------------------------------------------------------- PARSE (pure)

def parse_stat(text: str, clk_tck: int = CLK_TCK) -> StatFields:
    """/proc/PID/stat. comm sits in parens and may itself hold spaces and parens
    (`prctl(PR_SET_NAME, "a) S (b")`), so split at the *last* ')'."""
    head, _, tail = text.rpartition(")")
    pid_s, _, comm = head.partition(" (")
    f = tail.split()
    # f[0] is field 3 (state) of proc(5); field n is f[n - 3].
    return StatFields(
        pid=int(pid_s), comm=comm, state=f[0], ppid=int(f[1]), pgrp=int(f[2]),
        session=int(f[3]), cpu_seconds=(int(f[11]) + int(f[12])) / clk_tck,
        num_threads=int(f[17]), start_time_s=int(f[19]) / clk_tck,
        processor=int(f[36]) if len(f) > 36 else -1, tty_nr=int(f[4]), tpgid=int(f[5]))


def parse_status(text: str, keys: tuple[str, ...] | None = None) -> dict[str, str]:
    """/proc/PID/status as {key: raw value}; with `keys`, those alone (found by
    their line's start: a rank's status is read every tick, and four of its
    ~55 lines are used)."""
    if keys is None:
        pairs = (line.partition(":") for line in text.splitlines())
        return {key: value.strip() for key, sep, value in pairs if sep}
    lines = "\n" + text  # every line, the first too, starts after a newline
    found = {}
    for key in keys:
        start = lines.find(f"\n{key}:")
        if start >= 0:
            start += len(key) + 2
            end = lines.find("\n", start)
            found[key] = lines[start:end if end >= 0 else None].strip()
    return found


STATUS_KEYS = ("Uid", "TracerPid", "VmRSS", "Cpus_allowed_list")  # what read_process uses


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """'0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11)."""
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(cpus)


def parse_io(text: str) -> IoCounters:
    """/proc/PID/io ('rchar: 123' lines); ValueError when a field is missing."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    try:
        return IoCounters(int(fields["rchar"]), int(fields["wchar"]),
                          int(fields["read_bytes"]), int(fields["write_bytes"]))
    except KeyError as err:
        raise ValueError(f"/proc/PID/io without {err}") from None


def parse_schedstat(text: str) -> SchedStat:
    """'run_ns wait_ns timeslices'."""
    run_ns, wait_ns, slices = text.split()[:3]
    return SchedStat(int(run_ns) / 1e9, int(wait_ns) / 1e9, int(slices))


# A process's argv and environment are its owner's, any size (`ulimit -s unlimited`
# gives megabytes): the daemon reads only their head, and keeps a bounded part of
# that. What discovery needs is at the front of argv (the interpreter, a launcher's
# flags, `--local-rank`, `--multiprocessing-fork`); torchrun appends RANK & co. to
# its workers' environment after the user's own, which on HPC nodes with modules
# loaded runs to tens of KiB, so environ gets more room than argv. The read buffer
# is transient (one process at a time); what is kept is the allow-listed part.
CMDLINE_LIMIT = 4096
ENVIRON_LIMIT = 32 * 1024
MAX_ARGS = 128
MAX_VALUE = 256  # an allow-listed variable's value (hostnames, ports, paths)


def read_head(path: str, limit: int) -> bytes:
    """At most `limit` bytes of `path` from its start; when the file held more, cut
    back to the last NUL so no half-read argument or variable is taken for a whole
    one (`MASTER_PORT=29500` read as `MASTER_PORT=295`)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks, left = [], limit + 1  # one byte more tells "exactly limit" from "more"
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        data = data[:data.rfind(b"\0", 0, limit) + 1]
    return data


def parse_cmdline(data: bytes, max_args: int = MAX_ARGS) -> tuple[str, ...]:
    """NUL-separated argv, its first `max_args`. Kernel threads and zombies have
    none: ()."""
    if data.endswith(b"\0"):
        data = data[:-1]
    if not data:
        return ()
    return tuple(a.decode("utf-8", "replace") for a in data.split(b"\0", max_args)[:max_args])


def parse_environ(data: bytes, allow: frozenset[str] = ENV_ALLOW) -> dict[str, str]:
    """NUL-separated exec-time environment, restricted to `allow`, each value cut
    to MAX_VALUE characters."""
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        k = key.decode("utf-8", "replace")
        if sep and k in allow:
            env[k] = value[:MAX_VALUE].decode("utf-8", "replace")
    return env


def env_from_cmdline(cmdline: tuple[str, ...]) -> dict[str, str]:
    """Best-effort ENV_ALLOW values when environ is unreadable: from launcher flags,
    or a script's `--local-rank N` (what torch.distributed.launch passes)."""
    args = torchrun_args(cmdline)
    env: dict[str, str] = {}
    simple = {"nproc_per_node": "LOCAL_WORLD_SIZE", "master_addr": "MASTER_ADDR",
              "master_port": "MASTER_PORT", "node_rank": "GROUP_RANK",
              "rdzv_id": "TORCHELASTIC_RUN_ID"}
    for dest, var in simple.items():
        if dest in args:
            env[var] = args[dest]
    # With the c10d rendezvous, workers reuse the agent's store at the rendezvous
    # endpoint as their MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE).
    endpoint = args.get("rdzv_endpoint", "")
    if endpoint and "MASTER_ADDR" not in env:
        host, sep, port = endpoint.rpartition(":")
        if sep and port.isdigit() and not host.endswith(":"):
            env["MASTER_ADDR"], env["MASTER_PORT"] = host.strip("[]"), port
        else:  # no port: torchrun's default 29400 applies, don't guess
            env["MASTER_ADDR"] = endpoint.strip("[]")
    if not args:
        for i, arg in enumerate(cmdline):
            name, eq, value = arg.partition("=")
            if name in ("--local-rank", "--local_rank"):
                value = value if eq else (cmdline[i + 1] if i + 1 < len(cmdline) else "")
                if value.isdigit():
                    env["LOCAL_RANK"] = value
    return env


# ---------------------------------------------------------------- READ (impure)

_CHUNK = 65536


def _read(path: str, binary: bool = False):
    # For regular files and /proc files of one record only: a table of many
    # (/proc/net/tcp) may come back short of its end at any read.
    # The file descriptor itself: open()'s buffered text stream costs more than
    # the small read (a rank's stat, status and each thread's schedstat, every tick)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, _CHUNK)
        # A read that did not fill the buffer was the whole file: a regular file
        # short of EOF fills it, and a /proc file of one record (stat, status,
        # schedstat, wchan) is made whole at the first read. So the one more
        # read that only says EOF is left out: half the reads of a tick.
        if len(data) == _CHUNK:
            chunks = [data]
            while chunk := os.read(fd, _CHUNK):
                chunks.append(chunk)
            data = b"".join(chunks)
    finally:
        os.close(fd)
    return data if binary else data.decode("utf-8", "replace")


def all_pids(procfs: str = "/proc") -> tuple[int, ...]:
    return tuple(sorted(int(d) for d in os.listdir(procfs) if d.isdigit()))


def ppid_map(procfs: str = "/proc") -> dict[int, int]:
    """{pid: ppid} of every readable process (vanishing ones are skipped)."""
    out = {}
    for pid in all_pids(procfs):
        try:
            out[pid] = parse_stat(_read(f"{procfs}/{pid}/stat")).ppid
        except (OSError, ValueError, IndexError):
            continue
    return out


def read_state(procfs: str, pid: int) -> str:
    """The state letter of one pid, "" if it cannot be read (for other probes)."""
    try:
        return parse_stat(_read(f"{procfs}/{pid}/stat")).state
    except (OSError, ValueError, IndexError):
        return ""


def _read_thread(procfs: str, pid: int, tid: int, detail: bool = True) -> ThreadObs | None:
    """One thread; without `detail` only its schedstat (state, wchan, CPU unknown)."""
    base = f"{procfs}/{pid}/task/{tid}"
    if detail:
        try:
            st = parse_stat(_read(f"{base}/stat"))
        except (OSError, ValueError, IndexError):
            return None  # thread exited between listdir and read
        try:
            wchan = _read(f"{base}/wchan").strip()
        except OSError:
            wchan = ""
    try:
        sched = parse_schedstat(_read(f"{base}/schedstat"))
    except (OSError, ValueError):
        if not detail and not os.path.isdir(base):
            return None  # thread exited between listdir and read
        sched = NO_SCHEDSTAT  # a kernel without CONFIG_SCHED_INFO has no file
    if not detail:
        return ThreadObs(tid, "", "", "", -1.0, -1, sched)
    return ThreadObs(tid, st.comm, st.state, "" if wchan == "0" else wchan,
                     st.cpu_seconds, st.processor, sched)


def read_io(procfs: str, pid: int) -> IoCounters | None:
    try:
        return parse_io(_read(f"{procfs}/{pid}/io"))
    except (OSError, ValueError):
        return None  # gone, or another user's (ptrace access is asked)


def read_worker(procfs: str, pid: int) -> WorkerObs | None:
    """A rank's child, three small files; None once it is gone."""
    try:
        st = parse_stat(_read(f"{procfs}/{pid}/stat"))
    except (OSError, ValueError, IndexError):
        return None
    try:
        wait_s = parse_schedstat(_read(f"{procfs}/{pid}/schedstat")).runqueue_wait_s
    except (OSError, ValueError):
        wait_s = -1.0
    return WorkerObs(pid, st.state, st.start_time_s, st.cpu_seconds, wait_s,
                     read_io(procfs, pid))


def read_process(procfs: str, pid: int, children: tuple[int, ...] = (),
                 exec_info: tuple | None = None, thread_detail: bool = True,
                 budget=None) -> ProcessObs:
    """Everything about one pid; per-pid failures become `error`, never raise.

    exec_info: the pid's (cmdline, allow-listed env) when the caller already has them."""
    base = f"{procfs}/{pid}"
    try:
        st = parse_stat(_read(f"{base}/stat"))
        status = parse_status(_read(f"{base}/status"), STATUS_KEYS)
    except (OSError, ValueError, IndexError) as err:  # gone, denied; or a torn file
        return ProcessObs(pid, error=failure(err))
    if exec_info is not None:
        cmdline, env = exec_info
        source = "environ" if env else ""
    else:
        try:
            cmdline = parse_cmdline(read_head(f"{base}/cmdline", CMDLINE_LIMIT))
        except OSError:
            cmdline = ()
        try:  # zombies answer ESRCH, other users' processes EACCES
            env = parse_environ(read_head(f"{base}/environ", ENVIRON_LIMIT))
            source = "environ" if env else ""
        except OSError:
            env, source = {}, ""
    if not env:
        env = env_from_cmdline(cmdline)
        source = "cmdline" if env else "none"
    try:  # the task directory lists threads oldest first; any user may start
        # 4 000 of them: the listing stops past the cap (budget.MAX_THREADS)
        with os.scandir(f"{base}/task") as entries:
            tids = sorted(int(e.name) for _, e in zip(range(MAX_THREADS + 1), entries)
                          if e.name.isdigit())
    except OSError:
        tids = []
    if len(tids) > MAX_THREADS:
        if budget is not None:
            budget.count("threads", max(1, st.num_threads - MAX_THREADS))
        tids = tids[:MAX_THREADS]
    threads = tuple(t for t in (_read_thread(procfs, pid, tid, thread_detail)
                           for tid in tids) if t)
    uid = status.get("Uid", "-1").split()[0]
    rss_kb = status.get("VmRSS", "").split()
    return ProcessObs(
        pid=pid, ppid=st.ppid, pgrp=st.pgrp, comm=st.comm, cmdline=cmdline,
        state=st.state, uid=int(uid), tracer_pid=int(status.get("TracerPid", "0")),
        start_time_s=st.start_time_s, cpu_seconds=st.cpu_seconds,
        num_threads=st.num_threads, rss_bytes=int(rss_kb[0]) * 1024 if rss_kb else 0,
        cpus_allowed=parse_cpu_list(status.get("Cpus_allowed_list", "")),
        threads=threads, children=children, env=env, env_source=source,
        torchrun=torchrun_args(cmdline), io=read_io(procfs, pid))


# per-rank /proc: state, cpu, threads, wchan, schedstat, env
@register("process", switchable=False, field="processes", with_launcher=True)
def run(ctx: ProbeContext, seen: Pass, pids: tuple[int, ...]) -> Processes:
    """Every thread's state, wchan and CPU from Look.DETAIL on; at a glance only
    their schedstat (run-queue wait, which straggler rules use): the daemon's
    pass over a healthy job, a third of the files. Parents, command lines and
    environments come from the pass's table when it has read them."""
    taken_at = ctx.clock()
    table = seen.table
    if hasattr(table, "children_of"):  # a ProcTable's index, not a walk of every process
        kids = {pid: [c.pid for c in table.children_of(pid)] for pid in pids}
    else:
        parents = ({pid: info.ppid for pid, info in table.items()} if table is not None
                   else ppid_map(ctx.procfs))
        kids = {}
        for child, parent in parents.items():
            kids.setdefault(parent, []).append(child)
    try:
        uptime = float(_read(f"{ctx.procfs}/uptime").split()[0])
    except (OSError, ValueError, IndexError):
        uptime = -1.0
    known = table or {}
    procs = tuple(read_process(ctx.procfs, pid, tuple(sorted(kids.get(pid, ()))),
                               _exec_info(known.get(pid)), seen.look >= Look.DETAIL,
                               seen.budget)
                  for pid in pids)
    own = set(pids)
    procs = tuple(dataclasses.replace(p, workers=_workers(ctx.procfs, p, own, seen.budget))
                  if p.children and not p.error else p for p in procs)
    return Processes(taken_at, uptime, CLK_TCK, procs)


def _workers(procfs: str, p: ProcessObs, own: set, budget) -> tuple[WorkerObs, ...]:
    """The children that may work for rank `p`, not the job's own processes (a
    launcher's children are its ranks). Any user may fork thousands: past
    MAX_WORKERS they are counted, not read."""
    kids = [c for c in p.children if c not in own]
    if len(kids) > MAX_WORKERS and budget is not None:
        budget.count("workers", len(kids) - MAX_WORKERS)
    return tuple(w for w in (read_worker(procfs, c) for c in kids[:MAX_WORKERS]) if w)


def _exec_info(info) -> tuple | None:
    """(cmdline, allow-listed env) of a discovery.ProcInfo: they change only at exec."""
    return (info.cmdline, info.env) if info is not None else None


def from_json(obj) -> Processes:
    """Replay a saved snapshot's process data (codec.to_json / dataclasses.asdict)."""
    return codec.from_json(Processes, obj)
