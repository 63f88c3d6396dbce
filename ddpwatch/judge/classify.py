"""classify(history, rules) -> Judgement. Pure: snapshots in, verdicts out.

One rank's 0% CPU means nothing alone; so signals are first measured per rank,
then completed with what the peers do (who waits, who is behind, whose op
differs), and only then are the rules applied.
"""
from __future__ import annotations

import bisect
import statistics
from collections import Counter
from dataclasses import dataclass

from .dropped import inbound_signals, link_dropped
from .gloo_iface import interface_signals, link_unreached
from .membership import launch_signals, orphan_signals
from ..heartbeat import Record
from .rules import Rule, render
from .signals import IDLE_CPU, heartbeat_signals, owns, process_signals, record_of, stack_signals
from ..observe.snapshot import Snapshot
from .vocabulary import SEVERITY
from .window import straggle_signals, window_signals

STALL_FLOOR_S = 2.0      # never call a collective stalled before this
STALL_FACTOR = 10.0      # ... nor before 10x the slowest of its recent durations
WARMUP_STEPS = 2


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str
    evidence: str
    remedy: str


@dataclass(frozen=True)
class RankVerdict:
    pid: int
    rank: int
    local_rank: int
    host: str
    verdict: str
    role: str
    confidence: float
    rule: str
    evidence: str
    remedy: str
    findings: tuple[Finding, ...]
    stack: str
    signals: dict[str, object]
    remote: bool = False  # on another node: judged here from its daemon's signals


@dataclass(frozen=True)
class JobVerdict:
    verdict: str
    culprits: tuple[int, ...]
    summary: str


@dataclass(frozen=True)
class Judgement:
    job: JobVerdict
    ranks: tuple[RankVerdict, ...]
    # this node's ranks' signals before the peers' were added, JSON scalars only:
    # what the daemon serves its peers at /peer
    local: tuple[dict, ...] = ()


# A dead rank of this job was alive when the job's live ranks started: its last
# heartbeat is not older than their start, give or take this much.
MEMBER_SLACK_S = 5.0


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


def _stall_bound(record: Record) -> float:
    durations = [e.end - e.start for e in record.ring if e.op == record.op and e.end > 0]
    return max(STALL_FLOOR_S, STALL_FACTOR * max(durations, default=0.0))


def measure(history: tuple[Snapshot, ...], remote: tuple[dict, ...] = ()) -> list[dict]:
    """Per-rank signals, completed with the cross-rank ones. `remote`: the local
    signals of this job's ranks on other nodes, as their daemons measured them
    (the peer view); they join before the cross-rank step, so a culprit on
    another node is named here too."""
    return _with_peers(local_signals(history), remote)


def _with_peers(local: list[dict], remote: tuple[dict, ...]) -> list[dict]:
    ranks = [dict(s) for s in local]  # _cross adds to them; `local` stays as measured
    held = {s["rank"] for s in ranks if isinstance(s.get("rank"), int) and s["rank"] >= 0}
    for s in remote:  # a rank held here, or already given by another peer, is not added
        if s.get("rank") not in held:
            held.add(s.get("rank"))
            ranks.append(dict(s, remote=True))
    _cross(ranks)
    straggle_signals(ranks)
    for s in ranks:
        s.update(orphan_signals(s))
    link_unreached(ranks)
    link_dropped(ranks)
    return ranks


