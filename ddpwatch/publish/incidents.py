"""Incidents: open -> ongoing -> resolved, one per job at a time. Pure state
machine over per-tick job verdicts; the daemon writes bundles and sends alerts
for the events it returns.

One incident is one page (docs/judgement-over-time.md "One incident, one page";
Alertmanager's group_interval): an incident's verdict may change every few seconds
(hung, straggler, hung), and each change updates its bundle and page, but a change
is told to people (`Event.notify`) only when the severity rises above what they were
last told, and at most once per `group_interval_s`; a rise held back by the interval
is told when the interval ends, if it still stands. It resolves once the job has
been calm for `resolve_after_s` (hysteresis), with one resolved message."""
from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass

from ..judge.vocabulary import CALM, HELD, OPEN_AFTER_S, SEVERITY  # which verdicts page, and when
from .view import Incident, IncidentState

KEEP_RESOLVED_S = 600.0  # resolved incidents stay visible in /status this long
OPEN_AFTER_TICKS = 2      # a problem judged on this many ticks in a row opens an incident:
                          # one tick may see the victims before the culprit, or a rank
                          # between two states; the second confirms (and costs one tick)


@dataclass(frozen=True)
class Event:
    kind: str          # "opened" | "changed" (verdict or culprits) | "resolved"
    incident: Incident
    # tell people (a webhook): every opened and resolved event; a changed one only
    # when the severity rose past what they were told, once per group interval
    notify: bool = True
    # write the evidence bundle anew: opened, or changed to a judgement at least as
    # severe as any before in this incident (a hang's evidence is not overwritten
    # by the straggler its end looks like)
    evidence: bool = True


GROUP_INTERVAL_S = 60.0  # the config's group_interval_s by default

def resolution(verdict: str, calm_s: float) -> str:
    """How an incident resolved, for people: the job's verdict while it calmed."""
    if verdict == "gone":
        return (f"the job's processes were gone for {calm_s:.0f} s (it exited, was killed, "
                f"or torchrun restarted it)")
    if verdict == "unknown":  # calm only in that nothing says it is a problem
        return f"the job could not be observed (unknown) for {calm_s:.0f} s"
    return f"the job was judged {verdict.replace('_', ' ')} for {calm_s:.0f} s"


@dataclass
class Standing:
    """A watched job's standing toward an incident, between ticks: how long it has
    been troubled and why its incident is held back. Its WatchedJob holds it
    (watch/job.py `incident`), so it is forgotten with the job."""
    # (troubled ticks in a row, since when, whether those ticks were only `slowing`:
    # see IncidentBook.update), None while calm
    troubled: tuple[int, float, bool] | None = None
    held: str = ""  # why its incident is held back (the gate's reason), "" when not


@dataclass
class Open:
    """An open incident and how it stands with people."""
    incident: Incident
    told: tuple[str, float]   # (the most severe verdict people were told, when a change was)
    worst: str | None         # the incident's most severe verdict (None: taken up from
                              # a daemon before, whose worst was not kept)
    calm_since: float | None = None


