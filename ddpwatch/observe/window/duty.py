"""How each rank spent a window: its threads' states sampled many times, and
its cgroup's CPU throttling. One or two readings are no evidence: a
rank stopped 70% of the time, or throttled by a CPU quota, reads sometimes
stopped, sometimes running, and healthy DDP ranks spend many readings in the
same wait as a blocked one.

READ is `read_states` / `read_cgroup` (small, impure: files under a procfs and
a cgroup root); PARSE is `parse_*` (pure); `DutyWatch` accumulates readings
between the sampler's snapshots and freezes them into `Duty` for the snapshot.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

# threads read per rank and reading, up to ten times a second (a rank has tens;
# any user can start thousands): bounds a reading's cost (observe/budget.py)
MAX_THREADS = 64


@dataclass(frozen=True)
class Throttle:
    """cpu.stat of the rank's cgroup: v2 (throttled_usec) or v1's cpu controller
    (throttled_time, ns); -1 unknown."""
    periods: int
    throttled_periods: int
    throttled_s: float


@dataclass(frozen=True)
class RankDuty:
    pid: int
    samples: int        # readings taken
    stopped: int        # readings with the process stopped (T, t)
    running: int        # readings with a thread running or runnable (R)
    asleep: int         # readings with every thread asleep (S, D, I)
    cgroup: str = ""    # the cgroup whose cpu.stat was read ("" none readable)
    quota_cores: float = -1.0  # the cgroup's CPU limit in cores; -1 none or unknown
    throttle_first: Throttle | None = None
    throttle_last: Throttle | None = None
    # changes between stopped and not stopped from one reading to the next: a rank
    # duty-cycled by SIGSTOP/SIGCONT switches again and again, one stopped (or
    # resumed) during the window once; -1: not counted (snapshots of older versions)
    switches: int = -1
    main_only: bool = False  # read its main thread only (the daemon's glance rate)


@dataclass(frozen=True)
class Duty:
    seconds: float      # from the first reading to the last
    ranks: tuple[RankDuty, ...]

    @cached_property
    def by_pid(self) -> dict[int, RankDuty]:
        """pid -> its first reading (judge/signals/window.py, once per rank)."""
        return {d.pid: d for d in reversed(self.ranks)}


# ---------------------------------------------------------------- PARSE (pure)

def parse_state(stat_text: str) -> str:
    """The state letter of a /proc/PID(/task/TID)/stat ("" if unreadable)."""
    tail = stat_text.rpartition(")")[2].split()
    return tail[0] if tail else ""


def parse_cgroup(text: str) -> tuple[str, str]:
    """/proc/PID/cgroup -> ("v2", path) for the unified hierarchy, ("v1", path)
    for a v1 hierarchy holding the cpu controller (preferred: it has the quota),
    ("", "") if neither. Paths are the kernel's, but are checked anyway."""
    v1 = v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not _safe(path):
            continue
        if controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    if v1 is not None:
        return "v1", v1
    return ("v2", v2) if v2 is not None else ("", "")


def _safe(path: str) -> bool:
    return path.startswith("/") and ".." not in path.split("/") and "\0" not in path


def parse_cpu_stat(text: str) -> Throttle:
    kv = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            kv[key] = int(value)
    if "throttled_usec" in kv:
        throttled = kv["throttled_usec"] / 1e6
    elif "throttled_time" in kv:
        throttled = kv["throttled_time"] / 1e9
    else:
        throttled = -1.0
    return Throttle(kv.get("nr_periods", -1), kv.get("nr_throttled", -1), throttled)


def parse_quota(version: str, cpu_max: str = "", quota_us: str = "", period_us: str = "") -> float:
    """Cores allowed: v2 `cpu.max` "max 100000" / "20000 100000"; v1
    cfs_quota_us (-1: none) over cfs_period_us. -1.0 when unlimited or unknown."""
    try:
        if version == "v2":
            quota, _, period = cpu_max.split()[0], None, cpu_max.split()[1]
            return -1.0 if quota == "max" else int(quota) / int(period)
        quota, period = int(quota_us), int(period_us)
        return quota / period if quota > 0 and period > 0 else -1.0
    except (ValueError, IndexError, ZeroDivisionError):
        return -1.0


