"""`ddpwatch ranks`: this node's ranks as their heartbeat records describe them.

Pure: records + liveness + now in, rows out. Works with no daemon running.
"""
from __future__ import annotations

from ..heartbeat import Record

COLUMNS = (  # (key, header, format)
    ("rank", "RANK", "{}"), ("local_rank", "LOCAL", "{}"), ("pid", "PID", "{}"),
    ("state", "STATE", "{}"), ("step", "STEP", "{}"), ("collective_seq", "SEQ", "{}"),
    ("op", "OP", "{}"), ("in_collective_s", "IN-OP", "{:.1f}s"),
    ("tokens_per_s", "TOK/S", "{:.0f}"), ("comm_share", "COMM", "{:.0%}"),
    ("heartbeat_age_s", "AGE", "{:.1f}s"), ("compute_dtype", "DTYPE", "{}"),
)


def row(record: Record, alive: bool, now: float) -> dict:
    state = record.phase if alive else ("exited" if record.phase == "exited" else "gone")
    return {
        "rank": record.rank,
        "local_rank": record.local_rank,
        "world_size": record.world_size,
        "pid": record.pid,
        "host": record.hostname,
        "run_id": record.run_id,
        "alive": alive,
        "state": state,
        "step": record.step,
        "collective_seq": record.collective_seq,
        "op": record.op,
        "in_collective_s": round(record.inside_s(now, alive), 3),
        "tokens_per_s": round(record.last_step_tokens / record.last_step_seconds, 1)
        if record.last_step_seconds > 0 else 0.0,
        "comm_share": round(min(record.collective_seconds / record.step_seconds, 1.0), 4)
        if record.step_seconds > 0 else 0.0,
        "heartbeat_age_s": round(now - record.updated_at, 3),
        "collectives": record.collectives_completed,
        "collective_seconds": round(record.collective_seconds, 6),
        "tokens": record.tokens,
        "backend": record.backend,
        "device_type": record.device_type,
        "compute_dtype": record.compute_dtype,
        "torch_version": record.torch_version,
        "data_fingerprint": record.data_fingerprint,
    }


def visible(records: list[Record], alive: list[bool], show_all: bool) -> list[tuple[Record, bool]]:
    """Live ranks, plus the gone ranks of runs that still have a live rank
    (a rank that died in a running job is the point); everything with show_all."""
    pairs = list(zip(records, alive))
    if show_all:
        return pairs
    live_runs = {(r.run_id, r.hostname) for r, a in pairs if a}
    return [(r, a) for r, a in pairs if a or (r.run_id, r.hostname) in live_runs]


def rows(records, alive, now: float, show_all: bool = False) -> list[dict]:
    chosen = visible(list(records), list(alive), show_all)
    chosen.sort(key=lambda p: (p[0].run_id, p[0].rank, p[0].pid))
    return [row(r, a, now) for r, a in chosen]


def table(rows_: list[dict]) -> str:
    if not rows_:
        return "no ranks found"
    cells = [[h for _, h, _ in COLUMNS]]
    for r in rows_:
        cells.append([fmt.format(r[key]) if r[key] != "" else "-" for key, _, fmt in COLUMNS])
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells)
