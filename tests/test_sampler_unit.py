"""The sampler runs job probes by their registration's policy: when
(look, sooner for silent jobs, again closer up), on which pids, into which
Snapshot field. The probes here record their calls instead of reading /proc."""
import dataclasses
from types import SimpleNamespace

import pytest

from ddpwatch.observe import probes
from ddpwatch.observe.probes import Look
from ddpwatch.observe.sampler import Sampler, Survey
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
        return sampler.sample(JOB, survey(live_pids), look, key="job")


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
            snap = sampler.sample(job, node, Look.DETAIL, key=job.run_id)
            sampler.look_closer(snap, node, key=job.run_id, force_stacks=True)
    dumped = [c for c in calls if c[0] == "stacks"]
    assert sum(len(c[1]) for c in dumped) == sampler_mod.MAX_FORCED_DUMPS_PER_PASS
    assert len(dumped) == sampler_mod.MAX_FORCED_DUMPS_PER_PASS // 8  # whole jobs, first come
