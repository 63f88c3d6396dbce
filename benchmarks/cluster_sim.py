"""A simulated cluster of ddpwatch daemons: the series N nodes x R ranks export.

One DDP job spans every node (its `ddp_job` label is the same everywhere; each
node is its own scrape target, `instance`). Each node's series are rows in the
daemon's own shape (ddpwatch/publish/metrics.py SPECS: names, label names,
value vocabularies), rendered through its `to_families`, so a family or label
the daemon does not export cannot appear here. Values follow one model of a
training job, evaluated at any time t (seconds since the phase started):

* healthy: one step per STEP_S, COLLECTIVES_PER_STEP collectives per step, each
  rank with its own jitter (share of time in collectives 0.28-0.34, step time
  +-2%, arrival lateness 0-20 ms, heartbeat age 50-300 ms);
* from `onset_s` on, one fault with its culprit hidden among the others:
  - stopped: the culprit is SIGSTOPped outside a collective; its daemon names it
    (culprit, verdict stopped); every other rank blocks in the next collective.
  - lagging: the culprit stalls BEHIND collectives behind the others, which block;
    its daemon judges it only `slowing` (calm, names no culprit), so no daemon
    names it and the cross-node rule must.
  - straggler: the culprit enters every collective LATE_S after its node's
    other ranks; every rank's step stretches to SLOW_STEP_S and the others wait;
    its daemon says `slowing`, then (after straggler_after_s) names it straggler.
  - node_down: the culprit's node's daemon stops answering (scrape fails, `up`
    0, its series go stale); the ranks everywhere else block.

`expected()` says which alerts of rules/prometheus/ddpwatch-alerts.yaml must
fire at a time, with which labels; `promtool_test()` writes them as a `promtool
test rules` file over input series sampled from the same model.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from ddpwatch import __version__
from ddpwatch.judge.vocabulary import CALM, FINDINGS, NAMES as VERDICTS, ROLES
from ddpwatch.publish.metrics import SPECS, STAGES

SCRAPE_JOB = "ddpwatch"      # the rules' DDPWatchDaemonDown selects up{job="ddpwatch"}
NODE_PORT = 19500            # ddpwatch run's default port (promtool instances only)
STEP_S = 1.0
COLLECTIVES_PER_STEP = 10
BEHIND = 3                   # lagging: collectives behind the blocked ranks
LATE_S = 0.6                 # straggler: how late it enters each collective
SLOW_STEP_S = STEP_S + LATE_S
STRAGGLER_AFTER_S = 30.0     # the daemon's straggler_after_s (ddpwatch/config.py)
PROBES = ("heartbeats", "process", "sockets")
HTTP_REFUSALS = ("accept_errors", "busy_503", "cut", "evicted", "expired")
SCENARIOS = ("stopped", "lagging", "straggler", "node_down")

Row = tuple[str, tuple[str, ...], float]


@dataclass(frozen=True)
class Culprit:
    node: int
    local: int
    rank: int


def pick_culprit(scenario: str, nodes: int, rpn: int, seed: int = 0) -> Culprit:
    """Somewhere in the middle of the cluster (not the first or last node), a
    different place per scenario and seed."""
    rng = random.Random(f"{scenario}/{nodes}/{rpn}/{seed}")
    node = rng.randrange(1, nodes - 1) if nodes > 2 else nodes - 1
    local = rng.randrange(rpn)
    return Culprit(node, local, node * rpn + local)


class Cluster:
    """`rows(node, t)`: what node `node`'s daemon exports t seconds into the
    phase (None: it does not answer)."""

    def __init__(self, scenario: str, nodes: int, rpn: int, ddp_job: str,
                 onset_s: float, seed: int = 0, wall0: float = 1.7e9):
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r} (one of {', '.join(SCENARIOS)})")
        self.scenario, self.nodes, self.rpn = scenario, nodes, rpn
        self.ddp_job, self.onset, self.wall0 = ddp_job, onset_s, wall0
        self.culprit = pick_culprit(scenario, nodes, rpn, seed)
        rng = random.Random(f"jitter/{seed}")
        self.jitter = [(rng.random(), rng.random(), rng.random(), rng.random())
                       for _ in range(nodes * rpn)]

    # --- progress ---------------------------------------------------------------
    def steps(self, t: float) -> int:
        if self.scenario == "straggler" and t > self.onset:
            return 100 + int(self.onset / STEP_S) + int((t - self.onset) / SLOW_STEP_S)
        if self.scenario != "straggler":
            t = min(t, self.onset)  # the hangs freeze everyone's step count
        return 100 + int(t / STEP_S)

    def _rank(self, g: int, t: float) -> dict:
        """One rank's heartbeat-derived values and its daemon's verdict at t."""
        j = self.jitter[g]
        share, dur, age, late = 0.28 + 0.06 * j[0], STEP_S * (0.98 + 0.04 * j[1]), \
            0.05 + 0.25 * j[2], 0.02 * j[3]
        c, tau = self.culprit, t - self.onset
        is_c, after = g == c.rank, tau > 0
        steps = self.steps(t)
        seq = COLLECTIVES_PER_STEP * steps
        v = dict(verdict="healthy", role="none", alive=1.0, steps=steps, seq=seq, colls=seq,
                 age=age, inside=0.0, dur=dur, step_s=100.0 + min(t, self.onset) * dur / STEP_S,
                 coll_s=30.0 + share * t, cpu=200.0 + 0.97 * t, late=late,
                 times={"computing": 70.0 + (1 - share) * t, "collective": 30.0 + share * t})
        if not after:
            return v
        hang = self.scenario in ("stopped", "lagging", "node_down")
        if hang:
            frozen = COLLECTIVES_PER_STEP * self.steps(self.onset)
            v.update(coll_s=30.0 + share * self.onset, cpu=200.0 + 0.97 * self.onset)
            v["times"] = {"computing": 70.0 + (1 - share) * self.onset,
                          "collective": 30.0 + share * self.onset}
            if not is_c:  # blocked in the next collective since the onset
                v.update(verdict="blocked_in_collective", role="victim", seq=frozen + 1,
                         colls=frozen, age=tau, inside=tau, coll_s=v["coll_s"] + tau,
                         cpu=v["cpu"] + 0.02 * tau)
                v["times"]["waiting"] = tau
            elif self.scenario == "stopped":
                v.update(verdict="stopped", role="culprit", seq=frozen, colls=frozen,
                         age=age + tau)
                v["times"]["stalled"] = tau
            else:  # lagging: computing, BEHIND collectives short of the others
                v.update(verdict="slowing", seq=frozen + 1 - BEHIND, colls=frozen + 1 - BEHIND,
                         age=age + tau, cpu=v["cpu"] + tau)
                v["times"]["computing"] += tau
            return v
        # straggler: everyone's step stretches; the others wait for the culprit
        named = tau >= STRAGGLER_AFTER_S
        slow_share = 0.03 + 0.01 * j[0]
        wait_share = (share * STEP_S + LATE_S) / SLOW_STEP_S
        v.update(dur=dur - STEP_S + SLOW_STEP_S, step_s=v["step_s"] + tau * SLOW_STEP_S / STEP_S)
        if is_c:
            v.update(late=LATE_S + 0.01 * j[3], coll_s=30.0 + share * self.onset + slow_share * tau,
                     verdict="straggler" if named else "slowing",
                     role="culprit" if named else "none")
        else:
            v.update(coll_s=30.0 + share * self.onset + wait_share * tau)
            if g // self.rpn == c.node:
                v.update(verdict="waiting_on_peer" if named else "slowing",
                         role="victim" if named else "none")
        v["times"]["collective"] = v["coll_s"]
        return v

    # --- one node's /metrics ----------------------------------------------------------
    def rows(self, node: int, t: float, only: frozenset[str] | None = None) -> list[Row] | None:
        """Node `node`'s rows at t, in metrics.SPECS's shape; with `only`, just
        those families. None: the node's daemon does not answer."""
        c, tau = self.culprit, t - self.onset
        if self.scenario == "node_down" and node == c.node and tau > 0:
            return None
        key = self.ddp_job
        ranks = range(node * self.rpn, (node + 1) * self.rpn)
        rv = {g: self._rank(g, t) for g in ranks}
        culprits = [g for g in ranks if rv[g]["role"] == "culprit"]
        if culprits:
            job_verdict = rv[culprits[0]]["verdict"]
        else:  # the worst verdict speaks for the job (vocabulary.SEVERITY)
            verdicts = {v["verdict"] for v in rv.values()}
            job_verdict = next((w for w in ("blocked_in_collective", "waiting_on_peer",
                                            "slowing") if w in verdicts), "healthy")
        problem = job_verdict not in CALM
        rows: list[Row] = [
            ("ddpwatch_up", (), 1.0), ("ddpwatch_build_info", (__version__,), 1.0),
            *(("ddpwatch_http_refused_total", (r,), 0.0) for r in HTTP_REFUSALS),
            ("ddpwatch_ready", (), 1.0),
            ("ddpwatch_ticks_total", (), float(5000 + int(t))),
            ("ddpwatch_tick_duration_seconds", (), 0.05),
            ("ddpwatch_last_tick_timestamp_seconds", (), round(self.wall0 + int(t), 3)),
            *(("ddpwatch_probe_success", (p,), 1.0) for p in PROBES),
            *(("ddpwatch_probe_duration_seconds", (p,), 0.004) for p in PROBES),
            *(("ddpwatch_stage_failures_total", (s,), 0.0) for s in sorted(STAGES)),
            ("ddpwatch_stack_dumps_total", (), float(problem)),
            ("ddpwatch_incidents_open", (key,), float(problem)),
            *(("ddpwatch_incidents_opened_total", (v,), float(problem and v == job_verdict))
              for v in VERDICTS),
            ("ddpwatch_job_ranks", (key,), float(self.rpn)),
            *(("ddpwatch_job_state", (key, v), float(v == job_verdict)) for v in VERDICTS),
            *(("ddpwatch_job_culprit", (key, str(g)), 1.0) for g in culprits),
        ]
        for g in ranks:
            v, r = rv[g], (key, str(g))
            rows += [
                ("ddpwatch_rank_info", (key, str(g), str(g - node * self.rpn), f"node-{node:03d}",
                                        "nccl", "cuda", "bfloat16", "2.5.1+cu124",
                                        "fp-5d41402a"), 1.0),
                *(("ddpwatch_rank_state", r + (w,), float(w == v["verdict"])) for w in VERDICTS),
                *(("ddpwatch_rank_role", r + (w,), float(w == v["role"])) for w in ROLES),
                *(("ddpwatch_rank_finding", r + (f,), 0.0) for f in FINDINGS),
                ("ddpwatch_rank_alive", r, v["alive"]),
                ("ddpwatch_rank_verdict_confidence", r, 0.9),
                ("ddpwatch_rank_cpu_seconds_total", r, round(v["cpu"], 3)),
                ("ddpwatch_rank_step", r, float(v["steps"])),
                ("ddpwatch_rank_collective_seq", r, float(v["seq"])),
                ("ddpwatch_rank_heartbeat_age_seconds", r, round(v["age"], 3)),
                ("ddpwatch_rank_in_collective_seconds", r, round(v["inside"], 3)),
                ("ddpwatch_rank_step_duration_seconds", r, round(v["dur"], 4)),
                ("ddpwatch_rank_step_seconds_total", r, round(v["step_s"], 3)),
                ("ddpwatch_rank_collectives_total", r, float(v["colls"])),
                ("ddpwatch_rank_collective_seconds_total", r, round(v["coll_s"], 3)),
                ("ddpwatch_rank_collective_bytes_total", r, float(v["colls"] * (25 << 20))),
                ("ddpwatch_rank_tokens_total", r, float(v["steps"] * 8192)),
                *(("ddpwatch_rank_time_seconds_total", r + (s, ""), round(x, 3))
                  for s, x in sorted(v["times"].items())),
                ("ddpwatch_rank_arrival_lateness_seconds", r, round(v["late"], 4)),
            ]
        rows.append(("ddpwatch_collect_errors", (), 0.0))
        if only is not None:
            rows = [row for row in rows if row[0] in only]
        return rows

    # --- what the rules must say --------------------------------------------------
    def expected(self, t: float, instance) -> dict[str, list[dict]]:
        """Alert name -> the label sets (rule labels left out) firing at t, for
        the alerts this scenario makes fire; every other alert fires for nothing.
        `instance(node)` is the node's scrape target. Times are far from any
        rule's `for:` boundary (see the scenario notes in benchmarks/README.md)."""
        tau = t - self.onset
        if tau < 0:
            return {}
        c = self.culprit
        where = {"instance": instance(c.node), "ddp_job": self.ddp_job, "rank": str(c.rank)}
        series = {"job": SCRAPE_JOB, **where}
        late = tau >= 240  # the 2m-`for:` alerts over 2m windows have fired by then
        job = [{"ddp_job": self.ddp_job}]
        if self.scenario == "stopped":
            out = {"DDPWatchCulprit": [dict(where, verdict="stopped")]}
            if late:  # it waits least, too: it sits outside collectives
                out["DDPWatchStragglerWaitsLeast"] = [series]
        elif self.scenario == "lagging":
            out = {"DDPWatchLaggingRank": [series], "DDPWatchHangWithoutCulprit": job}
            if late:
                out["DDPWatchStragglerWaitsLeast"] = [series]
        elif self.scenario == "straggler":
            out = {"DDPWatchCulprit": [dict(where, verdict="straggler")]}
            if late:
                out |= {"DDPWatchStraggler": [series], "DDPWatchStragglerWaitsLeast": [series]}
        else:
            out = {"DDPWatchDaemonDown": [{"job": SCRAPE_JOB, "instance": instance(c.node)}],
                   "DDPWatchHangWithoutCulprit": job}
        return out

    def checks(self) -> list[float]:
        """When to judge: before the onset (nothing fires), 90 s after it (the
        alerts with `for:` <= 1m), 4 min after it (all of them)."""
        return [self.onset - 15.0, self.onset + 90.0, self.onset + 240.0]


