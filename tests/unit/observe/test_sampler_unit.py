"""The sampler runs job probes by their registration's policy: when
(look, sooner for silent jobs, again closer up), on which pids, into which
Snapshot field. The probes here record their calls instead of reading /proc."""
import dataclasses
from types import SimpleNamespace

import pytest

from ddpwatch.observe import probes
from ddpwatch.observe.probes import Look
from ddpwatch.observe.sampler import KeptStacks, Sampler, Survey
from ddpwatch.observe.snapshot import Job, Snapshot

JOB = Job(target_pid=11, launcher_pid=10, launcher_kind="torchrun", rank_pids=(11, 12),
          run_id="r", ranks=(0, 1), world_size=2)


@pytest.fixture
def calls(monkeypatch):
    """The real job probes' policies, with runs that record (probe, pids, ss -ti)."""
    seen = []
    for spec in probes.job_probes():
        def run(ctx, this_pass, pids, name=spec.name):
            seen.append((name, pids, this_pass.look >= Look.STACKS))
            return SimpleNamespace(pids=(), probe=name)
        # (it reads nothing: it is made without the probes the real one uses)
        monkeypatch.setitem(probes.REGISTRY, spec.name,
                            dataclasses.replace(spec, impl=run, uses=()))
    return seen


def survey(live_pids=()):
    records = [SimpleNamespace(pid=p, collective_seq=1, step=1) for p in live_pids]
    heartbeats = SimpleNamespace(records=records, alive=[True] * len(records))
    table = {p: SimpleNamespace(ppid=10, cmdline=(), env={}) for p in JOB.rank_pids}
    return Survey(table, {"heartbeats": heartbeats}, (), ())


def sample(look, live_pids=(11, 12), enabled=lambda name: name != "traffic"):
    with Sampler(probes.ProbeContext(), enabled) as sampler:
        return sampler.sample(JOB, survey(live_pids), look, KeptStacks())


def test_a_healthy_job_at_a_glance_reads_only_its_processes(calls):
    snap = sample(Look.GLANCE)
    assert calls == [("process", (11, 12, 10), False)]
    assert snap.processes.probe == "process" and snap.sockets is None and snap.stacks is None


def test_a_job_without_heartbeats_has_its_sockets_read_at_a_glance(calls):
    snap = sample(Look.GLANCE, live_pids=())
    assert calls == [("nshost", (11, 12), False), ("process", (11, 12, 10), False),
                     ("sockets", (11, 12), False)]
    assert snap.sockets.probe == "sockets"


def test_detail_adds_sockets_and_stacks_look_again_closer(calls):
    sample(Look.DETAIL)
    # competitors: who else runs on the ranks' CPUs (probes/competitors.py)
    # nshost: the ranks' own hostname and hosts file, in their namespaces
    assert [c[0] for c in calls] == ["competitors", "nshost", "process", "sockets"]
    calls.clear()
    snap = sample(Look.STACKS)
    # sockets once, with `ss -ti`; the budgeted stacks probe on the ranks only
    assert calls == [("competitors", (11, 12), True), ("nshost", (11, 12), True),
                     ("process", (11, 12, 10), True),
                     ("sockets", (11, 12), True), ("stacks", (11, 12), True)]
    assert snap.sockets.probe == "sockets" and snap.stacks.probe == "stacks"


def test_a_switched_off_probe_never_runs(calls):
    sample(Look.STACKS, enabled=lambda name: name not in ("traffic", "stacks"))
    assert "stacks" not in [c[0] for c in calls]


def test_every_job_probe_names_a_snapshot_field():
    fields = {f.name for f in dataclasses.fields(Snapshot)}
    for spec in probes.job_probes():
        assert spec.snapshot_field in fields, spec.name


def test_a_persons_request_is_held_to_its_own_budget_whatever_the_jobs(calls, monkeypatch):
    """A forced pass (GET /status?stacks=1) dumps every job it is asked for, but
    no more py-spy runs than MAX_FORCED_DUMPS_PER_PASS: a user's many fake jobs
    must not turn one request into hundreds of runs."""
    from ddpwatch.observe import sampler as sampler_mod
    spec = probes.REGISTRY["stacks"]

    def dump(ctx, this_pass, pids):
        calls.append(("stacks", pids, True))
        return SimpleNamespace(pids=tuple(SimpleNamespace(pid=p, status="ok") for p in pids))
    monkeypatch.setitem(probes.REGISTRY, "stacks", dataclasses.replace(spec, impl=dump))
    jobs = [Job(target_pid=100 * i, launcher_pid=100 * i - 1, launcher_kind="torchrun",
                rank_pids=tuple(range(100 * i, 100 * i + 8)), run_id=f"r{i}",
                ranks=tuple(range(8)), world_size=8) for i in range(1, 11)]
    with Sampler(probes.ProbeContext(), lambda name: name == "stacks") as sampler:
        node = survey()  # one pass over the node: one budget
        for job in jobs:
            kept = KeptStacks()  # each job's own (watch/job.py WatchedJob.stacks)
            snap = sampler.sample(job, node, Look.DETAIL, kept)
            sampler.look_closer(snap, node, kept, force_stacks=True)
    dumped = [c for c in calls if c[0] == "stacks"]
    assert sum(len(c[1]) for c in dumped) == sampler_mod.MAX_FORCED_DUMPS_PER_PASS
    assert len(dumped) == sampler_mod.MAX_FORCED_DUMPS_PER_PASS // 8  # whole jobs, first come


# --- the node probes: the survey runs them by their registration, each keeps its own


