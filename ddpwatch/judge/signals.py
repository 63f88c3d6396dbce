"""The named signals rules combine: measured facts per rank, derived from a
short history of snapshots (oldest first). Pure.

Every signal is documented in SIGNALS; a rule naming anything else is rejected
by the rules loader. A value that could not be measured is None, and a
condition on None is false (a blind watcher must not conclude anything).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..heartbeat import Record
from ..heartbeat.liveness import wrote
from ..observe.snapshot import Snapshot
from .stackmatch import classify_stack, describe_top

SIGNALS = {
    # identity
    "pid": "process id", "rank": "global rank (env or heartbeat), -1 unknown",
    "world_size": "world size, -1 unknown",
    # process
    "alive": "the rank's process exists",
    "state": "process state letter: R running, S sleeping, D disk, T stopped, Z zombie",
    "cpu_ratio": "CPU used over the window, in cores (1.0 = one core busy)",
    "runqueue_wait_ratio": "time the rank's threads waited for a CPU over the window, in cores",
    "orphan": "the process's parent is gone (re-parented to init or a subreaper)",
    "holds_master_port": "the process listens on the job's MASTER_PORT",
    "intra_op_threads": "OMP_NUM_THREADS of the rank (torch's default: all cores)",
    "window_s": "seconds between the oldest and newest snapshot",
    # heartbeat
    "hb": "the rank writes heartbeat records",
    "hb_phase": "init, rendezvous, outside, inside or exited",
    "hb_op": "current or last collective", "hb_seq": "collective sequence number",
    "hb_step": "training step", "hb_age_s": "seconds since the last heartbeat",
    "hb_inside_s": "seconds inside the current collective (0 when outside)",
    "hb_advanced": "seq or step moved within the window",
    "hb_op_novel": "the current collective is one this rank did not call in its last 64",
    "hb_step_s": "duration of the last step", "hb_comm_share": "share of step time in collectives over the window (all "
                                 "steps so far when no step ended in it)",
    "compute_dtype": "dtype the rank computes in (heartbeat)",
    # stacks
    "stack": "main thread: collective, ddp_backward, rendezvous, compile, agent, idle_user, "
             "active, stopped or unknown (py-spy)",
    "stack_top": "the innermost frames of the main thread",
    "stack_samples": "stack dumps taken in the window",
    # sockets
    "syn_sent": "TCP connects stuck in SYN-SENT (a firewall or wrong address)",
    "syn_sent_to": "where a SYN-SENT socket points (a data connection's, if any)",
    "syn_sent_data": "a stuck connect goes to a port other than MASTER_PORT: Gloo's data "
                     "connection to a port a peer picked at run time, past the rendezvous",
    "peer_idle_s": "seconds since any established TCP socket of the rank sent or received",
    "retransmits": "retransmitted segments over the rank's sockets",
    # interfaces (sockets + host)
    "gloo_addr": "the address the rank's Gloo listens on and tells its peers to connect to "
                 "(its listening socket other than MASTER_PORT)",
    "gloo_port": "the port of that listening socket",
    "gloo_iface": "the interface holding gloo_addr", "gloo_iface_kind":
        "loopback, vpn, bridge, veth or regular (by name: tailscale0, docker0...)",
    "gloo_loopback": "gloo_addr is a loopback address (127.x, ::1)",
    "gloo_ifname": "GLOO_SOCKET_IFNAME of the rank ('' unset: Gloo resolves the hostname)",
    "master_route_addr": "this rank's address on its connection to MASTER_ADDR:MASTER_PORT: "
                         "the route to the other nodes",
    "master_route_iface": "the interface holding master_route_addr",
    "gloo_unconnected": "peers this rank has no Gloo data connection with: world size - 1 - "
                        "its established TCP connections off MASTER_PORT (0 once the "
                        "group is up)",
    "gloo_off_route": "Gloo listens on another address than the rank reaches the master "
                      "from, and one picked by the hostname (GLOO_SOCKET_IFNAME unset), on a "
                      "VPN/bridge/veth interface, or of the other address family",
    # host
    "cpu_bf16": "this CPU has avx512_bf16 or amx_bf16", "cores": "logical CPUs",
    "node": "the hostname of the rank's node", "hostname_addrs": "what resolving it gives there",
    # across the job (computed with the peers)
    "local_ranks": "ranks of the job on this node",
    "in_collective": "this rank waits in a collective (heartbeat or stack)",
    "blocked": "in a collective and using ~no CPU",
    "peers_blocked": "other ranks that are blocked",
    "peers_alive": "other ranks that are alive",
    "seq_behind": "collectives this rank is behind the furthest peer",
    "peer_dead": "a rank of the job died (its record remains, its process is gone)",
    "peer_stopped": "another rank of the job is stopped (state T): the others' shares of "
                    "time in collectives no longer compare",
    "peer_ops_differ": "stuck ranks wait in different collectives",
    "waiting_in": "the collective this rank waits in (heartbeat op, else from its stack)",
    "step_time_ratio": "this rank's step time over the peers' median",
    "comm_share_ratio": "this rank's share of time in collectives over the peers' median",
    "data_parity": "this rank's data fingerprint differs from the peers' majority",
    "syn_sent_to_rank": "the rank whose Gloo address this rank's stuck connect dials",
    "syn_sent_to_off_route": "that rank's Gloo listens off its own route to the master "
                             "(gloo_off_route or gloo_loopback)",
    "gloo_unreached_by": "peers whose connects to this rank's Gloo address sit in SYN-SENT",
    "syn_in_unanswered": "peers' connection attempts that arrived on this node for a port the "
                         "rank listens on and were never answered (traffic probe; None: no "
                         "capture, or the rank is in another network namespace)",
    "syn_in_from": "where those attempts come from",
    "syn_in_first_from": "where the first of them came from",
    "syn_in_port": "the port the first of them dials",
    "syn_in_ports": "how many of the rank's ports they dial",
    "syn_in_last_s": "seconds since the last of them arrived",
    "syn_in_iface": "the interface they arrive on",
    "syn_in_retries": "their retransmissions (each one the dialer giving up on an answer)",
    "syn_in_for_s": "seconds since the first of them arrived",
    "syn_in_dropped_at": "the address:port pairs they dial (space-separated)",
    "syn_sent_dropped_by": "the rank whose node receives and drops this rank's stuck connect",
    "syn_sent_dropped_node": "that rank's node",
    "loopback_peer": "another rank of a multi-node job whose Gloo listens on loopback and is "
                     "not connected to all its peers (None: no such rank)",
    "warming_up": "first steps or compilation frames",
    "launcher_only": "a launcher with no rank processes",
    "all_ranks_local": "every rank of the job runs on this node (master on loopback, or "
                       "LOCAL_WORLD_SIZE == WORLD_SIZE)",
    "missing": "a rank of an all-local job with no process and no record on this node",
    "peers_in_rendezvous": "other ranks still in init_process_group (stack or heartbeat)",
    "peer_exited": "a rank of the job left cleanly (record says exited) while this one runs",
    "peer_comm_share": "the peers' median share of step time in collectives",
    "peer_cpu_ratio": "the peers' median CPU over the window, in cores",
    "runqueue_wait_vs_peers": "this rank's run-queue wait over the peers' median (on a busy "
                              "node every rank waits some; a starved one waits more)",
    "oversubscription": "intra-op threads x local ranks / cores",
    "hb_stall_bound_s": "learned bound: max(2 s, 10x the slowest recent run of this op)",
    "device_type": "device the rank trains on (heartbeat)",
    "data_fp": "data fingerprint (heartbeat: shard list + batches)",
    "data_fps": "the fingerprints seen across the job, with counts",
    "hb_rank": "rank as the heartbeat record says", "hb_world_size": "world size (record)",
}

IDLE_CPU = 0.05  # cores: below this a rank is not computing
LOCAL_ADDRS = frozenset(("127.0.0.1", "localhost", "::1"))


@dataclass(frozen=True)
class Window:
    first: Snapshot
    last: Snapshot

    @property
    def seconds(self) -> float:
        return max(self.last.taken_at - self.first.taken_at, 0.0)


def proc_of(snap: Snapshot, pid: int):
    if snap.processes is None:
        return None
    return next((p for p in snap.processes.procs if p.pid == pid and not p.error), None)


def record_of(snap: Snapshot, pid: int) -> Record | None:
    """The record `pid` wrote: records outlive their writers, and a pid can come
    back as a new process (a rank of a later job) next to its old record."""
    if snap.heartbeats is None:
        return None
    found = [r for r in snap.heartbeats.records if r.pid == pid and owns(snap, r)]
    return max(found, key=lambda r: r.started_at, default=None)


def owns(snap: Snapshot, record: Record) -> bool:
    """False when the process now holding the record's pid started after the record
    was created (pid reuse); True when it wrote it or is gone."""
    proc = proc_of(snap, record.pid)
    if proc is None:
        return True
    if proc.uid >= 0 and record.uid != proc.uid:
        return False  # another user's file claiming this pid: not the rank's
    procs = snap.processes
    if procs.uptime_s < 0:
        return wrote(record, proc.start_time_s)
    suspended = max(procs.uptime_s - procs.taken_at, 0.0)  # boot clock ahead of monotonic
    boot_wall = snap.wall_time - (snap.taken_at - procs.taken_at) - procs.uptime_s
    return wrote(record, proc.start_time_s, suspended, boot_wall)


def _stacks(snaps: tuple[Snapshot, ...], pid: int):
    found = []
    for snap in snaps:
        if snap.stacks is None:
            continue
        found += [p for p in snap.stacks.pids if p.pid == pid]
    return found


def socket_entry(snap: Snapshot, pid: int):
    """The sockets probe's PidSockets of `pid` (its namespace, error, interfaces)."""
    if snap.sockets is None:
        return None
    return next((p for p in snap.sockets.pids if p.pid == pid), None)