def local_signals(history: tuple[Snapshot, ...]) -> list[dict]:
    """Per-rank signals from what this node saw: every value a rule needs that
    does not depend on the peers. Clock-free (ratios, ages, flags), so another
    node's daemon can judge with them (see measure)."""
    last = history[-1]
    host_cores = last.host.cpu.logical_cores if last.host else None
    flags = set(last.host.cpu.flags) if last.host else None
    ranks = []
    pids = list(last.job.rank_pids)
    if not pids and last.job.launcher_pid > 0:
        pids = [last.job.launcher_pid]  # a launcher whose workers never started
    records = {r.pid: (r, alive) for r, alive in job_records(last)}
    for pid in pids:
        s = process_signals(history, pid)
        s.update(heartbeat_signals(history, pid))
        s.update(stack_signals(history, pid))
        s.update(interface_signals(history, pid))
        s.update(inbound_signals(history, pid))
        s.update(window_signals(history, pid))
        s.update(launch_signals(history, pid, s))
        if s.get("rank", -1) in (-1, None) and s.get("hb_rank") is not None:
            s["rank"], s["world_size"] = s["hb_rank"], s["hb_world_size"]
        s["launcher_only"] = not last.job.rank_pids
        ranks.append(s)
    for pid, (rec, alive) in records.items():
        if pid in pids:
            continue
        s = {"pid": pid, "alive": False, "rank": rec.rank, "world_size": rec.world_size,
             "launcher_only": False}
        s.update(heartbeat_signals(history, pid))
        ranks.append(s)
    ranks += _missing(ranks)
    for s in ranks:
        rec = records.get(s["pid"], (None,))[0]
        s["cores"] = host_cores
        s["cpu_bf16"] = None if flags is None else bool(flags & {"avx512_bf16", "amx_bf16"})
        s["local_ranks"] = len(last.job.rank_pids)
        threads = s.get("intra_op_threads") or host_cores
        if threads and host_cores:
            s["oversubscription"] = round(threads * max(len(last.job.rank_pids), 1) / host_cores, 2)
        hb_inside = s.get("hb_phase") == "inside"
        stalled_hb = hb_inside and rec is not None and s["hb_inside_s"] > _stall_bound(rec)
        s["hb_stall_bound_s"] = round(_stall_bound(rec), 3) if rec is not None else None
        stack_waits = s.get("stack") in ("collective", "ddp_backward")
        s["in_collective"] = bool(hb_inside or stack_waits) if s.get("alive") else False
        idle = s.get("cpu_ratio") is not None and s["cpu_ratio"] < IDLE_CPU
        s["blocked"] = bool(s["in_collective"] and idle and (stalled_hb or (
            not s.get("hb") and stack_waits)))
        # torch/_dynamo and torch/_inductor frames are on the stack of every step of
        # a compiled model, not only while it compiles: a rank whose heartbeat
        # advances past the first steps runs compiled code, it is not warming up.
        compiling = s.get("stack") == "compile" and not (
            s.get("hb_advanced") and s.get("hb_step", 0) >= WARMUP_STEPS)
        s["warming_up"] = bool(compiling or (
            s.get("hb") and s.get("hb_step", 0) < WARMUP_STEPS and not stalled_hb
            and s.get("hb_phase") != "rendezvous"))
        s["device_type"] = rec.device_type if rec is not None else None
        s["waiting_in"] = _waiting_in(s)
        s["local_rank"] = _local_rank(last, s["pid"])
        s["node"] = last.host.hostname if last.host else ""
        if last.host:
            s["hostname_addrs"] = ", ".join(last.host.hostname_addrs) or "nothing"
    return ranks


def _missing(ranks: list[dict]) -> list[dict]:
    """Ranks of an all-local job that have neither a process nor a record here: a
    plain script's rank that died leaves nothing else behind (no heartbeats)."""
    live = [s for s in ranks if s.get("alive")]
    worlds = {s.get("world_size") for s in live if (s.get("world_size") or 0) > 0}
    if len(worlds) != 1 or not all(s.get("all_ranks_local") for s in live) or not live:
        return []
    (world,) = worlds
    seen = {s.get("rank") for s in ranks}
    return [{"pid": -1, "alive": False, "rank": r, "world_size": world, "missing": True,
             "launcher_only": False} for r in range(world) if r not in seen]


def _waiting_in(s: dict) -> str | None:
    """The collective a rank waits in: from its heartbeat, else from its stack."""
    if s.get("hb_phase") == "inside":
        return s.get("hb_op")
    if s.get("stack") == "ddp_backward":
        return "ddp_bucket_all_reduce"
    if s.get("stack") == "collective":
        return (s.get("stack_top") or "?").split(" ")[0]
    return None


class _PeerMedian:
    """Median of a signal over a rank's live peers, for every rank in O(n log n):
    the values are sorted once, and a rank's own value is left out by index
    (the daemon judges jobs of hundreds of ranks every second)."""

    def __init__(self, ranks: list[dict], key: str):
        self.key = key
        self.values = sorted(s[key] for s in ranks if s.get("alive") and s.get(key) is not None)

    def of_peers(self, s: dict):
        values = self.values
        own = s.get(self.key) if s.get("alive") else None
        if own is not None:
            i = bisect.bisect_left(values, own)
            values = values[:i] + values[i + 1:]
        return statistics.median(values) if values else None


