"""What the incident page draws, measured from the judgement and the snapshots.
Pure: a report (report.as_json's shape) and a snapshot history in, plain values
out; page_svg.py and page.py only draw them.

Times. Heartbeat records carry CLOCK_MONOTONIC times, one clock for every
process on a host, so the rings of the local ranks line up with each other and
with the snapshot's `taken_at`. Ranks on other nodes (the peer view) arrive as
clock-free signals only (seconds inside, seconds since the last heartbeat): they
get a row at the stall, not bars in the ring, whose clocks would not compare.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..heartbeat import Record
from ..judge.signals.heartbeat import job_records
from ..observe.snapshot import Snapshot

LAST_COLLECTIVES = 8   # collectives drawn before the stall: enough to see who arrives late
STATE_NAMES = {"R": "running", "S": "sleeping", "D": "disk wait", "T": "stopped",
               "t": "traced", "Z": "zombie", "I": "idle"}


@dataclass(frozen=True)
class Bar:
    seq: int
    op: str
    bytes: int
    start: float          # monotonic seconds
    end: float


@dataclass(frozen=True)
class Row:
    """One rank in the timeline."""
    rank: int
    pid: int
    host: str
    verdict: str
    role: str
    remote: bool
    bars: tuple[Bar, ...]     # its completed collectives among the ones drawn
    phase: str                # heartbeat phase at the stall ("" without heartbeats)
    seq: int | None           # collective number it is in / last entered
    op: str
    inside_s: float | None    # seconds inside the current collective (phase inside)
    quiet_s: float | None     # seconds since its last heartbeat
    state: str                # process state letter ("" unknown)
    cpu: float | None         # cores over the window
    behind: int | None        # collectives behind the furthest rank: the gap it left


@dataclass(frozen=True)
class Timeline:
    rows: tuple[Row, ...]
    seqs: tuple[int, ...]                         # the collectives drawn, oldest first
    lateness: dict[int, dict[int, float]]         # seq -> rank -> seconds after the first
    t0: float                                     # first drawn start (monotonic)
    t1: float                                     # last drawn end
    now: float                                    # the snapshot's time
    furthest: int | None                          # the highest collective number entered


def _rank_of(r: dict) -> int:
    return r["rank"] if isinstance(r.get("rank"), int) else -1


def timeline(report: dict, history: tuple[Snapshot, ...]) -> Timeline | None:
    """None when no rank of the job writes heartbeats (nothing to line up)."""
    last = history[-1] if history else None
    records: dict[int, Record] = {}
    if last is not None:
        records = {rec.pid: rec for rec, _ in job_records(last)}
    ranks = report.get("ranks", [])
    if not records and not any(r.get("signals", {}).get("hb") for r in ranks):
        return None
    drawn = _last_seqs(records.values())
    rows, starts = [], {}
    for r in ranks:
        s = r.get("signals", {})
        rec = records.get(r.get("pid"))
        bars = tuple(Bar(e.seq, e.op, e.bytes, e.start, e.end)
                     for e in (rec.ring if rec else ()) if e.seq in drawn and e.end > 0)
        for b in bars:
            starts.setdefault(b.seq, {})[_rank_of(r)] = b.start
        rows.append(Row(
            rank=_rank_of(r), pid=r.get("pid", -1), host=r.get("host") or s.get("node") or "",
            verdict=r.get("verdict", "unknown"), role=r.get("role", "none"),
            remote=bool(s.get("remote")), bars=bars, phase=str(s.get("hb_phase") or ""),
            seq=_int(s.get("hb_seq")), op=str(s.get("hb_op") or ""),
            inside_s=_num(s.get("hb_inside_s")) if s.get("hb_phase") == "inside" else None,
            quiet_s=_num(s.get("hb_age_s")), state=str(s.get("state") or ""),
            cpu=_num(s.get("cpu_ratio")), behind=_int(s.get("seq_behind"))))
    lateness = {seq: {rank: t - min(by_rank.values()) for rank, t in by_rank.items()}
                for seq, by_rank in starts.items() if len(by_rank) > 1}
    bars = [b for row in rows for b in row.bars]
    now = last.taken_at if last is not None else 0.0
    t0 = min((b.start for b in bars), default=now)
    t1 = max((b.end for b in bars), default=now)
    seqs = [row.seq for row in rows if row.seq is not None]
    return Timeline(tuple(rows), tuple(sorted(drawn)), lateness, t0, t1, now,
                    max(seqs) if seqs else None)


def _last_seqs(records) -> set[int]:
    """The last LAST_COLLECTIVES collectives completed by every local rank that
    has a ring, and what the others completed beyond (where the gap shows)."""
    rings = [{e.seq for e in rec.ring if e.end > 0} for rec in records if rec.ring]
    if not rings:
        return set()
    common = set.intersection(*rings)
    top = max(common) if common else max(max(r) for r in rings)
    everything = set.union(*rings)
    return {seq for seq in everything if top - LAST_COLLECTIVES < seq}


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def state_fractions(history: tuple[Snapshot, ...], pid: int) -> dict[str, float]:
    """Share of the rank's thread samples in each state over the window (every
    thread of every snapshot; the process state where threads were not read)."""
    counts: Counter = Counter()
    for snap in history:
        if snap.processes is None:
            continue
        for p in snap.processes.procs:
            if p.pid != pid or p.error:
                continue
            if p.threads:
                counts.update(t.state for t in p.threads if t.state)
            elif p.state:
                counts[p.state] += 1
    total = sum(counts.values())
    return {k: n / total for k, n in counts.most_common()} if total else {}


@dataclass(frozen=True)
class FoldedStack:
    thread: str
    idle: bool
    frames: tuple[str, ...]   # outermost first
    seen: int                 # dumps in the window with this very stack


def folded_stacks(history: tuple[Snapshot, ...], pid: int) -> tuple[tuple[FoldedStack, ...], str]:
    """(identical stacks of the rank over the window, counted; the dump's
    status when nothing could be dumped, e.g. "stopped: not dumped")."""
    counts: Counter = Counter()
    status = ""
    for snap in history:
        if snap.stacks is None:
            continue
        for p in snap.stacks.pids:
            if p.pid != pid:
                continue
            if not p.threads:
                status = p.error or p.status
            for t in p.threads:
                frames = tuple(f"{f.name} ({f.short_filename or f.module}"
                               + (f":{f.line}" if f.line else "") + ")"
                               for f in reversed(t.frames))
                counts[(t.name or str(t.thread_id), not t.active, frames)] += 1
    folded = tuple(FoldedStack(name, idle, frames, n)
                   for (name, idle, frames), n in counts.most_common())
    return folded, ("" if folded else status)