def sockets_of(snap: Snapshot, pid: int):
    entry = socket_entry(snap, pid)
    return entry.sockets if entry else ()


def process_signals(history: tuple[Snapshot, ...], pid: int) -> dict:
    w = Window(history[0], history[-1])
    now, before = proc_of(w.last, pid), proc_of(w.first, pid)
    s: dict = {"pid": pid, "window_s": round(w.seconds, 3), "alive": now is not None}
    if now is None:
        return s
    env = now.env
    s["state"] = now.state
    s["rank"] = int(env["RANK"]) if env.get("RANK", "").isdigit() else -1
    s["world_size"] = int(env["WORLD_SIZE"]) if env.get("WORLD_SIZE", "").isdigit() else -1
    s["orphan"] = now.ppid == 1
    # Where the peers are: with the master on loopback every rank runs here.
    s["all_ranks_local"] = env.get("MASTER_ADDR", "") in LOCAL_ADDRS or env.get(
        "LOCAL_WORLD_SIZE", "-") == env.get("WORLD_SIZE")
    omp = env.get("OMP_NUM_THREADS", "")
    s["intra_op_threads"] = int(omp) if omp.isdigit() else None
    if before is not None and w.seconds > 0 and now.cpu_seconds >= 0 and before.cpu_seconds >= 0:
        s["cpu_ratio"] = round((now.cpu_seconds - before.cpu_seconds) / w.seconds, 3)
        # -1 marks an unreadable schedstat: leave those threads out
        wait_now = sum(t.sched.runqueue_wait_s for t in now.threads if t.sched.runqueue_wait_s >= 0)
        wait_before = sum(t.sched.runqueue_wait_s for t in before.threads
                          if t.sched.runqueue_wait_s >= 0)
        s["runqueue_wait_ratio"] = round(max(wait_now - wait_before, 0.0) / w.seconds, 3)
    port = env.get("MASTER_PORT", "")
    socks = sockets_of(w.last, pid)
    s["holds_master_port"] = bool(port.isdigit() and any(
        k.state == "LISTEN" and k.local_port == int(port) for k in socks))
    syn = [k for k in socks if k.state in ("SYN-SENT", "SYN_SENT")]
    data = [k for k in syn if port.isdigit() and k.peer_port != int(port)]
    s["syn_sent"] = len(syn)
    s["syn_sent_data"] = bool(data) if port.isdigit() else None
    first = (data or syn)[0] if syn else None
    s["syn_sent_to"] = f"{first.peer_addr}:{first.peer_port}" if first else ""
    established = [k for k in socks if k.state == "ESTABLISHED" and k.last_send_ms >= 0]
    if established:
        s["peer_idle_s"] = round(min(min(k.last_send_ms, k.last_recv_ms)
                                     for k in established) / 1000, 3)
        s["retransmits"] = sum(max(k.retransmits, 0) for k in established)
    return s