def _cross(ranks: list[dict]) -> None:
    fingerprints = Counter(s.get("data_fp") for s in ranks if s.get("data_fp"))
    joining = sum(1 for p in ranks if p.get("alive") and (
        p.get("stack") == "rendezvous" or p.get("hb_phase") in ("rendezvous", "init")))

    def is_stopped(p):
        return bool(p.get("alive") and p.get("state") in ("T", "t"))

    def is_dead(p):  # a missing rank while peers still join has not started: not dead
        return not p.get("alive") and p.get("hb_phase") != "exited" and not (
            p.get("missing") and joining)
    alive = sum(1 for s in ranks if s.get("alive"))
    blocked = sum(1 for s in ranks if s.get("blocked"))
    dead = sum(1 for s in ranks if is_dead(s))
    exited = sum(1 for s in ranks if not s.get("alive") and s.get("hb_phase") == "exited")
    stopped = sum(1 for s in ranks if is_stopped(s))
    seqs = sorted((s["hb_seq"] for s in ranks if s.get("hb_seq") is not None), reverse=True)
    # Desync is a hang: only ranks stuck past their bound count, so a healthy
    # rank caught between two different collectives is not one.
    stuck = [p for p in ranks if p.get("blocked") and p.get("waiting_in")]
    ops_differ = len(stuck) >= 2 and len({p["waiting_in"] for p in stuck}) > 1
    step, share, cpu, wait = (_PeerMedian(ranks, k) for k in (
        "hb_step_s", "hb_comm_share", "cpu_ratio", "runqueue_wait_ratio"))
    for s in ranks:
        me_alive, me_blocked = bool(s.get("alive")), bool(s.get("blocked"))
        me_dead = is_dead(s)
        s["peers_alive"] = alive - me_alive
        s["peers_blocked"] = blocked - me_blocked
        s["peers_in_rendezvous"] = joining - bool(s.get("alive") and (
            s.get("stack") == "rendezvous" or s.get("hb_phase") in ("rendezvous", "init")))
        s["peer_dead"] = dead - me_dead > 0
        s["peer_exited"] = exited - (not me_alive and s.get("hb_phase") == "exited") > 0
        s["peer_stopped"] = stopped - is_stopped(s) > 0
        if s.get("hb_seq") is not None and len(seqs) > 1:
            furthest = seqs[1] if s["hb_seq"] == seqs[0] else seqs[0]
            s["seq_behind"] = furthest - s["hb_seq"]
        s["peer_ops_differ"] = me_blocked and ops_differ
        peer_step = step.of_peers(s)
        if s.get("hb_step_s") and peer_step:
            s["step_time_ratio"] = round(s["hb_step_s"] / peer_step, 3)
        peer_share = share.of_peers(s)
        if s.get("hb_comm_share") is not None and peer_share:
            s["comm_share_ratio"] = round(s["hb_comm_share"] / peer_share, 3)
            s["peer_comm_share"] = peer_share
        s["peer_cpu_ratio"] = cpu.of_peers(s)
        peer_wait = wait.of_peers(s)
        if s.get("runqueue_wait_ratio") is not None and peer_wait is not None:
            s["runqueue_wait_vs_peers"] = round(s["runqueue_wait_ratio"] / max(peer_wait, 0.02), 2)
        if s.get("data_fp"):
            # With two ranks there is no majority to blame: every rank carries it.
            s["data_parity"] = len(fingerprints) > 1
            s["data_fps"] = ", ".join(f"{fp} ({n} rank{'s' if n > 1 else ''})"
                                      for fp, n in fingerprints.most_common())