def test_the_host_is_read_once_a_minute_and_stands_in_between(monkeypatch):
    """The host probe keeps its facts and their age (probes/host.py HostProbe):
    a pass reads them again after host.MAX_AGE_S, and in between the survey
    stands on the last ones without a run (nor a status) of its own."""
    from ddpwatch.observe.probes import host
    now, reads = [0.0], []
    monkeypatch.setattr(host, "read", lambda ctx: reads.append(now[0]) or f"facts at {now[0]}")
    with Sampler(probes.ProbeContext(clock=lambda: now[0]), lambda name: name == "host") as s:
        views = []
        for now[0] in (0.0, 30.0, 61.0):
            views.append(s.survey())
    assert reads == [0.0, 61.0]
    assert [v.readings["host"] for v in views] == ["facts at 0.0", "facts at 0.0",
                                                   "facts at 61.0"]
    # heartbeats cannot be switched off, and run first: discovery needs the records
    assert [[p.name for p in v.probes] for v in views] == [
        ["heartbeats", "host"], ["heartbeats"], ["heartbeats", "host"]]


class Held:
    """A capture or watch as the traffic and exits probes hold them."""

    def __init__(self, opened, what):
        self.what, self.closed, self.asked = what, False, []
        opened.append(self)

    def snapshot(self, watched=()):
        self.asked.append(set(watched))
        return self.what

    def close(self):
        self.closed = True


@pytest.fixture
def opened(monkeypatch):
    from ddpwatch.observe.probes import exits, traffic
    held = []
    monkeypatch.setattr(traffic, "open_capture",
                        lambda clock, procfs, pid=None: Held(held, "capture"))
    monkeypatch.setattr(exits, "open_watch", lambda clock, procfs: Held(held, "watch"))
    return held


def test_exits_are_kept_of_the_pids_sampled_in_this_pass_and_the_last(calls, opened):
    other = dataclasses.replace(JOB, target_pid=21, launcher_pid=20, rank_pids=(21,),
                                ranks=(0,))
    with Sampler(probes.ProbeContext(), lambda name: name == "exits") as sampler:
        first = sampler.survey()
        sampler.sample(JOB, survey(), Look.GLANCE)
        sampler.survey()
        sampler.sample(other, survey(), Look.GLANCE)
        sampler.survey()
        sampler.survey()
    (watch,) = opened
    assert watch.asked == [set(), {10, 11, 12}, {10, 11, 12, 20, 21}, {20, 21}]
    assert first.exits == "watch" and [p.name for p in first.probes] == ["heartbeats", "exits"]


def test_a_jobs_snapshot_keeps_what_of_the_node_concerns_it(calls, opened, monkeypatch):
    """A node probe's reading goes into every job's snapshot through its
    registration's for_job: the connection attempts to the job's sockets' ports,
    its own ranks' and launcher's exits."""
    from ddpwatch.observe.probes.exits import Exits, to_exit
    from ddpwatch.observe.probes.traffic import SynFlow, Traffic
    ports = SimpleNamespace(pids=(SimpleNamespace(sockets=(SimpleNamespace(local_port=29500),)),))
    monkeypatch.setitem(probes.REGISTRY, "sockets", dataclasses.replace(
        probes.REGISTRY["sockets"], impl=lambda ctx, this_pass, pids: ports))
    with Sampler(probes.ProbeContext(), lambda name: name in ("traffic", "exits", "sockets")) as s:
        for held in opened:
            held.what = (Traffic(1.0, 0.0, "net:[1]", tuple(
                SynFlow("in", "10.0.0.2", 40000, "10.0.0.1", port, "eth0", 2, 0.5, 0.9, "")
                for port in (29500, 29501))) if held.what == "capture"
                else Exits(1.0, 0.0, tuple(to_exit(pid, 9, 1, 0.5) for pid in (10, 12, 99))))
        node = s.survey()
        snap = s.sample(JOB, node, Look.DETAIL)
    assert [f.dport for f in node.readings["traffic"].flows] == [29500, 29501]
    assert [f.dport for f in snap.traffic.flows] == [29500]
    assert [e.pid for e in snap.exits.exits] == [10, 12]


def test_a_reload_keeps_what_a_probe_holds_while_it_stays_on(opened):
    """SIGHUP (Sampler.reconfigure): the capture stays open while traffic stays
    on, is closed when it is switched off and opened again when it is switched
    on; the exits probe's watch is its own, untouched by traffic's switch."""
    ctx = probes.ProbeContext()

    def only(*names):
        return lambda name: name in names
    with Sampler(ctx, only("traffic", "exits")) as sampler:
        (capture,), (watch,) = ([h for h in opened if h.what == w] for w in ("capture", "watch"))
        sampler.reconfigure(ctx, only("traffic", "exits"), 0.0)
        assert len(opened) == 2 and not capture.closed
        sampler.reconfigure(ctx, only("exits"), 0.0)
        assert capture.closed and not watch.closed
        assert "traffic" not in [p.name for p in sampler.survey().probes]
        sampler.reconfigure(ctx, only("traffic", "exits"), 0.0)
        assert len(opened) == 3 and opened[-1].what == "capture" and not watch.closed
        assert sampler.survey().readings["traffic"] == "capture"
    assert all(h.closed for h in opened)  # closed with the sampler


def test_every_node_probe_before_discovery_names_a_snapshot_field():
    """Its reading goes into every job's snapshot (narrowed by its for_job)."""
    fields = {f.name for f in dataclasses.fields(Snapshot)}
    for stage in ("records", "node"):
        for spec in probes.node_probes(stage):
            assert spec.snapshot_field in fields, spec.name
    assert {s.stage for s in probes.load_all().values() if s.scope == "node"} <= set(
        probes.NODE_STAGES)
