"""Host family: the node a rank runs on, and how crowded it is. Pure."""
from __future__ import annotations

from ...observe.snapshot import Snapshot
from .spec import NUMBER, declare

SIGNALS = declare(
    ("cpu_bf16", bool, "this CPU has avx512_bf16 or amx_bf16"),
    ("cores", int, "logical CPUs", "count"),
    ("cpu_model", str, "the CPU's model name (/proc/cpuinfo) on the rank's node"),
    ("node", str, "the hostname of the rank's node"),
    ("hostname_addrs", str, "what resolving it gives there (for a rank in another "
                            "namespace: what its own /etc/hosts gives, and what was not "
                            "looked up there)"),
    ("ns_unseen", str, "what of the rank's own namespace (hostname, hosts file, DNS, "
                       "interfaces) the watcher could not see ('' all seen, or its "
                       "namespaces are the watcher's)"),
    ("local_ranks", int, "ranks of the job on this node", "count"),
    ("oversubscription", NUMBER, "intra-op threads x local ranks / cores", "ratio"),
)


def measure(s: dict, last: Snapshot) -> None:
    """Adds to a rank's signals `s` (every rank of the job, dead ones too)."""
    cores = last.host.cpu.logical_cores if last.host else None
    flags = set(last.host.cpu.flags) if last.host else None
    s["cores"] = cores
    s["cpu_model"] = (last.host.cpu.model_name or None) if last.host else None
    s["cpu_bf16"] = None if flags is None else bool(flags & {"avx512_bf16", "amx_bf16"})
    s["local_ranks"] = len(last.job.rank_pids)
    threads = s.get("intra_op_threads") or cores
    if threads and cores:
        s["oversubscription"] = round(threads * max(len(last.job.rank_pids), 1) / cores, 2)
    s["node"] = last.host.hostname if last.host else ""
    if last.host:
        s["hostname_addrs"] = ", ".join(last.host.hostname_addrs) or "nothing"
    view = ns_view(last, s.get("pid"))
    if view is None:
        return
    # the rank's own node: never the watcher's answer in its place
    s["ns_unseen"] = view.unseen
    if view.hostname:
        s["node"] = view.hostname
        addrs = ", ".join(view.hostname_addrs)
        s["hostname_addrs"] = addrs if view.resolved else (
            f"{addrs or 'nothing'} by its /etc/hosts ({view.unseen})" if view.unseen
            else addrs or "nothing")


def ns_view(snap: Snapshot, pid):
    """The nshost probe's view of `pid` (None: its namespaces are the watcher's,
    or not looked)."""
    if snap.ns_hosts is None:
        return None
    return snap.ns_hosts.by_pid.get(pid)
