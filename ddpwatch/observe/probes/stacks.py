"""Stacks probe: where each rank's Python threads are, via `py-spy dump --json`.

Expensive (tens of ms per pid, ~0.5-1 s with native frames for a torch process):
run on suspicion or on demand. READ: `run`, `dump_pid`; PARSE: `parse_dump` (pure).

What py-spy 0.4.3 does, measured on this project's fixtures (tests/fixtures/pyspy):
* `--nonblocking` reads memory without pausing the target (no ptrace). It even works
  on a SIGSTOPped process, but ddpwatch never dumps one (state T/t): a blocking dump
  of a stopped process fails ("Failed to suspend process ... unexpected waitpid
  result PtraceEvent(..SIGSTOP..)") and a stopped rank's verdict needs no stack.
* `--native` refuses `--nonblocking` ("Can't get native stack traces with the
  --nonblocking option", exit 1): native frames need ptrace, which pauses the rank
  for the dump. So native is only tried on R/S processes (ptrace on D waits for the
  sleep to end), and after a failed or timed-out native dump the probe checks that
  it did not leave the rank stopped, and sends SIGCONT if it did.
* Only threads that hold a Python thread state are listed: Gloo's `gloo_tcp_loop` /
  `pt_gloo_runloop` threads never appear (see the process probe's thread comms).
* C functions have no Python frame: a rank in `time.sleep` shows only the calling
  line (`<module> train.py:12`); the native dump adds `time_sleep`/`clock_nanosleep`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from functools import cached_property

from ... import codec
from ..system import programs
from . import Look, Pass, ProbeContext, register
from ..budget import MAX_DUMP_THREADS
from .process import parse_schedstat, parse_stat, read_state


@dataclass(frozen=True)
class Frame:
    name: str  # function ("Reducer::finalize_backward" for native frames)
    filename: str
    module: str  # shared object of a native frame, "" for Python frames
    short_filename: str
    line: int  # 0 for native frames


@dataclass(frozen=True)
class ThreadStack:
    thread_id: int  # pthread id as py-spy reports it
    os_thread_id: int  # the TID /proc knows; -1 if py-spy could not tell
    name: str
    active: bool  # False: idle (py-spy's heuristic: waiting in a syscall/lock)
    owns_gil: bool
    frames: tuple[Frame, ...]  # innermost first, as py-spy gives them


@dataclass(frozen=True)
class PidStacks:
    """status: "ok" | "stopped: not dumped" | "traced: not dumped" | "zombie: not
    dumped" | "gone" | "error" (with `error`). `native` tells whether native frames
    are included; a failed native attempt falls back to Python frames and says why
    in `error` while status stays "ok"."""
    pid: int
    status: str
    state: str = ""
    native: bool = False
    threads: tuple[ThreadStack, ...] = ()
    error: str = ""
    # The main thread's run time (schedstat, s) read just before the dump; -1
    # unknown. A main thread that waits runs none: once it has run since, the
    # dump no longer says where it waits (judge/signals/stack.py `measure`).
    main_run_s: float = -1.0
    # a worker's dump: the rank (pid) it works for, 0 for a rank's own. A rank
    # waiting for its DataLoader is judged by whether its workers work; where an
    # idle one waits is the evidence (judge/signals/work.py idle_worker)
    worker_of: int = 0


@dataclass(frozen=True)
class Stacks:
    taken_at: float
    py_spy: str
    pids: tuple[PidStacks, ...]

    @cached_property
    def by_pid(self) -> dict[int, tuple[PidStacks, ...]]:
        """pid -> its dumps in this reading, in order (judge/signals/lookup.py
        stacks_of looks up every rank in every reading of the window)."""
        out: dict[int, list] = {}
        for p in self.pids:
            out.setdefault(p.pid, []).append(p)
        return {pid: tuple(found) for pid, found in out.items()}


# ---------------------------------------------------------------- PARSE (pure)

def parse_dump(text: str) -> tuple[ThreadStack, ...]:
    """`py-spy dump --json` output: a list of threads with frames."""
    threads = []
    for t in json.loads(text):
        frames = tuple(Frame(f.get("name") or "", f.get("filename") or "",
                             f.get("module") or "", f.get("short_filename") or "",
                             int(f.get("line") or 0)) for f in t.get("frames") or ())
        os_tid = t.get("os_thread_id")
        threads.append(ThreadStack(int(t.get("thread_id") or 0),
                                   -1 if os_tid is None else int(os_tid),
                                   t.get("thread_name") or "", bool(t.get("active")),
                                   bool(t.get("owns_gil")), frames))
    return tuple(threads)


def error_summary(stderr: str) -> str:
    """py-spy's error and its 'Caused by' chain, without the Rust backtrace."""
    text = stderr.split("Stack backtrace:")[0]
    return " ".join(text.split())[:300]


