"""The node's processes as discovery reads them: each one's parent, command line,
allow-listed environment, owner and start.

`read_table` reads every process once (`diagnose`, `ranks`). The daemon asks
every second, and most of a node's processes (agents, exporters, editors, a
shell's `sleep`) never change in a way discovery cares about; `TableReader`
learns each one once and reads again only what can become part of a job, so a
tick costs what the node's ranks cost, not what its other processes do
(docs/architecture.md "What a tick reads"; benchmarks/daemon.py --only flat).
"""
from __future__ import annotations

import collections
import dataclasses
import os
import time
from dataclasses import dataclass
from functools import cached_property

from ... import launchers as T
from . import launchers as L
from ..budget import MAX_PYTHON_PER_UID
from ..probes.process import (CLK_TCK, CMDLINE_LIMIT, ENVIRON_LIMIT, parse_cmdline,
                              parse_environ, parse_stat, read_head)


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    cmdline: tuple[str, ...]
    env: dict[str, str]
    start: int = -1   # clock ticks after boot (/proc/PID/stat field 22): spawn order,
                      # and with the pid who it is
    uid: int = -1     # the process's owner (of its /proc entries), -1 unknown
    foreground: bool = False  # in its terminal's foreground group: Ctrl-C reaches it
    # its executable (/proc/PID/exe) is a Python interpreter: a process that set its
    # title (Ray's "ray::RayTrainWorker", setproctitle, `exec -a`) is still Python
    exe_python: bool = False
    exe: str = ""     # /proc/PID/exe's target, "" when unreadable (kernel threads)

    # Asked of every process many times a tick (discovery's every test starts
    # with them): worked out once per ProcInfo, which TableReader keeps while
    # the process stays as it was.
    @cached_property
    def python(self) -> bool:
        """A Python process, by what it runs (its executable) or what it says (argv)."""
        return self.exe_python or L.is_python(self.cmdline)

    @cached_property
    def launcher(self) -> T.Launcher | None:
        """Its entry in the table of launchers if it is a launcher process
        (launchers.launcher_of), else None."""
        return L.launcher_of(self.cmdline)


class ProcTable(dict):
    """pid -> ProcInfo, with each process's children found once per table, not
    by a walk over every process each time a parent is asked about, and the
    processes that may be a job's (`candidates`). TableReader hands both over
    as it keeps them; a table built otherwise works them out when first asked."""

    def __init__(self, *args, children: dict | None = None,
                 candidates: frozenset[int] | None = None):
        super().__init__(*args)
        self._children = children      # ppid -> frozenset of pids
        self._candidates = candidates

    def children_of(self, pid: int) -> list[ProcInfo]:
        if self._children is None:
            index: dict[int, set] = {}
            for info in self.values():
                index.setdefault(info.ppid, set()).add(info.pid)
            self._children = index
        return [self[c] for c in self._children.get(pid, ()) if c in self]

    def candidates(self) -> frozenset[int]:
        """The pids of the Python processes and launchers: the only ones that
        can be a rank or a launcher (discovery.looks_like_rank, all_jobs)."""
        if self._candidates is None:
            self._candidates = frozenset(pid for pid, info in self.items()
                                         if info.python or info.launcher is not None)
        return self._candidates & self.keys()

    def __setitem__(self, pid, info):
        self._children = self._candidates = None
        super().__setitem__(pid, info)

    def __delitem__(self, pid):
        self._children = self._candidates = None
        super().__delitem__(pid)


def indexed(table: dict) -> ProcTable:
    """`table` as a ProcTable (unit tests build plain dicts)."""
    return table if isinstance(table, ProcTable) else ProcTable(table)


CACHE_AFTER_S = 2.0
# What the command lines kept between reads may cost, whatever users run: each
# entry is bounded (process.CMDLINE_LIMIT, MAX_ARGS, MAX_VALUE; OTHER_ARGS for
# processes that are neither Python nor a launcher), and the whole by this.
CACHE_BYTES = 4 * 2**20
OTHER_ARGS = 4  # launcher_kind looks at argv[:4]; nothing reads further in a non-Python process


