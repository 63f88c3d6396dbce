"""Heartbeat family: what a rank's own record says (ddpwatch.instrument or
`ddpwatch exec`), and which records belong to the job. Pure."""
from __future__ import annotations

from typing import Iterable

from ...heartbeat import Record
from ...heartbeat.layout import Phase
from ...observe.snapshot import Snapshot
from .lookup import owns, proc_of, record_of
from .spec import NUMBER, declare, one_of

SIGNALS = declare(
    ("hb", bool, "the rank writes heartbeat records"),
    ("hb_phase", one_of(*Phase.NAMES), "where the rank is, as its record says "
                                       "(heartbeat/layout.py Phase)"),
    ("hb_op", str, "current or last collective"),
    ("hb_seq", int, "collective sequence number"),
    ("hb_step", int, "training step"),
    ("hb_age_s", NUMBER, "seconds since the last heartbeat", "s"),
    ("hb_inside_s", NUMBER, "seconds inside the current collective (0 when outside)", "s"),
    ("hb_advanced", bool, "seq or step moved within the window"),
    ("hb_op_novel", bool, "the current collective is one this rank did not call in its last 64"),
    ("hb_step_s", NUMBER, "duration of the last step", "s"),
    ("hb_comm_share", NUMBER, "share of step time in collectives over the window; of the "
                              "window's time when fewer than 2 steps ended in it (all steps "
                              "so far when there is no window)", "share"),
    ("hb_comm_mbps", NUMBER, "MB/s its collectives moved while outstanding, over the window "
                             "(all so far when none completed in it): bytes / time inside", "MB/s"),
    ("hb_stall_bound_s", NUMBER, "learned bound: max(2 s, 10x the slowest recent run of this op)",
                                 "s"),
    ("hb_stalled", bool, "inside a collective for longer than hb_stall_bound_s"),
    ("hb_rank", int, "rank as the heartbeat record says"),
    ("hb_world_size", int, "world size (record)", "count"),
    ("compute_dtype", str, "dtype the rank computes in (heartbeat)"),
    ("device_type", str, "device the rank trains on (heartbeat)"),
    ("hb_backend", str, "the process group's backend (heartbeat): gloo, nccl..."),
    ("data_fp", str, "data fingerprint (heartbeat: shard list + batches)"),
)

STALL_FLOOR_S = 2.0      # never call a collective stalled before this
STALL_FACTOR = 10.0      # ... nor before 10x the slowest of its recent durations
# A dead rank of this job was alive when the job's live ranks started: its last
# heartbeat is not older than their start, give or take this much.
MEMBER_SLACK_S = 5.0


def measure(history: tuple[Snapshot, ...], pid: int) -> dict:
    first, last = record_of(history[0], pid), record_of(history[-1], pid)
    if last is None:
        return {"hb": False}
    now, alive = history[-1].taken_at, proc_of(history[-1], pid) is not None
    s = {"hb": True, "hb_phase": last.phase, "hb_op": last.op, "hb_seq": last.collective_seq,
         "hb_step": last.step, "hb_age_s": round(now - last.updated_at, 3),
         "hb_inside_s": round(last.inside_s(now, alive), 3),
         "hb_advanced": first is not None and (first.collective_seq, first.step) != (
             last.collective_seq, last.step),
         "hb_step_s": round(last.last_step_seconds, 4),
         "hb_comm_share": _comm_share(first, last, history[0].taken_at, now, alive),
         "hb_comm_mbps": _comm_mbps(first, last),
         "compute_dtype": last.compute_dtype or None,
         "hb_rank": last.rank, "hb_world_size": last.world_size,
         "hb_backend": last.backend or None,
         "data_fp": last.data_fingerprint or None}
    if last.in_collective:
        past_ops = {e.op for e in last.ring if e.seq < last.collective_seq}
        s["hb_op_novel"] = bool(past_ops) and last.op not in past_ops
    return s


def of_job_record(s: dict, record: Record | None) -> None:
    """What the job's record of this rank (job_records) adds: the learned stall
    bound of its current collective, and its device."""
    bound = stall_bound(record) if record is not None else None
    s["hb_stall_bound_s"] = round(bound, 3) if bound is not None else None
    s["hb_stalled"] = bool(s.get("hb_phase") == "inside" and bound is not None
                           and s["hb_inside_s"] > bound)
    s["device_type"] = record.device_type if record is not None else None


def stall_bound(record: Record) -> float:
    durations = [e.end - e.start for e in record.ring if e.op == record.op and e.end > 0]
    return max(STALL_FLOOR_S, STALL_FACTOR * max(durations, default=0.0))


