"""Probes read the world; one probe per module, registered here by name.

Like node_exporter's collectors: each module calls `register(...)` at import,
which gives it a name that config and flags switch on and off. A probe that
fails is a measurement (`ProbeResult.ok` False with the error), never a crash.
Each registration says when the probe runs (observe/sampler.py honours it):
`scope` "node" runs once per pass for every job, "job" per job; `look` is how
closely a job must be looked at before it runs (expensive ones only at
Look.STACKS: on suspicion or on request); `switchable` probes can be turned off
by config (`probes: {name: false}`). A probe's data goes into the Snapshot field
its registration names (`field`; a node probe's, narrowed by its `for_job`, into
every job's); `stage` and `sampled_pids` place a node probe in the pass,
`sooner_if_silent`, `again_at`, `with_launcher` and `budgeted` tune when and on
which pids a job probe runs (ProbeSpec).

What is registered is a function `run(ctx, seen, pids, **options)` for a probe
that keeps nothing, or a `Probe` class for one that keeps something between
passes (a capture, caches): the registry makes one object of each for its
caller (a Sampler: `make_all`), which runs it with the machine (`ProbeContext`)
and what its pass has read (`Pass`), and closes it.

A new probe, node or job, is its module here with its `register` line
(load_all finds it; the sampler makes, switches and runs it by its policy), and
a field for its data in observe/snapshot.py (and its place in the probes each
look runs, which tests/unit/observe/test_sampler_unit.py pins: docs/architecture.md
"Adding things").
"""
from __future__ import annotations

import enum
import importlib
import pkgutil
import time
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class ProbeContext:
    """The machine, injected (so tests can hand probes fixtures)."""
    procfs: str = "/proc"
    heartbeat_dir: str | None = None
    clock: Callable[[], float] = time.monotonic
    timeout_s: float = 2.0


class Look(enum.IntEnum):
    """How closely a job is looked at; each level includes the ones below.

    GLANCE -> DETAIL when a job is not healthy; DETAIL -> STACKS on suspicion
    (rate-limited) or when a person asks (`diagnose`, /status?stacks=1)."""
    GLANCE = 0  # CPU, run-queue waits, heartbeats: a healthy job, every tick
    DETAIL = 1  # + every thread's state, the sockets table from /proc
    STACKS = 2  # + py-spy stacks, `ss -ti` (bytes, idle times)


@dataclass(frozen=True)
class Pass:
    """What the caller's pass hands every probe it runs: what the pass has read
    already (so no probe reads it again), what it may still spend, and how
    closely the job in hand is looked at. The defaults are a probe run alone."""
    # pid -> discovery.ProcInfo of every process, just read (parents, command
    # lines, environments: these change only at exec); None: not read
    table: dict | None = None
    # heartbeats probe: more record directories, named by the ranks' DDPWATCH_DIR
    # (discovery.heartbeat_dirs), read after ProbeContext.heartbeat_dir
    record_dirs: tuple[str, ...] = ()
    # what this pass may still spend on each user's ranks (observe/budget.py
    # PassBudget; None: no limit, as for `diagnose`)
    budget: Any = None
    # job probes: the look they run at; a probe that sees more closer up reads
    # more from its registration's `again_at` on (the sockets' `ss -ti`), the
    # process probe every thread's state from Look.DETAIL on
    look: Look = Look.STACKS


class Probe:
    """A probe as the registry makes it, once for its caller (a Sampler), which
    keeps it across passes: what it learns in one pass and needs in the next
    (a capture, caches, the pids it watched) lives in it. The defaults suit a
    probe that keeps nothing open."""
    name = ""  # its registered name (the registry sets it)

    def run(self, ctx: ProbeContext, seen: Pass, pids: tuple[int, ...]) -> Any:
        raise NotImplementedError

    def switch(self, ctx: ProbeContext, on: bool) -> None:
        """Switched on or off by its caller's config, at start and on a reload
        (SIGHUP): a probe that holds something open (a socket) holds it only
        while on, and keeps it open while it stays on."""

    def due(self, now: float) -> bool:
        """Node probes: whether this pass reads (the host's facts: once a minute)."""
        return True

    def kept(self) -> Any:
        """Node probes: the reading a pass that did not read, or failed to, stands
        on (None: nothing)."""
        return None

    def close(self) -> None:
        """Let go of what it holds open."""