def read_table(procfs: str = "/proc", cache: dict | None = None) -> ProcTable:
    """Every process's parent, command line and allow-listed environment.

    `cache` (kept by a caller that asks every second) maps a process's identity to
    its (cmdline, env), which change only at exec. The identity is pid, start time
    and the executable's path: a launch script that `exec`s torchrun changes the
    executable. A process younger than CACHE_AFTER_S is never cached: a fork not
    yet exec'd shows its parent's command line for a moment. The cache holds at
    most CACHE_BYTES (by `_cost`): past that, processes are read anew each time."""
    table, seen = ProcTable(), set()
    uptime = _uptime(procfs)
    budget = [sum(_cost(v) for v in cache.values()) if cache is not None else 0]
    for name in os.listdir(procfs):
        if not name.isdigit():
            continue
        read = _read_one(procfs, int(name), uptime, cache, budget)
        if read is None:
            continue
        info, key = read
        if key is not None:
            seen.add(key)
        table[info.pid] = info
    if cache is not None:
        for key in set(cache) - seen:
            del cache[key]
    return table


def _read_one(procfs: str, pid: int, uptime: float, cache: dict | None,
              budget: list[int], before: ProcInfo | None = None
              ) -> tuple[ProcInfo, tuple | None] | None:
    """One process, its (cmdline, env) from `cache` when it is old enough to
    have exec'd for good; `budget` ([bytes cached]) is updated. None: gone.
    `before`: what was read of the pid last time, given back as it is when
    nothing of it changed (no new ProcInfo built to be found equal: a tick
    reads every Python process of the node again)."""
    try:
        # the descriptor itself, not open()'s text stream: every Python process
        # of the node is read so each tick
        fd = os.open(f"{procfs}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            stat_fields = parse_stat(os.read(fd, 4096).decode("utf-8", "replace"))
            uid = os.fstat(fd).st_uid
        finally:
            os.close(fd)
        exe = _exe(procfs, pid)
        exe_python = L.is_python_exe(exe)
        key = None
        if cache is not None and uptime - stat_fields.start_time_s > CACHE_AFTER_S:
            key = (pid, stat_fields.start_time_s, exe)
        if key is not None and key in cache:
            cmdline, env = cache[key]
        else:
            cmdline, env = _read_exec(procfs, pid, exe_python)
            if key is not None and budget[0] + _cost((cmdline, env)) <= CACHE_BYTES:
                cache[key] = (cmdline, env)  # empty too: kernel threads, zombies
                budget[0] += _cost((cmdline, env))
    except (OSError, IndexError, ValueError):
        return None
    start = round(stat_fields.start_time_s * CLK_TCK)
    foreground = stat_fields.tty_nr != 0 and stat_fields.tpgid == stat_fields.pgrp > 0
    if (before is not None and before.cmdline is cmdline and before.env is env
            and before.start == start and before.ppid == stat_fields.ppid
            and before.uid == uid and before.foreground == foreground and before.exe == exe
            and before.exe_python == exe_python and before.pid == pid):
        return before, key  # every field as it was (_unchanged, the same test in full)
    return ProcInfo(pid, stat_fields.ppid, cmdline, env, start=start, uid=uid,
                    foreground=foreground, exe_python=exe_python, exe=exe), key


# A process becomes something else only by exec. Those that exec into a job
# long after they started are shells running a script: a batch script's
# closing `exec torchrun ...`, srun's `bash -c 'setup; exec python train.py'`.
SHELLS = frozenset(("sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox", "fish"))
# Every other process that is no part of a job is read again after REVISIT_S at
# the soonest, MAX_REVISITS of them a read, the longest unread first: what the
# other rules miss (a long-lived process other than a shell that execs into
# Python, an owner changed by a set-uid exec) is seen that late, and on a node of
# N such processes after N / MAX_REVISITS reads (10 min beside 5 000). A fixed
# number a read keeps a tick's cost flat in the node's idle processes
# (benchmarks/daemon.py --only flat). A pid reused is not left to this: it was
# given out since the last listing, and such pids are read again (`_given_out`).
REVISIT_S = 30.0
MAX_REVISITS = 8


def set_aside(info: ProcInfo) -> ProcInfo:
    """What is kept of a process past its user's MAX_PYTHON_PER_UID: who it is and
    what it runs, not its command line or environment, so it is no candidate,
    not read again each pass, and costs a few hundred bytes whatever its argv
    (3 000 processes of one user, each argv0 `python3` and 4 KB of arguments,
    took the daemon from 34 to 113 MB and its tick to ~1 s:
    tests/hostile/test_process_flood.py, benchmarks/hostile_scan.py --procs)."""
    return dataclasses.replace(info, cmdline=(), env={}, exe_python=False)


class TableReader:
    """The process table, read every second by the daemon, learning each process
    once. Read again at each `read`: processes that are or may become part of a
    job (Python, launchers, shells, writers of records, any process younger
    than CACHE_AFTER_S when last read), the parent of every new process (a
    shell that exec'd a launcher shows it by the ranks it starts), and new pids.
    Every other process keeps what was read of it, for REVISIT_S at most.
    A user but root has at most MAX_PYTHON_PER_UID candidates (Python processes
    and launchers), the first read; the rest are `set_aside` and read again as
    every other process is, taken in when one of the user's candidates ends;
    `set_aside_total` counts each once (ddpwatch_left_out_total{what="processes"}).

    New pids are found by listing /proc, which costs ~2 us a process (9 ms with
    5 000 on the machine of benchmarks/README.md): it is listed only when a
    process was created since the last listing (/proc/loadavg's last pid
    moved), else every REVISIT_S. A listing forgets the pids gone; between two,
    a process read again and gone is forgotten then."""

    def __init__(self, procfs: str = "/proc", clock=time.monotonic):
        self.procfs, self.clock = procfs, clock
        self._infos: dict[int, ProcInfo] = {}
        self._hot: set[int] = set()
        self._cold: collections.deque = collections.deque()  # (read at, pid), oldest first
        self._read_at: dict[int, float] = {}
        self._cache: dict = {}   # read_table's exec cache, for the hot processes
        self._keys: dict[int, tuple] = {}  # pid -> its key in the cache
        self._budget = [0]
        # ppid -> its children's pids; each table gets frozen copies of the sets
        # changed since the last (`_dirty`), the others shared with earlier tables
        self._kids: dict[int, set[int]] = {}
        self._frozen: dict[int, frozenset[int]] = {}
        self._dirty: set[int] = set()
        self._candidates: set[int] = set()  # Python processes and launchers
        self._uid_of: dict[int, int] = {}   # candidate pid -> the uid it is counted for
        self._per_uid: collections.Counter = collections.Counter()  # uid -> candidates
        self._aside: set[int] = set()       # pids set aside (`set_aside`)
        self.set_aside_total = 0
        self._last_pid: str | None = None   # /proc/loadavg's at the last listing
        self._listed_at = float("-inf")
        self.reads = 0           # processes read by the last `read` (benchmarks)
        self.listed = False      # whether the last `read` listed /proc
        # the last table given out, given again while no process changed: a
        # ProcTable copies every process's entry (5 000 of them beside a steady
        # job cost its tick a tenth: benchmarks/daemon.py --only flat)
        self._table: ProcTable | None = None
        self._changed = True

    def read(self, hot: frozenset[int] = frozenset()) -> ProcTable:
        """The table now; `hot`: pids to read again whatever they look like (the
        writers of records the last pass saw)."""
        procfs, now = self.procfs, self.clock()
        self.reads, new = 0, set()
        last_pid = _last_pid(procfs)
        self.listed = (last_pid is None or last_pid != self._last_pid
                       or now - self._listed_at >= REVISIT_S)
        reused: set[int] = set()
        if self.listed:
            try:
                pids = {int(n) for n in os.listdir(procfs) if n.isdigit()}
            except OSError:
                return ProcTable()
            given = _given_out(self._last_pid, last_pid)
            self._last_pid, self._listed_at = last_pid, now
            for pid in self._infos.keys() - pids:
                self._forget(pid)
            new = pids - self._infos.keys()
            # a known pid given out again since the last listing is another
            # process now (its old one ended in between): read it anew
            known = pids - new - self._hot
            for given_out in given:  # whichever is shorter is walked
                if len(given_out) < len(known):
                    reused.update(p for p in given_out if p in known)
                else:
                    reused.update(p for p in known if p in given_out)
        uptime = _uptime(procfs)
        parents = set()
        for pid in new:
            info = self._read(pid, uptime, now)
            if info is not None:
                parents.add(info.ppid)
        again = (self._hot | reused | (parents - new) | (hot & self._infos.keys())) - new
        for pid in again:
            self._read(pid, uptime, now)
        revisits = 0
        while self._cold and revisits < MAX_REVISITS and now - self._cold[0][0] >= REVISIT_S:
            read_at, pid = self._cold.popleft()
            if self._read_at.get(pid) == read_at and pid not in again:
                self._read(pid, uptime, now)
                revisits += 1
        for ppid in self._dirty:
            if self._kids.get(ppid):
                self._frozen[ppid] = frozenset(self._kids[ppid])
            else:
                self._kids.pop(ppid, None)
                self._frozen.pop(ppid, None)
        self._dirty.clear()
        if self._changed or self._table is None:
            self._table = ProcTable(self._infos, children=dict(self._frozen),
                                    candidates=frozenset(self._candidates))
            self._changed = False
        return self._table

    def _read(self, pid: int, uptime: float, now: float) -> ProcInfo | None:
        self.reads += 1
        before = self._infos.get(pid)
        read = _read_one(self.procfs, pid, uptime, self._cache, self._budget, before)
        if read is None:
            self._forget(pid)
            return None
        info, key = read
        if before is not None and (info is before or _unchanged(before, info)):
            # The object read before stays, with what was worked out of it
            # (`python`, `launcher`: a launcher_of per hot process per tick was
            # a tenth of an 8-rank job's tick; benchmarks/README.md "The 8-rank
            # tick's own profile")
            info = before
        elif before is None or before.ppid != info.ppid:
            if before is not None:
                self._unparent(before)
            self._kids.setdefault(info.ppid, set()).add(pid)
            self._dirty.add(info.ppid)
        if info is not before:
            self._changed = True
        if info.python or info.launcher is not None:
            if (pid not in self._candidates and info.uid != 0
                    and self._per_uid[info.uid] >= MAX_PYTHON_PER_UID):
                info = set_aside(info)
                if pid not in self._aside:
                    self._aside.add(pid)
                    self.set_aside_total += 1
                self._changed = True
            else:
                self._aside.discard(pid)
                if self._uid_of.get(pid) != info.uid:  # new, or its owner changed
                    self._uncandidate(pid)
                    self._candidates.add(pid)
                    self._uid_of[pid] = info.uid
                    self._per_uid[info.uid] += 1
        else:
            self._uncandidate(pid)
        self._infos[pid] = info
        self._read_at[pid] = now
        if self._keys.get(pid) != key:
            self._uncache(pid)
        if pid not in self._aside and (
                pid in self._candidates or os.path.basename(info.exe) in SHELLS
                or uptime - info.start / CLK_TCK < CACHE_AFTER_S):
            self._hot.add(pid)
            if key is not None and key in self._cache:
                self._keys[pid] = key
        else:  # what was read of it is kept as it is: its command line needs no cache
            self._uncache(pid)
            if key is not None and key in self._cache:
                self._budget[0] -= _cost(self._cache.pop(key))
            self._hot.discard(pid)
            self._cold.append((now, pid))
        return info

    def _uncandidate(self, pid: int) -> None:
        self._candidates.discard(pid)
        uid = self._uid_of.pop(pid, None)
        if uid is not None:
            self._per_uid[uid] -= 1
            if self._per_uid[uid] <= 0:
                del self._per_uid[uid]

    def _unparent(self, info: ProcInfo) -> None:
        self._kids.get(info.ppid, set()).discard(info.pid)
        self._dirty.add(info.ppid)

    def _uncache(self, pid: int) -> None:
        key = self._keys.pop(pid, None)
        if key is not None and key in self._cache:
            self._budget[0] -= _cost(self._cache.pop(key))

    def _forget(self, pid: int) -> None:
        info = self._infos.pop(pid, None)
        if info is not None:
            self._unparent(info)
            self._changed = True
        self._read_at.pop(pid, None)
        self._hot.discard(pid)
        self._uncandidate(pid)
        self._aside.discard(pid)
        self._uncache(pid)


def _unchanged(before: ProcInfo, now: ProcInfo) -> bool:
    """The same process read again with nothing changed: the dataclass's own
    equality, every field (one added later too). Command line and environment
    come from the exec cache, the same objects while the process is
    (`read_table`), and a tuple's comparison takes the same object for equal
    without comparing inside it."""
    return before == now


PID_LIMIT = 1 << 22  # the most pid_max may be (PID_MAX_LIMIT on 64-bit Linux)


def _given_out(before: str | None, now: str | None) -> tuple[range, ...]:
    """The pids given out after `before` up to `now` (/proc/loadavg's last pid
    at two listings): the kernel gives pids out in a cycle, each after the last,
    back to the lowest past pid_max. Unknown (no /proc/loadavg, the first
    listing): none is taken for reused, which is left to the revisits."""
    try:
        low, high = int(before), int(now)
    except (TypeError, ValueError):
        return ()
    if low == high:
        return ()
    if low < high:
        return (range(low + 1, high + 1),)
    return (range(low + 1, PID_LIMIT + 1), range(1, high + 1))  # wrapped past pid_max


def _last_pid(procfs: str) -> str | None:
    """The pid most recently given out (/proc/loadavg's last field); None unknown."""
    try:
        with open(f"{procfs}/loadavg") as f:
            return f.read().rsplit(None, 1)[-1]
    except (OSError, IndexError):
        return None


def _uptime(procfs: str) -> float:
    try:
        with open(f"{procfs}/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0  # unknown: then nothing is old enough to cache


def _exe(procfs: str, pid: int) -> str:
    try:
        return os.readlink(f"{procfs}/{pid}/exe")
    except OSError:
        return ""  # kernel threads, or another user's process


def _cost(entry: tuple) -> int:
    """About what one cached (cmdline, env) holds in memory, in bytes: a str is
    ~50 bytes of header, a tuple or dict slot 8 to ~100."""
    cmdline, env = entry
    return (120 + sum(57 + len(a) for a in cmdline)
            + sum(200 + len(k) + len(v) for k, v in env.items()))


def _read_exec(procfs: str, pid: int, exe_python: bool = False
               ) -> tuple[tuple[str, ...], dict[str, str]]:
    cmdline = parse_cmdline(read_head(f"{procfs}/{pid}/cmdline", CMDLINE_LIMIT))
    env = {}
    if exe_python or L.is_python(cmdline) or L.launcher_of(cmdline) is not None:
        try:
            env = parse_environ(read_head(f"{procfs}/{pid}/environ", ENVIRON_LIMIT))
        except OSError:
            pass
    else:  # `sleep`, shells, editors: only whether it launches anything is asked of them
        cmdline = cmdline[:OTHER_ARGS]
    return cmdline, env