def promtool_instance(node: int) -> str:
    return f"node-{node:03d}:{NODE_PORT}"


def families_read(rules: dict) -> frozenset[str]:
    """The metric names the rules' expressions read (the input promtool needs)."""
    names = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            names |= set(re.findall(r"\bddpwatch_[a-z_]+\b", rule["expr"]))
    unknown = names - set(SPECS)
    if unknown:
        raise ValueError(f"the rules read series no daemon exports: {sorted(unknown)}")
    return frozenset(names)


def without_annotations(rules: dict) -> dict:
    """The rules as shipped but for their annotations: promtool compares those
    verbatim and they carry computed values ({{ $value }}); the judgement is in
    expr, for and labels, kept as they are."""
    return {"groups": [dict(g, rules=[{k: v for k, v in r.items() if k != "annotations"}
                                      for r in g["rules"]]) for g in rules["groups"]]}


def _fmt(x: float) -> str:
    return format(x, ".12g")


def notation(values: list[float | None]) -> str:
    """promtool's expanding notation for samples (None: no sample; the first
    None after a sample is a staleness marker, as a failed scrape writes)."""
    out, i, n = [], 0, len(values)
    if values[0] is not None and values.count(values[0]) == n:
        return f"{_fmt(values[0])}x{n - 1}" if n > 1 else _fmt(values[0])
    while i < n:
        a = values[i]
        if a is None:
            k = i
            while k < n and values[k] is None:
                k += 1
            seen = i > 0
            if seen:
                out.append("stale")
            if k - i - seen:
                out.append(f"_x{k - i - seen}")
            i = k
            continue
        k = i + 1
        b = values[k] - a if k < n and values[k] is not None else 0.0
        while k < n and values[k] is not None and abs(a + (k - i) * b - values[k]) <= 1e-9 * max(1.0, abs(values[k])):
            k += 1
        steps = k - i - 1
        if steps == 0 or not b:
            out.append(_fmt(a) if steps == 0 else f"{_fmt(a)}x{steps}")
        elif steps == 1:
            out += [_fmt(a), _fmt(values[k - 1])]
        else:
            # promtool adds b step by step: the last value is written exactly, or the
            # sum's rounding could make a counter go down (a reset to rate()).
            out.append(f"{_fmt(a)}{'+' if b > 0 else ''}{_fmt(b)}x{steps - 1}")
            out.append(_fmt(values[k - 1]))
        i = k
    return " ".join(out)