MIN_WINDOW_S = 0.5  # a window shorter than this says nothing of shares


def _comm_share(first: Record | None, last: Record, first_at: float, last_at: float,
                alive: bool) -> float | None:
    """Share of step time spent with a collective outstanding, over the window:
    the cumulative share drags the first steps along (one rank allocating or
    compiling while the other waits), which made a healthy job look like it had
    a straggler for its first minute. With steps as long as the window (a slow
    link: 3 s steps), the steps ended in it are cut from their collectives (a
    step counted whose all-reduce ended before the window: 4% for a rank
    waiting 99%, a false straggler), so the window's own time is the measure:
    time inside collectives, the one under way at either end counted to it."""
    if first is not None and last.steps_completed - first.steps_completed >= 2 and \
            last.step_seconds > first.step_seconds:
        window = (last.collective_seconds - first.collective_seconds) / (
            last.step_seconds - first.step_seconds)
        return round(min(max(window, 0.0), 1.0), 4)
    if first is not None and last.step_seconds > first.step_seconds and \
            last_at - first_at >= MIN_WINDOW_S:
        inside = ((last.collective_seconds + last.inside_s(last_at, alive))
                  - (first.collective_seconds + first.inside_s(first_at, alive)))
        return round(min(max(inside / (last_at - first_at), 0.0), 1.0), 4)
    return round(last.collective_seconds / last.step_seconds, 4) if last.step_seconds > 0 else None


def _comm_mbps(first: Record | None, last: Record) -> float | None:
    if first is not None and last.collective_seconds - first.collective_seconds > 0.1:
        moved = last.bytes_total - first.bytes_total
        return round(moved / (last.collective_seconds - first.collective_seconds) / 1e6, 2)
    if last.collective_seconds > 0:
        return round(last.bytes_total / last.collective_seconds / 1e6, 2)
    return None


def job_records(snap: Snapshot) -> list[tuple[Record, bool]]:
    """Heartbeat records that belong to the job: live ranks' and the dead ones of
    the same run. A dead record of the same run id is left out when a live rank
    holds its rank, when it went quiet before the live ranks started, or when a
    later-started dead record holds its rank: each is an earlier launch (torchrun's
    run id is "none" unless --rdzv-id or --standalone sets one, and ranks started by
    hand have none), and judging it with this job would call a relaunch dead."""
    if snap.heartbeats is None:
        return []
    pairs = list(zip(snap.heartbeats.records, snap.heartbeats.alive))
    # A record under a live rank's pid that the rank did not write is an earlier
    # process's whose pid came back: it is neither this rank's nor, alive, anyone's.
    written = {id(r) for r, _ in pairs if r.pid in snap.job.rank_pids and owns(snap, r)}
    live = [r for r, _ in pairs if id(r) in written]
    if not live:
        return []
    run_ids = {r.run_id for r in live}
    live_ranks = {r.rank for r in live}
    worlds = {r.world_size for r in live}
    earliest = min(r.started_at for r in live)
    dead: dict[int, Record] = {}  # rank -> its latest-started dead record
    for rec, alive in pairs:
        if (not alive and rec.pid not in snap.job.rank_pids and rec.run_id in run_ids
                and rec.world_size in worlds and rec.rank not in live_ranks
                and rec.started_at >= earliest - 120
                and rec.updated_at >= earliest - MEMBER_SLACK_S):
            if rec.rank not in dead or rec.started_at > dead[rec.rank].started_at:
                dead[rec.rank] = rec
    members = {id(r) for r in dead.values()}
    return [(rec, alive) for rec, alive in pairs if id(rec) in written or id(rec) in members]


def arrival_lateness(records: Iterable[Record]) -> dict[int, float]:
    """{rank: seconds it entered the newest commonly completed collective after the
    first of them}. Rings are matched by collective seq (collective n is the same
    call on every rank) and skipped where the ops differ (a desync: no common
    collective to compare). Start times are CLOCK_MONOTONIC, one clock per host,
    so only records of one node compare. Fewer than two ranks, or no common
    completed collective: {}."""
    rings = {r.rank: {e.seq: e for e in r.ring if e.end > 0} for r in records}
    if len(rings) < 2:
        return {}
    common = set.intersection(*(set(ring) for ring in rings.values()))
    for seq in sorted(common, reverse=True):
        entries = {rank: ring[seq] for rank, ring in rings.items()}
        if len({e.op for e in entries.values()}) != 1:
            continue
        first = min(e.start for e in entries.values())
        return {rank: round(e.start - first, 6) for rank, e in entries.items()}
    return {}