class Stateless(Probe):
    """A registered function, with its caller's options: a probe that keeps nothing."""

    def __init__(self, fn: Callable[..., Any], options: dict):
        self.fn, self.options = fn, options

    def run(self, ctx: ProbeContext, seen: Pass, pids: tuple[int, ...]) -> Any:
        return self.fn(ctx, seen, pids, **self.options)


NODE_STAGES = ("records", "node", "jobs")  # the order of a pass (ProbeSpec.stage)


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    # what was registered: a function run(ctx, seen, pids, **options), or a Probe
    # class made with the options (make)
    impl: Callable[..., Any]
    default_enabled: bool
    scope: str = "job"         # "node": once per pass for all jobs; "job": per job
    look: Look = Look.GLANCE   # the closest look a job needs before this runs
    switchable: bool = True    # config may turn it off
    field: str = ""            # the Snapshot field its data fills ("" the name)
    uses: tuple[str, ...] = ()  # probes whose objects its own is made with (make_all)
    # --- node probes only (observe/sampler.py survey)
    # where in the pass: "records" first (discovery finds jobs by the live records
    # they read), then "node", then "jobs" once discovery found them (given the
    # pids already in a job; its data's `jobs` join them, its `note` says what a
    # bound left out: probes/wire_groups.py WireGroups)
    stage: str = "node"
    sampled_pids: bool = False  # given the pids of the jobs sampled since the last pass
    # what of its reading a job's Snapshot keeps: for_job(reading, job, the job
    # probes' data by field) (None: all of it)
    for_job: Callable[..., Any] | None = None
    # --- job probes only (observe/sampler.py sample)
    # runs from this look instead for a job without live heartbeats or with an
    # orphan rank (what they do on the wire is then the evidence there is)
    sooner_if_silent: Look | None = None
    # runs again at this look, seeing more (Pass.look)
    again_at: Look | None = None
    with_launcher: bool = False  # the launcher's pid too, not only the ranks'
    # costly to the ranks: run at most every stacks_min_interval_s per job and
    # within a per-pass budget of pids (sampler MAX_DUMPS_PER_PASS)
    budgeted: bool = False

    @property
    def snapshot_field(self) -> str:
        return self.field or self.name

    def make(self, **options) -> Probe:
        probe = (self.impl(**options) if isinstance(self.impl, type)
                 else Stateless(self.impl, options))
        probe.name = self.name
        return probe


@dataclass(frozen=True)
class ProbeResult:
    name: str
    ok: bool
    duration_s: float
    data: Any = None
    error: str = ""


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


def register(name: str, *, default_enabled: bool = True, scope: str = "job",
             look: Look = Look.GLANCE, switchable: bool = True, **policy):
    def decorate(impl):
        REGISTRY[name] = ProbeSpec(name, impl, default_enabled, scope, look, switchable,
                                   **policy)
        return impl
    return decorate


def job_probes() -> list[ProbeSpec]:
    """The per-job probes, in a fixed order (by name)."""
    return sorted((s for s in load_all().values() if s.scope == "job"), key=lambda s: s.name)


def node_probes(stage: str) -> list[ProbeSpec]:
    """The node probes of one stage of a pass (NODE_STAGES), in a fixed order (by name)."""
    return sorted((s for s in load_all().values() if s.scope == "node" and s.stage == stage),
                  key=lambda s: s.name)


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


def make(name: str, **options) -> Probe:
    """One probe's object, alone (a probe it `uses` gets one of its own)."""
    return load_all()[name].make(**options)


def make_all(options: dict[str, dict] | None = None) -> dict[str, Probe]:
    """One object of every probe, for one caller: each made with its caller's
    `options[name]` and with the objects of the probes it `uses` (made first),
    so that what two probes share is kept once (nshost reads namespaces'
    interfaces through the sockets probe's)."""
    options, made = options or {}, {}

    def one(name: str) -> Probe:
        if name not in made:
            spec = load_all()[name]
            made[name] = spec.make(**{used: one(used) for used in spec.uses},
                                   **options.get(name, {}))
        return made[name]
    for name in load_all():
        one(name)
    return made


def run_probe(probe: Probe, ctx: ProbeContext, seen: Pass,
              pids: tuple[int, ...]) -> ProbeResult:
    """Run one probe; any exception becomes a failed ProbeResult."""
    start = time.monotonic()
    try:
        data = probe.run(ctx, seen, pids)
    except Exception as err:  # a failed probe is a measurement, not a crash
        return ProbeResult(probe.name, False, time.monotonic() - start, None,
                           f"{type(err).__name__}: {err}")
    return ProbeResult(probe.name, True, time.monotonic() - start, data)
