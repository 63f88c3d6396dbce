"""What the daemon publishes after each tick; exporters (HTTP, metrics, alerts)
only read this. Frozen, so a reader never sees a half-updated tick."""
from __future__ import annotations

from dataclasses import dataclass

from ..judge.classify import Judgement
from ..observe.peers import PeerView
from ..observe.snapshot import ProbeStatus, Snapshot


class IncidentState:
    """open -> ongoing -> resolved. `open` on the tick a problem is first judged,
    `ongoing` while it lasts, `resolved` once the job has been healthy (or gone)
    for `resolve_after_s`. A resolved incident is kept for a while, then dropped."""
    OPEN = "open"
    ONGOING = "ongoing"
    RESOLVED = "resolved"


@dataclass(frozen=True)
class Incident:
    id: str
    job: str
    state: str
    verdict: str
    culprits: tuple[int, ...]
    summary: str
    opened_at: float      # unix time
    updated_at: float
    resolved_at: float    # 0.0 until resolved
    bundle: str           # directory of the evidence bundle ("" if it could not be written)
    # the node whose daemon sends this incident's webhooks: this one, or a peer
    # (alerts/route.py); "" while undecided or when no webhooks are configured
    alerts_from: str = ""
    # how it resolved, said when it did: the job healthy again, or gone
    resolution: str = ""
    # who the job is (discovery.owner_key: uid, launcher pid and start), which
    # tells two users' jobs with one run id apart; `job` is only its label
    owner: str = ""
    # why the evidence bundle is not written yet ("" once it is): retried each tick
    bundle_error: str = ""


@dataclass(frozen=True)
class JobView:
    key: str              # stable label: the run id, else "pid<launcher or first rank>"
    judgement: Judgement
    last: Snapshot
    # the job's judgement over time (watch/job.py OverTime): its pause in progress,
    # where its ranks' time went, its verdicts over time; None from `diagnose`
    over_time: object = None
    # who the job is (discovery.owner_key): whose it is to see (publish/viewer.py)
    owner: str = ""
    # the run id its other nodes know it by: `key` without the "@<owner>" that
    # tells this node's jobs sharing a run id apart (observe/jobs/discovery.py labels);
    # with the owner's uid it is the job to its peers (publish/peers.py)
    run_id: str = ""


@dataclass(frozen=True)
class DaemonView:
    node: str
    tick: int
    wall_time: float
    tick_duration_s: float
    jobs: tuple[JobView, ...]
    incidents: tuple[Incident, ...]
    probes: tuple[ProbeStatus, ...]      # this tick's probe runs (stacks only when run)
    incidents_opened_total: dict[str, int]  # by verdict, since start
    ready: bool                           # a first tick has completed
    peers: tuple[PeerView, ...] = ()       # each configured peer, when the peer view is on
    alert_stats: dict | None = None       # webhook sink -> counts (alerts.Dispatcher.stats)
    # (label, owner uid) of the jobs this node sends webhooks for (told to peers)
    alerting_jobs: tuple[tuple[str, int], ...] = ()
    webhooks: bool = False  # this node has webhooks configured (told to peers)
    stage_failures: dict[str, int] | None = None  # tick stage -> failures since start
    stack_dumps: int = -1  # py-spy runs since start (-1: not counted, an old view)
    left_out: dict | None = None  # what the per-pass budgets left unread, since start
    # looks at jobs kept by steady ticks, since start (-1: not counted, an old view;
    # docs/architecture.md "Steady jobs")
    looks_kept: int = -1
    # the probe runs of the looks this tick's steady jobs kept, not run this tick:
    # what those jobs' published judgements stand on (`published_probes`)
    kept_probes: tuple[ProbeStatus, ...] = ()

    @property
    def published_probes(self) -> tuple[ProbeStatus, ...]:
        """The probe runs what this view publishes stands on: this tick's and
        those of the looks it kept (ddpwatch_probe_success, /status probe_errors):
        a probe's series must not come and go with a steady job's ticks."""
        return self.probes + self.kept_probes
    # what floods were held to (publish/limits.py), since start: incidents_limited
    # {why: jobs}, bundles_limited (incidents), bundles_pruned {age|size: bundles}
    limits: dict | None = None
