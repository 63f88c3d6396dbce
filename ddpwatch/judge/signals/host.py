"""Host family: the node a rank runs on, and how crowded it is. Pure."""
from __future__ import annotations

from ...observe.snapshot import Snapshot
from .spec import NUMBER, declare

SIGNALS = declare(
    ("cpu_bf16", bool, "this CPU has avx512_bf16 or amx_bf16"),
    ("cores", int, "logical CPUs"),
    ("node", str, "the hostname of the rank's node"),
    ("hostname_addrs", str, "what resolving it gives there"),
    ("local_ranks", int, "ranks of the job on this node"),
    ("oversubscription", NUMBER, "intra-op threads x local ranks / cores"),
)


def measure(s: dict, last: Snapshot) -> None:
    """Adds to a rank's signals `s` (every rank of the job, dead ones too)."""
    cores = last.host.cpu.logical_cores if last.host else None
    flags = set(last.host.cpu.flags) if last.host else None
    s["cores"] = cores
    s["cpu_bf16"] = None if flags is None else bool(flags & {"avx512_bf16", "amx_bf16"})
    s["local_ranks"] = len(last.job.rank_pids)
    threads = s.get("intra_op_threads") or cores
    if threads and cores:
        s["oversubscription"] = round(threads * max(len(last.job.rank_pids), 1) / cores, 2)
    s["node"] = last.host.hostname if last.host else ""
    if last.host:
        s["hostname_addrs"] = ", ".join(last.host.hostname_addrs) or "nothing"