def heartbeat_signals(history: tuple[Snapshot, ...], pid: int) -> dict:
    first, last = record_of(history[0], pid), record_of(history[-1], pid)
    if last is None:
        return {"hb": False}
    now = history[-1].taken_at
    s = {"hb": True, "hb_phase": last.phase, "hb_op": last.op, "hb_seq": last.collective_seq,
         "hb_step": last.step, "hb_age_s": round(now - last.updated_at, 3),
         "hb_inside_s": round(now - last.entered_at, 3) if last.in_collective else 0.0,
         "hb_advanced": first is not None and (first.collective_seq, first.step) != (
             last.collective_seq, last.step),
         "hb_step_s": round(last.last_step_seconds, 4),
         "hb_comm_share": _comm_share(first, last),
         "compute_dtype": last.compute_dtype or None,
         "hb_rank": last.rank, "hb_world_size": last.world_size,
         "data_fp": last.data_fingerprint or None}
    if last.in_collective:
        past_ops = {e.op for e in last.ring if e.seq < last.collective_seq}
        s["hb_op_novel"] = bool(past_ops) and last.op not in past_ops
    return s


def _comm_share(first: Record | None, last: Record) -> float | None:
    """Share of step time spent with a collective outstanding, over the window:
    the cumulative share drags the first steps along (one rank allocating or
    compiling while the other waits), which made a healthy job look like it had
    a straggler for its first minute."""
    if first is not None and last.step_seconds > first.step_seconds:
        window = (last.collective_seconds - first.collective_seconds) / (
            last.step_seconds - first.step_seconds)
        return round(min(max(window, 0.0), 1.0), 4)
    return round(last.collective_seconds / last.step_seconds, 4) if last.step_seconds > 0 else None


def stack_signals(history: tuple[Snapshot, ...], pid: int) -> dict:
    dumps = [d for d in _stacks(history, pid) if d.threads]
    stopped = [d for d in _stacks(history, pid) if d.status.startswith("stopped")]
    if not dumps:
        return {"stack": "stopped" if stopped else None, "stack_samples": 0}
    kinds = [classify_stack(d) for d in dumps]
    # One dump is not evidence (healthy ranks spend much time in the same wait):
    # the stack signal is the kind seen in every sample, else "mixed".
    kind = kinds[0] if len(set(kinds)) == 1 else "mixed"
    return {"stack": kind, "stack_top": describe_top(dumps[-1]), "stack_samples": len(dumps)}
