"""Probes read the world; one probe per module, registered here by name.

Like node_exporter's collectors: each module calls `register(...)` at import,
which gives it a name that config and flags switch on and off. A probe that
fails is a measurement (`ProbeResult.ok` False with the error), never a crash.
Each registration says when the probe runs (observe/sampler.py honours it):
`scope` "node" runs once per pass for every job, "job" per job; `look` is how
closely a job must be looked at before it runs (expensive ones only at
Look.STACKS: on suspicion or on request); `switchable` probes can be turned off
by config (`probes: {name: false}`). A job probe's data goes into the Snapshot
field its registration names (`field`); `sooner_if_silent`, `again_at`,
`with_launcher` and `budgeted` tune when and on which pids it runs (ProbeSpec).

A new probe is its module here with its `register` line (load_all finds it; the
sampler runs it by its policy), and a field for its data in observe/snapshot.py.
"""
from __future__ import annotations

import enum
import importlib
import pkgutil
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class ProbeContext:
    """The machine, injected (so tests can hand probes fixtures)."""
    procfs: str = "/proc"
    heartbeat_dir: str | None = None
    # heartbeats probe: more directories, named by the ranks' DDPWATCH_DIR
    # (discovery.heartbeat_dirs), read after `heartbeat_dir`
    rank_heartbeat_dirs: tuple[str, ...] = ()
    clock: Callable[[], float] = time.monotonic
    timeout_s: float = 2.0
    native_stacks: bool = False  # stacks probe: also native frames (only on running pids)
    socket_info: bool = True     # sockets probe: also run `ss -ti` (bytes, idle times);
                                 # the daemon's every-tick pass reads /proc only
    parents: dict | None = None  # pid -> ppid, when the caller has just read them all
    # pid -> (cmdline, allow-listed env), when the caller has just read them (they
    # change only at exec): the process probe then need not read them again
    exec_info: dict | None = None
    # process probe: every thread's state, wchan and CPU too. Off, only the
    # thread's schedstat is read (run-queue wait, which straggler rules use): the
    # daemon's pass over a healthy job, a third of the files of the detailed one
    thread_detail: bool = True
    # heartbeats probe: path -> (file identity, Record, final) of records whose
    # process is gone, kept by a caller that reads every second. Such a record no longer
    # changes: it is not read again while the file stays the same (finished runs'
    # records pile up in the directory; reading them all every tick adds up)
    dead_records: dict | None = None
    # traffic probe: the packet capture its caller opened and keeps across samples
    # (traffic.SynCapture; None when it could not be opened)
    syn_capture: Any = None
    # exits probe: the process-events watch its caller opened and keeps across
    # samples (exits.ExitWatch; NoWatch when it could not be opened)
    exit_watch: Any = None
    # heartbeats probe: heartbeat/scan.py's ScanState (listings, refused files)
    # kept by a caller that reads every second
    scan_state: Any = None
    # nshost probe: namespaces -> (read at, view) kept by a caller that reads every
    # second (a namespace's hostname and hosts file change rarely)
    ns_cache: dict | None = None
    # wire_groups probe: the node's process table (pid -> discovery.ProcInfo) just
    # read, and the wire_groups.WireWatch its caller keeps across passes
    procs: dict | None = None
    wire_watch: Any = None
    # what this pass may still spend on each user's ranks (observe/budget.py
    # PassBudget; None: no limit, as for `diagnose`)
    budget: Any = None


class Look(enum.IntEnum):
    """How closely a job is looked at; each level includes the ones below.

    GLANCE -> DETAIL when a job is not healthy; DETAIL -> STACKS on suspicion
    (rate-limited) or when a person asks (`diagnose`, /status?stacks=1)."""
    GLANCE = 0  # CPU, run-queue waits, heartbeats: a healthy job, every tick
    DETAIL = 1  # + every thread's state, the sockets table from /proc
    STACKS = 2  # + py-spy stacks, `ss -ti` (bytes, idle times)


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    run: Callable[[ProbeContext, tuple[int, ...]], Any]
    default_enabled: bool
    expensive: bool
    privileged: bool
    help: str
    scope: str = "job"         # "node": once per pass for all jobs; "job": per job
    look: Look = Look.GLANCE   # the closest look a job needs before this runs
    switchable: bool = True    # config may turn it off
    # --- job probes only (observe/sampler.py)
    field: str = ""            # the Snapshot field its data fills ("" the name)
    # runs from this look instead for a job without live heartbeats or with an
    # orphan rank (what they do on the wire is then the evidence there is)
    sooner_if_silent: Look | None = None
    # runs again at this look, seeing more (ProbeContext.socket_info)
    again_at: Look | None = None
    with_launcher: bool = False  # the launcher's pid too, not only the ranks'
    # costly to the ranks: run at most every stacks_min_interval_s per job and
    # within a per-pass budget of pids (sampler MAX_DUMPS_PER_PASS)
    budgeted: bool = False

    @property
    def snapshot_field(self) -> str:
        return self.field or self.name