# A stopped (T) or debugger-stopped (t) process is never dumped; zombies and dead
# tasks have no memory to read. Native (ptrace) only on running/sleeping ones.
_SKIP = {"T": "stopped: not dumped", "t": "traced: not dumped",
         "Z": "zombie: not dumped", "X": "gone"}
_NATIVE_OK = {"R", "S"}


# ---------------------------------------------------------------- READ (impure)

def find_py_spy() -> str | None:
    """The py-spy installed next to our interpreter first (a pyenv shim on PATH
    costs a bash + pyenv exec per dump), else the system's, else PATH; found once."""
    return programs.path("py-spy")  # resolved once (observe/system/programs.py)


def _state_and_threads(procfs: str, pid: int) -> tuple[str, int]:
    """(state letter, thread count) from one read of /proc/PID/stat; ("", 0) if gone."""
    try:
        with open(f"{procfs}/{pid}/stat") as f:
            st = parse_stat(f.read())
        return st.state, st.num_threads
    except (OSError, ValueError, IndexError):
        return "", 0


def _main_run_s(procfs: str, pid: int) -> float:
    """The main thread's (tid = pid) run time so far, -1 if unreadable."""
    try:
        with open(f"{procfs}/{pid}/task/{pid}/schedstat") as f:
            return parse_schedstat(f.read()).run_s
    except (OSError, ValueError):
        return -1.0


def _command(py_spy: str, pid: int, native: bool) -> list[str]:
    return [py_spy, "dump", "--pid", str(pid), "--json",
            "--native" if native else "--nonblocking"]


def _resume_if_left_stopped(procfs: str, pid: int) -> None:
    """py-spy --native ptrace-stops the rank; if it died mid-dump (our timeout),
    make sure the rank is not left in T. It was R/S before, so T now is ours."""
    if read_state(procfs, pid) == "T":
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass


def _finish(proc: subprocess.Popen, deadline: float) -> tuple[str, str]:
    """stdout/stderr of a running dump, killing it at the deadline."""
    try:
        out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"py-spy exit {proc.returncode}: {error_summary(err or out)}")
    return out, err


def run_dumps(ctx: ProbeContext, py_spy: str, pids: tuple[int, ...], native: bool = False,
              budget=None) -> tuple[PidStacks, ...]:
    """Dump all pids concurrently (each py-spy is mostly waiting on /proc reads);
    one shared deadline of ctx.timeout_s, doubled when `native` frames are wanted
    (symbol loading for libtorch takes ~0.5-1 s). `budget`: the pass's
    (observe/budget.py), told of the ranks left out."""
    read = {pid: _state_and_threads(ctx.procfs, pid) for pid in pids}
    states = {pid: state for pid, (state, _) in read.items()}
    ran: dict[int, float] = {}
    results: dict[int, PidStacks] = {}
    running: dict[int, tuple[subprocess.Popen, bool]] = {}
    for pid in pids:
        state, threads = read[pid]
        if not state:
            results[pid] = PidStacks(pid, "gone")
        elif state in _SKIP:
            results[pid] = PidStacks(pid, _SKIP[state], state)
        elif threads > MAX_DUMP_THREADS:
            # py-spy reads every thread: 4 000 of them take it seconds, and any
            # user can start that many (tests/hostile/test_hostile_second.py)
            if budget is not None:
                budget.count("threads", threads - MAX_DUMP_THREADS)
            results[pid] = PidStacks(pid, "error", state, error=(
                f"left out: {threads} threads, more than the {MAX_DUMP_THREADS} a dump "
                f"may read"))
        else:
            with_native = native and state in _NATIVE_OK
            ran[pid] = _main_run_s(ctx.procfs, pid)  # before the dump: see PidStacks
            running[pid] = (subprocess.Popen(
                _command(py_spy, pid, with_native), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, start_new_session=True), with_native)
    deadline = time.monotonic() + ctx.timeout_s * (2 if native else 1)
    for pid, (proc, with_native) in running.items():
        state, note = states[pid], ""
        try:
            out, _ = _finish(proc, deadline)
            results[pid] = PidStacks(pid, "ok", state, with_native, parse_dump(out),
                                     main_run_s=ran.get(pid, -1.0))
            continue
        except (subprocess.TimeoutExpired, RuntimeError, ValueError) as err:
            note = ("timeout" if isinstance(err, subprocess.TimeoutExpired)
                    else str(err))
        if with_native:  # never leave a rank paused; then retry without pausing it
            _resume_if_left_stopped(ctx.procfs, pid)
            try:
                retry = subprocess.Popen(_command(py_spy, pid, False), stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True,
                                         start_new_session=True)
                out, _ = _finish(retry, time.monotonic() + ctx.timeout_s)
                results[pid] = PidStacks(pid, "ok", state, False, parse_dump(out),
                                         f"native failed: {note}", ran.get(pid, -1.0))
                continue
            except (subprocess.TimeoutExpired, RuntimeError, ValueError) as err:
                note = f"native failed: {note}; python: " + (
                    "timeout" if isinstance(err, subprocess.TimeoutExpired) else str(err))
        gone = not read_state(ctx.procfs, pid)
        results[pid] = PidStacks(pid, "gone" if gone else "error", state, error=note)
    return tuple(results[pid] for pid in pids)