class IncidentBook:
    """The daemon's incidents: the owner of what outlives a job. An open
    incident stays open after its job is forgotten, until it is calm (a gone
    job is) for `resolve_after_s`; a resolved one stays in /status for
    KEEP_RESOLVED_S; both are saved across restarts (publish/incident_store.py).
    What it knows of a job while the job is watched is the job's `Standing`,
    handed in by whoever holds it (the daemon: each WatchedJob's `incident`)."""

    def __init__(self, resolve_after_s: float, open_after_s: dict[str, float] | None = None,
                 group_interval_s: float = GROUP_INTERVAL_S, gate=None):
        self.resolve_after_s = resolve_after_s
        # gate(key, verdict) -> "" to open, else why the incident is held back
        # (publish/limits.py: "young", "uid_rate"); asked only when one would open
        self.gate = gate
        self.limited_total: dict[str, int] = {}  # why -> jobs held back, since start
        self.open_after_s = open_after_s
        self.group_interval_s = group_interval_s
        self._open: dict[str, Open] = {}       # job key -> open/ongoing incident
        self._resolved: list[Incident] = []
        self._counter = 0
        self.opened_total: dict[str, int] = {}
        # the Standings of a caller that keeps none (a test's book): the jobs of
        # the last update only
        self._standings: dict[str, Standing] = {}

    @property
    def open_after_s(self) -> dict[str, float]:
        return self._open_after_s

    @open_after_s.setter
    def open_after_s(self, overrides: dict[str, float] | None) -> None:
        """The config's `open_after_s`, over the defaults (OPEN_AFTER_S)."""
        self._open_after_s = {**OPEN_AFTER_S, **(overrides or {})}

    def update(self, verdicts: dict[str, tuple[str, tuple[int, ...], str]], now: float,
               labels: dict[str, str] | None = None,
               standings: dict[str, Standing] | None = None) -> list[Event]:
        """verdicts: job key -> (job verdict, culprits, summary), for jobs seen this tick.
        A job that vanished counts as calm (its processes are gone). `labels`: job
        key -> the label people see (the run id), when the key is not it.
        `standings`: job key -> its Standing, for every key in `verdicts` (the
        daemon's WatchedJobs'); None: the book keeps them for these jobs."""
        labels = labels or {}
        if standings is None:
            standings = self._standings = {k: self._standings.get(k) or Standing()
                                           for k in verdicts}
        events = []
        for key, (verdict, culprits, summary) in verdicts.items():
            job = standings[key]
            current = self._open.get(key)
            if verdict in HELD:
                # a straggler in wait (watch/slow.py) opens nothing and resolves like
                # calm, but is no healthy tick: the death or hang that follows it is
                # confirmed on its next tick, as it was when this was a straggler
                # (tests/thirdparty/test_thirdparty_killed.py: the job is gone a tick later)
                ticks, since, held = job.troubled or (0, now, True)
                job.troubled = (min(ticks + 1, OPEN_AFTER_TICKS - 1), since, held)
                job.held = ""
                continue
            if verdict in CALM:
                job.troubled, job.held = None, ""
                continue
            if current is not None:
                current.calm_since = None
            ticks, since, held = job.troubled or (0, now, False)
            if held and not culprits:
                # What `slowing` confirms is a death or hang of a rank it names. A
                # verdict without a culprit after it (every rank waiting in a
                # collective for a tick, while a node's CPUs are taken: the
                # DataLoader job of tests/daemon/test_soak.py) waits for its own
                # second tick, as after a healthy one.
                ticks = 0
            job.troubled = (ticks + 1, since, False)
            if current is None and (ticks + 1 < OPEN_AFTER_TICKS
                                    or now - since < self._open_after_s.get(verdict, 0.0)):
                continue
            if current is None and self.gate is not None:
                why = self.gate(key, verdict)
                if why:  # counted once per job and reason, not per tick
                    if job.held != why:
                        self.limited_total[why] = self.limited_total.get(why, 0) + 1
                    job.held = why
                    continue
                job.held = ""
            if current is None:
                self._counter += 1
                label = labels.get(key, key)
                incident = Incident(f"{safe_name(label)}-{int(now)}-{self._counter}", label,
                                    IncidentState.OPEN, verdict, culprits, summary, now, now,
                                    0.0, "", owner=key)
                self._open[key] = Open(incident, (verdict, -1e18), verdict)
                self.opened_total[verdict] = self.opened_total.get(verdict, 0) + 1
                events.append(Event("opened", incident))
            else:
                was = current.incident
                updated = dataclasses.replace(
                    was, state=IncidentState.ONGOING, verdict=verdict,
                    culprits=culprits or was.culprits, summary=summary, updated_at=now)
                current.incident = updated
                changed = (updated.verdict, updated.culprits) != (was.verdict, was.culprits)
                rose = self._rose(current, verdict, now)
                if changed or rose:
                    # A first tick may see the victims before the culprit: the
                    # evidence follows the judgement, not its first draft; people
                    # hear of it when it is worse than what they were told.
                    worst = current.worst or verdict
                    as_bad = SEVERITY.index(verdict) <= SEVERITY.index(worst)
                    if as_bad:
                        current.worst = verdict
                    events.append(Event("changed", updated, notify=rose, evidence=as_bad))
        for key in list(self._open):
            verdict = verdicts.get(key, ("gone", (), ""))[0]
            if verdict not in CALM and verdict != "gone":
                continue
            current = self._open[key]
            if current.calm_since is None:
                current.calm_since = now
            since = current.calm_since
            if now - since >= self.resolve_after_s:
                done = dataclasses.replace(self._open.pop(key).incident,
                                           state=IncidentState.RESOLVED,
                                           resolved_at=now, updated_at=now,
                                           resolution=resolution(verdict, now - since))
                self._resolved.append(done)
                events.append(Event("resolved", done))
        self._resolved = [i for i in self._resolved if now - i.resolved_at < KEEP_RESOLVED_S]
        return events

    def _rose(self, current: Open, verdict: str, now: float) -> bool:
        """Whether to tell people of `verdict` now: more severe than the worst they
        were told of this incident, and no change told within the group interval.
        Records it as told when so."""
        told, at = current.told
        if SEVERITY.index(verdict) >= SEVERITY.index(told) or now - at < self.group_interval_s:
            return False
        current.told = (verdict, now)
        return True

    def attach_bundle(self, incident_id: str, path: str, error: str = "") -> None:
        self._amend(incident_id, bundle=path, bundle_error=error)

    def set_alerts_from(self, incident_id: str, node: str) -> None:
        self._amend(incident_id, alerts_from=node)

    def _amend(self, incident_id: str, **changes) -> None:
        for current in self._open.values():
            if current.incident.id == incident_id:
                current.incident = dataclasses.replace(current.incident, **changes)

    def holds(self, key: str) -> bool:
        """Whether the job `key` has an incident open (which outlives the job)."""
        return key in self._open

    def open(self) -> tuple[Incident, ...]:
        return tuple(o.incident for o in self._open.values())

    def all(self) -> tuple[Incident, ...]:
        return self.open() + tuple(self._resolved)

    # --- across restarts (publish/incident_store.py keeps these on disk) -------
    def state(self) -> dict:
        return {"counter": self._counter,
                "open": {k: o.incident for k, o in self._open.items()},
                "resolved": list(self._resolved)}

    def restore(self, counter: int, open_: dict[str, Incident],
                resolved: list[Incident]) -> None:
        """Take up where a daemon that was killed left off: its open incidents
        stay open under their ids (resolved here, once their job is calm or
        gone) and are not opened again while the problem lasts."""
        self._counter = max(self._counter, counter)
        for key, incident in open_.items():  # its firing message was sent before
            was = self._open.get(key)
            self._open[key] = Open(incident, was.told if was else (incident.verdict, -1e18),
                                   was.worst if was else None,
                                   was.calm_since if was else None)
        self._resolved = list(resolved) + self._resolved


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
MAX_NAME = 48


def safe_name(label: str) -> str:
    """A label made fit for a file name: letters, digits, '_', '.', '-' only, no
    leading dot, no "..", at most MAX_NAME characters, and a short hash of the label when
    anything was changed (so two labels never make one name). A run id is
    whatever a job's owner wrote (`../../../../tmp/x/L/pwn` made root
    write a bundle through a symlink), so it is never a path."""
    cleaned = _UNSAFE.sub("_", label).replace("..", "_").lstrip(".")[:MAX_NAME] or "job"
    if cleaned != label:
        cleaned = f"{cleaned[:MAX_NAME - 9]}_{hashlib.sha256(label.encode()).hexdigest()[:8]}"
    return cleaned