def judge(history: tuple[Snapshot, ...], rules: list[Rule],
          remote: tuple[dict, ...] = ()) -> Judgement:
    verdict_rules = sorted((r for r in rules if r.verdict), key=lambda r: -r.priority)
    finding_rules = [r for r in rules if r.finding]
    verdicts = []
    local = local_signals(history)
    for s in _with_peers(local, remote):
        rule = next((r for r in verdict_rules if r.matches(s)), None)
        findings = tuple(Finding(r.finding, r.severity, render(r.evidence, s), render(r.remedy, s))
                         for r in finding_rules if r.matches(s))
        verdicts.append(RankVerdict(
            pid=s["pid"], rank=s.get("rank", -1) if s.get("rank") is not None else -1,
            local_rank=s.get("local_rank", -1), host=s.get("node", ""),
            remote=bool(s.get("remote")),
            verdict=rule.verdict if rule else "unknown",
            role=rule.role if rule else "none",
            confidence=rule.confidence if rule else 0.0,
            rule=rule.id if rule else "",
            evidence=render(rule.evidence, s) if rule else _blind(s),
            remedy=render(rule.remedy, s) if rule else "Check that ddpwatch may read /proc "
            "and ptrace the ranks (run as the ranks' user or root), then diagnose again.",
            findings=findings, stack=s.get("stack_top", ""),
            signals={k: v for k, v in sorted(s.items()) if isinstance(v, (int, float, str, bool))}))
    verdicts.sort(key=lambda v: (v.rank if v.rank >= 0 else 1 << 30, v.pid))
    return Judgement(_job(verdicts), tuple(verdicts),
                     tuple({k: v for k, v in sorted(s.items()) if _scalar(v)} for s in local))


def _scalar(value) -> bool:
    return value is None or isinstance(value, (int, float, str, bool))


def _local_rank(snap: Snapshot, pid: int) -> int:
    if snap.processes is not None:
        for p in snap.processes.procs:
            if p.pid == pid and p.env.get("LOCAL_RANK", "").isdigit():
                return int(p.env["LOCAL_RANK"])
    rec = record_of(snap, pid)
    return rec.local_rank if rec is not None else -1


def _blind(s: dict) -> str:
    seen = [k for k in ("cpu_ratio", "stack", "hb") if s.get(k) not in (None, False)]
    return ("no rule matched what could be observed" if seen else
            "could not observe this rank (no CPU sample, no stack, no heartbeat)")


def _name(v: RankVerdict) -> str:
    name = f"rank {v.rank}" if v.rank >= 0 else f"pid {v.pid}"
    return f"{name} (on {v.host or 'a peer node'})" if v.remote else name


def _job(verdicts: list[RankVerdict]) -> JobVerdict:
    if not verdicts:
        return JobVerdict("unknown", (), "No rank of this job could be found.")
    verdict = _job_verdict(verdicts)
    # A critical misconfiguration may be why the job is in this state at all (a
    # rank's Gloo on loopback, while its peer failed to start): say it beside.
    critical = [f"{_name(v)}: {f.id.replace('_', ' ')}: {f.evidence}." for v in verdicts
                for f in v.findings if f.severity == "critical"]
    if not critical:
        return verdict
    return JobVerdict(verdict.verdict, verdict.culprits,
                      f"{verdict.summary} Critical: {' '.join(critical)}")


def _job_verdict(verdicts: list[RankVerdict]) -> JobVerdict:
    culprits = [v for v in verdicts if v.role == "culprit"]
    victims = [v for v in verdicts if v.role == "victim"]
    if culprits:
        lead = min(culprits, key=lambda v: SEVERITY.index(v.verdict))
        verdict = lead.verdict
        parts = [f"{_name(c)} is the culprit ({c.verdict.replace('_', ' ')}): {c.evidence}."
                 for c in culprits]
        if victims:
            parts.append(f"{', '.join(_name(v) for v in victims)} "
                         f"{'waits' if len(victims) == 1 else 'wait'} on it "
                         f"({', '.join(sorted({v.verdict.replace('_', ' ') for v in victims}))}).")
        parts.append(f"Remedy: {lead.remedy}")
        return JobVerdict(verdict, tuple(c.rank for c in culprits), " ".join(parts))
    worst = min(verdicts, key=lambda v: SEVERITY.index(v.verdict))
    if worst.verdict == "healthy":
        where = "" if any(v.remote for v in verdicts) else " local"
        summary = f"All {len(verdicts)}{where} rank(s) are making progress."
    else:
        who = [v for v in verdicts if v.verdict == worst.verdict]
        summary = (f"{', '.join(_name(v) for v in who)}: {worst.verdict.replace('_', ' ')}: "
                   f"{worst.evidence}. No local culprit: "
                   + ("the rank they wait for may be on another node. " if worst.verdict ==
                      "blocked_in_collective" else "") + f"Remedy: {worst.remedy}")
    return JobVerdict(worst.verdict, (), summary)