# py-spy dump --nonblocking of each rank (--native on request), never of a stopped
# process; costly and needs ptrace access to the ranks: only at Look.STACKS, budgeted
@register("stacks", look=Look.STACKS, budgeted=True)
def run(ctx: ProbeContext, seen: Pass, pids: tuple[int, ...], native: bool = False) -> Stacks:
    """`native`: its caller's option (diagnose --native), native frames too
    (only of running pids)."""
    py_spy = find_py_spy()
    if py_spy is None:  # the whole probe is blind without it
        raise FileNotFoundError("py-spy not found next to the interpreter or on PATH "
                                "(pip install py-spy)")
    taken_at = ctx.clock()
    dumps = run_dumps(ctx, py_spy, pids, native, seen.budget)
    return Stacks(taken_at, py_spy, dumps + _worker_dumps(ctx, py_spy, seen, pids, dumps))


# A rank whose main thread waits in here waits for its DataLoader's workers
# (judge/pausekind.py names the same file a pause of kind data)
DATALOADER_FILE = "torch/utils/data/dataloader.py"
WORKERS_DUMPED = 4  # per rank: where an idle one waits is the evidence (one blocked,
# the others waiting for indices it holds up: the evidence picks the blocked one)


def _worker_dumps(ctx: ProbeContext, py_spy: str, seen: Pass, pids: tuple[int, ...],
                  dumps: tuple[PidStacks, ...]) -> tuple[PidStacks, ...]:
    """The dumps of the children of ranks that wait for their DataLoader: a
    worker blocked on a read that never returns shows where (its __getitem__)."""
    table = seen.table
    if table is None or not hasattr(table, "children_of"):
        return ()
    own, wanted = set(pids), {}
    for d in dumps:
        if d.status == "ok" and any(f.filename.replace("\\", "/").endswith(DATALOADER_FILE)
                                    for t in d.threads for f in t.frames):
            kids = sorted(c.pid for c in table.children_of(d.pid) if c.pid not in own)
            for kid in kids[:WORKERS_DUMPED]:
                wanted[kid] = d.pid
    if not wanted:
        return ()
    return tuple(dataclasses.replace(w, worker_of=wanted[w.pid])
                 for w in run_dumps(ctx, py_spy, tuple(wanted), False, seen.budget))


def from_json(obj) -> Stacks:
    return codec.from_json(Stacks, obj)


def refused(error: str) -> bool:
    """Whether a failed dump's `error` is the kernel refusing the attach, not a
    py-spy failure: py-spy 0.4.3 says "Permission Denied: Try running again with
    elevated permissions" (measured as uid 65534 on its own process after
    prctl(PR_SET_DUMPABLE, 0): tests/diagnose/test_diagnose_node.py)."""
    text = error.lower()
    return "permission denied" in text or "operation not permitted" in text
