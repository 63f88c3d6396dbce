"""The live view's board (`status --watch`, `diagnose --watch`): pure over the
jobs' reports as /status and `diagnose --json` give them (`key`, `job`,
`ranks[]`), fed once a refresh with the time. It keeps each job's and rank's
verdict history, says how long the current verdict has held and what it was a
minute ago, and marks what changed in the last CHANGED_S. The terminal driver
(commands/live.py) only draws its lines."""
from __future__ import annotations

import collections
from dataclasses import dataclass

from ..judge.vocabulary import BY_NAME, SEVERITY, label
from .terminal import printable

CHANGED_S = 10.0       # a verdict newer than this is highlighted
AGO_S = 60.0           # "a minute ago"
KEEP_S = 15 * 60.0     # history kept per job and rank
HISTORY_SHOWN = 4      # the last verdicts shown, oldest first


@dataclass(frozen=True)
class Line:
    text: str
    changed: bool = False  # its verdict changed within CHANGED_S: highlighted
    bad: bool = False      # a problem (not a fine verdict)
    header: bool = False


class Track:
    """One job's or rank's verdicts over time: (since, verdict) at each change."""

    def __init__(self):
        self.changes: collections.deque = collections.deque()

    def see(self, verdict: str, now: float) -> None:
        if not self.changes or self.changes[-1][1] != verdict:
            self.changes.append((now, verdict))
        while len(self.changes) > 1 and self.changes[1][0] < now - KEEP_S:
            self.changes.popleft()

    @property
    def since(self) -> float:
        return self.changes[-1][0]

    def at(self, t: float) -> str | None:
        """The verdict at time t, None before the first."""
        found = None
        for since, verdict in self.changes:
            if since <= t:
                found = verdict
        return found

    def changed(self, now: float) -> bool:
        return len(self.changes) > 1 and now - self.since < CHANGED_S


def held(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


class Board:
    def __init__(self):
        self.tracks: dict[tuple, Track] = {}
        self.started: float | None = None

    def _track(self, key: tuple, verdict: str, now: float) -> Track:
        track = self.tracks.setdefault(key, Track())
        track.see(verdict, now)
        return track

    def update(self, jobs: list[dict], now: float, note: str = "") -> list[Line]:
        """The lines to draw for `jobs` seen at `now` (monotonic seconds)."""
        if self.started is None:
            self.started = now
        lines = [Line(f"ddpwatch live view: {len(jobs)} job(s){note}", header=True)]
        for job in sorted(jobs, key=_severity):
            lines += self._job(job, now)
        if not jobs:
            lines.append(Line("no DDP job on this node"))
        return lines

    def _job(self, job: dict, now: float) -> list[Line]:
        key = printable(str(job.get("key", "?")))
        if "error" in job:
            return [Line(f"{key}: could not be looked at: {printable(job['error'])}", bad=True)]
        verdict = job["job"]["verdict"]
        track = self._track(("job", key), verdict, now)
        culprits = ", ".join(f"rank {c}" for c in job["job"]["culprits"]) or "-"
        stacks = "" if job.get("stacks", {}).get("read", True) else "  (without stacks)"
        lines = [Line(f"JOB {key}  {label(verdict)} for {held(now - track.since)}  "
                      f"culprit: {culprits}  {self._past(track, now)}{stacks}",
                      changed=track.changed(now), bad=not _fine(verdict))]
        for r in job["ranks"]:
            rt = self._track(("rank", key, r["pid"]), r["verdict"], now)
            who = f"rank {r['rank']}" if r["rank"] >= 0 else "launcher"
            cpu = (r.get("signals") or {}).get("cpu_ratio")
            # its history before its progress: a narrow terminal cuts the end
            lines.append(Line(
                f"  {who:<7} pid {r['pid']:<7} {label(r['verdict']):<22} "
                f"{r['role']:<7} cpu {_cpu(cpu)}  {self._past(rt, now)}  {_progress(r)}",
                changed=rt.changed(now), bad=not _fine(r["verdict"])))
        return lines

    def _past(self, track: Track, now: float) -> str:
        """What it was a minute ago (once watched that long), and its last changes."""
        parts = []
        ago = track.at(now - AGO_S) if self.started is not None and \
            now - self.started >= AGO_S else None
        if ago is not None:
            parts.append(f"1 min ago: {label(ago)}")
        if len(track.changes) > 1:
            shown = list(track.changes)[-HISTORY_SHOWN:]
            parts.append("history: " + " > ".join(
                f"{label(v)} ({held(now - t)} ago)" for t, v in shown))
        return "  ".join(parts)


def _fine(verdict: str) -> bool:
    v = BY_NAME.get(verdict)
    return v is not None and v.calm


def _severity(job: dict) -> int:
    verdict = job.get("job", {}).get("verdict", "")
    return SEVERITY.index(verdict) if verdict in SEVERITY else len(SEVERITY)


def _cpu(cpu) -> str:
    return f"{cpu:4.0%}" if isinstance(cpu, (int, float)) else "   -"


def _progress(rank: dict) -> str:
    """Its step (heartbeats), else its collective (heartbeats or stacks)."""
    s = rank.get("signals") or {}
    if s.get("hb_step") is not None:
        op = f" {s['hb_op']} #{s.get('hb_seq')}" if s.get("hb_op") else ""
        return printable(f"step {s['hb_step']}{op}")
    if s.get("stack_site"):
        return printable(f"in {str(s['stack_site'])[:40]}")
    if s.get("stack"):
        return printable(f"at {str(s['stack'])[:24]}")
    return "-"


def plain(lines: list[Line], clock_text: str) -> str:
    """The board for a pipe or a file: one block a refresh, changes marked `*`."""
    out = [f"--- {clock_text}"]
    out += [("* " if line.changed else "  ") + line.text for line in lines]
    return "\n".join(out)