@dataclass(frozen=True)
class ProbeResult:
    name: str
    ok: bool
    duration_s: float
    data: Any = None
    error: str = ""
    extra: dict = field(default_factory=dict)


class Outcome(enum.Enum):
    """How observing one pid went. Probes translate the OS's errors into these
    once, where they read (as psutil's wrap_exceptions does): `failure` gives
    a pid's `error`, text that carries its Outcome. Snapshots keep the text
    ("gone", "denied: reason", "failed: reason"); consumers ask `outcome(error)`,
    never the text, and only a snapshot loaded from JSON has it read back."""
    OBSERVED = ""
    GONE = "gone"
    DENIED = "denied"
    FAILED = "failed"


class Failed(str):
    """A pid's `error` text with the Outcome it was made from: saved, it is the
    plain text (snapshot JSON is unchanged); in hand, `outcome` needs no parsing."""

    def __new__(cls, text: str, outcome: Outcome):
        self = super().__new__(cls, text)
        self.outcome = outcome
        return self

    def __getnewargs__(self):  # copy and pickle make it again from both
        return str(self), self.outcome


def failure(err: BaseException) -> Failed:
    """The `error` of a pid that could not be read, from what reading it raised."""
    if isinstance(err, (FileNotFoundError, ProcessLookupError)):
        return Failed(Outcome.GONE.value, Outcome.GONE)
    if isinstance(err, PermissionError):
        return Failed(f"{Outcome.DENIED.value}: {err.strerror}", Outcome.DENIED)
    return Failed(f"{Outcome.FAILED.value}: {getattr(err, 'strerror', None) or err}",
                  Outcome.FAILED)


def outcome(error: str) -> Outcome:
    if isinstance(error, Failed):
        return error.outcome
    # the text alone: a snapshot loaded from JSON (observe/snapshot.py load)
    head = error.partition(":")[0]
    return next((o for o in Outcome if o.value == head), Outcome.FAILED) if error else \
        Outcome.OBSERVED


REGISTRY: dict[str, ProbeSpec] = {}


def register(name: str, *, default_enabled: bool = True, expensive: bool = False,
             privileged: bool = False, help: str = "", scope: str = "job",
             look: Look = Look.GLANCE, switchable: bool = True, **job_policy):
    def decorate(fn):
        REGISTRY[name] = ProbeSpec(name, fn, default_enabled, expensive, privileged, help,
                                   scope, look, switchable, **job_policy)
        return fn
    return decorate


def job_probes() -> list[ProbeSpec]:
    """The per-job probes, in a fixed order (by name)."""
    return sorted((s for s in load_all().values() if s.scope == "job"), key=lambda s: s.name)


_LOADED = False


def load_all() -> dict[str, ProbeSpec]:
    """Every probe: each module of this package registers its own at import.
    The package is listed once (the daemon asks on every probe run)."""
    global _LOADED
    if not _LOADED:
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")
        _LOADED = True
    return REGISTRY


def run_probe(name: str, ctx: ProbeContext, pids: tuple[int, ...]) -> ProbeResult:
    """Run one probe; any exception becomes a failed ProbeResult."""
    spec = load_all()[name]
    start = time.monotonic()
    try:
        data = spec.run(ctx, pids)
    except Exception as err:  # a failed probe is a measurement, not a crash
        return ProbeResult(name, False, time.monotonic() - start, None,
                           f"{type(err).__name__}: {err}")
    return ProbeResult(name, True, time.monotonic() - start, data)