def _labels(name: str, values: tuple[str, ...], instance: str) -> str:
    pairs = [("job", SCRAPE_JOB), ("instance", instance), *zip(SPECS[name][1], values)]
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"


def input_series(cluster: Cluster, times: list[float], only: frozenset[str]) -> list[tuple[str, str]]:
    """(series, values) for every node's series read by the rules, plus `up`."""
    out = []
    n = len(times)
    for node in range(cluster.nodes):
        inst = promtool_instance(node)
        series: dict[tuple, list] = {}
        up = []
        for k, t in enumerate(times):
            rows = cluster.rows(node, t, only)
            up.append(0.0 if rows is None else 1.0)
            for name, values, value in rows or ():
                got = series.get((name, values))
                if got is None:
                    got = series[(name, values)] = [None] * n
                got[k] = value
        out.append((f'up{{job="{SCRAPE_JOB}",instance="{inst}"}}', notation(up)))
        out += [(_labels(name, values, inst), notation(v)) for (name, values), v in series.items()]
    return out


def promtool_test(rules_file: str, rules: dict, clusters: list[Cluster],
                  interval_s: float = 15.0) -> str:
    """A `promtool test rules` document: per cluster (one scenario each) its input
    series and, at each of its checks, every alert of the rules with exactly the
    label sets expected (none for the alerts the scenario must not fire)."""
    alerts = [(r["alert"], r.get("labels", {})) for g in rules["groups"] for r in g["rules"]
              if "alert" in r]
    only = families_read(rules)
    lines = [f"rule_files: ['{rules_file}']", f"evaluation_interval: {int(interval_s)}s", "tests:"]
    for cluster in clusters:
        horizon = max(cluster.checks())
        times = [k * interval_s for k in range(int(horizon / interval_s) + 1)]
        lines += [f"  - name: {cluster.scenario}", f"    interval: {int(interval_s)}s",
                  "    input_series:"]
        for s, v in input_series(cluster, times, only):
            lines += [f"      - series: '{s}'", f"        values: '{v}'"]
        lines.append("    alert_rule_test:")
        for t in cluster.checks():
            want = cluster.expected(t, promtool_instance)
            for name, rule_labels in alerts:
                lines += [f"      - eval_time: {int(t)}s", f"        alertname: {name}"]
                expect = want.get(name, [])
                if not expect:
                    lines.append("        exp_alerts: []")
                    continue
                lines.append("        exp_alerts:")
                for labels in expect:
                    flat = ", ".join(f'{k}: "{v}"' for k, v in {**rule_labels, **labels}.items())
                    lines.append(f"          - exp_labels: {{{flat}}}")
    return "\n".join(lines) + "\n"