# ---------------------------------------------------------------- READ (impure)

def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read(65536)


def _state(path: str) -> str:
    """The state letter in a stat file, read as bytes: the daemon reads its ranks'
    several times a second (no text layer to build each time)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, 4096)  # a stat line is ~300 bytes (comm: 16 at most)
    finally:
        os.close(fd)
    return parse_state(data.decode("ascii", "replace"))


def read_states(procfs: str, pid: int, threads: bool = True
                ) -> tuple[str, tuple[str, ...]] | None:
    """(process state, its threads' states), None if gone. Without `threads`, the
    main thread's state stands for them (one read instead of one per thread)."""
    try:
        state = _state(f"{procfs}/{pid}/stat")
        if not threads:
            return state, (state,)
        with os.scandir(f"{procfs}/{pid}/task") as entries:  # stops at the cap:
            tids = [e.name for _, e in zip(range(MAX_THREADS), entries)]  # 4 000 cost
    except OSError:
        return None
    states = []
    for tid in tids:
        try:
            states.append(_state(f"{procfs}/{pid}/task/{tid}/stat"))
        except OSError:
            continue  # exited between listdir and read
    return state, tuple(states)


def read_cgroup(procfs: str, cgroot: str, pid: int) -> tuple[str, float, Throttle | None]:
    """(cgroup directory, quota in cores, cpu.stat) of `pid`'s CPU cgroup."""
    try:
        version, path = parse_cgroup(_read(f"{procfs}/{pid}/cgroup"))
    except OSError:
        return "", -1.0, None
    if not version:
        return "", -1.0, None
    # the v1 cpu controller may be mounted as cpu or cpu,cpuacct; v2 at the root
    # or beside v1 under unified/
    bases = ([f"{cgroot}/cpu", f"{cgroot}/cpu,cpuacct"] if version == "v1"
             else [cgroot, f"{cgroot}/unified"])
    for base in bases:
        directory = os.path.normpath(base + path)
        try:
            throttle = parse_cpu_stat(_read(f"{directory}/cpu.stat"))
        except OSError:
            continue
        try:
            if version == "v2":
                quota = parse_quota("v2", cpu_max=_read(f"{directory}/cpu.max"))
            else:
                quota = parse_quota("v1", quota_us=_read(f"{directory}/cpu.cfs_quota_us"),
                                    period_us=_read(f"{directory}/cpu.cfs_period_us"))
        except OSError:
            quota = -1.0  # the root cgroup has no limit files
        return directory, quota, throttle
    return "", -1.0, None


def _cpu_stat(directory: str) -> Throttle | None:
    try:
        return parse_cpu_stat(_read(f"{directory}/cpu.stat"))
    except OSError:
        return None


class DutyWatch:
    """Readings of a job's ranks between two snapshots: `read()` as often as the
    caller can afford (diagnose: every 50 ms over its window), `freeze()` for
    the snapshot."""

    def __init__(self, pids: tuple[int, ...], clock, procfs: str = "/proc",
                 cgroot: str = "/sys/fs/cgroup", cgroups: dict | None = None):
        """`cgroups`: pid -> read_cgroup(...) already read (the daemon hands on
        the last window's; a cpu.stat of None is read at the first reading),
        else read at the first reading: a window nobody reads (the daemon's
        readings off) costs no cgroup file."""
        self.pids, self.clock, self.procfs, self.cgroot = pids, clock, procfs, cgroot
        # samples stopped running asleep switches
        self.counts = {pid: [0, 0, 0, 0, 0] for pid in pids}
        self.was_stopped: dict[int, bool] = {}
        self.main_only = True  # until a reading of every thread
        self.first_at = self.last_at = None
        self.known = cgroups or {}
        self.cgroups: dict | None = None  # pid -> (directory, quota, cpu.stat at the start)
        self.last_cgroups: dict | None = None  # the same, cpu.stat at the end (freeze)

    def _start(self) -> dict:
        """Each rank's cgroup and its cpu.stat as the window's readings begin."""
        if self.cgroups is None:
            cgroups = {}
            first_stat: dict[str, Throttle | None] = {}  # once per cgroup, as in freeze
            for pid in self.pids:
                directory, quota, first = self.known.get(pid) or read_cgroup(
                    self.procfs, self.cgroot, pid)
                if first is None and directory:
                    if directory not in first_stat:
                        first_stat[directory] = _cpu_stat(directory)
                    first = first_stat[directory]
                cgroups[pid] = (directory, quota, first)
            self.cgroups = cgroups
        return self.cgroups

    def handed_on(self) -> dict:
        """What the next window may take of this one's cgroups (`cgroups`): their
        cpu.stat now where this window read (freeze), else which cgroup and its
        quota alone (a cpu.stat from before the next window's readings would
        stretch its throttling over time it did not read)."""
        if self.last_cgroups is not None:
            return self.last_cgroups
        return {pid: (d, q, None) for pid, (d, q, _) in (self.cgroups or self.known).items()}

    @property
    def readings(self) -> int:
        return max((c[0] for c in self.counts.values()), default=0)

    def read(self, threads: bool = True) -> None:
        self._start()
        now = self.clock()
        self.first_at = now if self.first_at is None else self.first_at
        self.last_at = now
        self.main_only = self.main_only and not threads
        for pid in self.pids:
            seen = read_states(self.procfs, pid, threads)
            if seen is None:
                continue
            state, threads_seen = seen
            c = self.counts[pid]
            c[0] += 1
            stopped = state in ("T", "t")
            if pid in self.was_stopped and self.was_stopped[pid] != stopped:
                c[4] += 1
            self.was_stopped[pid] = stopped
            if stopped:
                c[1] += 1
            elif "R" in threads_seen or state == "R":
                c[2] += 1
            elif threads_seen and all(t in ("S", "D", "I") for t in threads_seen):
                c[3] += 1

    def freeze(self) -> Duty:
        ranks = []
        cgroups = self._start()
        last_cgroups = {}  # pid -> (directory, quota, cpu.stat now): the next window's
        # each cgroup's cpu.stat read once: a job's ranks mostly share one (a
        # 256-rank job's look read the same file 256 times: benchmarks/daemon.py
        # --only tick)
        now_stat: dict[str, Throttle | None] = {}
        for pid in self.pids:
            directory, quota, first = cgroups[pid]
            # the same cgroup's cpu.stat at the window's end (which cgroup and its
            # quota were read once, when the rank was first watched)
            if directory and directory not in now_stat:
                now_stat[directory] = _cpu_stat(directory)
            last = now_stat.get(directory) if directory else None
            last_cgroups[pid] = (directory, quota, last)
            samples, stopped, running, asleep, switches = self.counts[pid]
            ranks.append(RankDuty(pid, samples, stopped, running, asleep, cgroup=directory,
                                  quota_cores=quota, throttle_first=first, throttle_last=last,
                                  switches=switches, main_only=self.main_only))
        self.last_cgroups = last_cgroups
        seconds = (self.last_at - self.first_at) if self.first_at is not None else 0.0
        return Duty(round(seconds, 4), tuple(ranks))


def merge(duties) -> Duty | None:
    """The duties of consecutive windows (oldest first) as one: the daemon reads
    between its ticks and judges over several. Pure."""
    duties = [d for d in duties if d is not None]
    if not duties:
        return None
    if len(duties) == 1:
        return duties[0]
    ranks = []
    by_pid: dict[int, list[RankDuty]] = {}  # in order: a job's ranks over its windows
    for d in duties:
        for r in d.ranks:
            by_pid.setdefault(r.pid, []).append(r)
    for pid, mine in by_pid.items():
        last = mine[-1]
        switches = -1 if any(r.switches < 0 for r in mine) else sum(r.switches for r in mine)
        ranks.append(RankDuty(
            pid, sum(r.samples for r in mine), sum(r.stopped for r in mine),
            sum(r.running for r in mine), sum(r.asleep for r in mine), cgroup=last.cgroup,
            quota_cores=last.quota_cores,
            # the throttling over the whole span, when one cgroup held it throughout
            throttle_first=mine[0].throttle_first if all(
                r.cgroup == last.cgroup for r in mine) else last.throttle_first,
            throttle_last=last.throttle_last, switches=switches,
            main_only=any(r.main_only for r in mine)))
    return Duty(round(sum(d.seconds for d in duties), 4), tuple(ranks))
