"""Which node's daemon sends a job's alerts, when the peer view joins several
nodes' ranks in one judgement. Pure.

Every node judging such a job opens its own incident and keeps its own evidence
bundle (its ranks' stacks exist only there), but a problem should page people
once, not once per node: a culprit on one of eight nodes would otherwise send
eight sets of webhooks.

The node that alerts is the one hosting the lowest rank judged: every node
joined by the peer view sees the same ranks, so they agree on it, and it stays
the same while the verdict and its culprit change (the alert carries the whole
judgement, culprit included, from whichever node sends it). A node that is not
the owner defers to the owner's claim of the job in its /peer answer (peers.py),
waits for it, and alerts itself if none comes within a grace: that daemon may
not be configured to ask this node.

Who may silence this node: only the owner, by this node's own judgement. A
claim names a job by its label, which users choose (a run id, the master's
address and port, or one read from /metrics), and comes in a peer's answer:
a claim from any peer but the owner is ignored, and the owner's own node never
defers at all. So a peer (or a user's look-alike job on a peer's node) that
claims a label cannot mute a job whose rank 0 is judged here or on another
node. What is left: the owner itself can claim and not send, and the peers'
node names are their own word (peers are reached by their configured URLs and
token; README, "Trust model"). If two nodes judge themselves owner for a tick,
both may page once. A
node with no webhooks says so in its /peer answer and is passed over: the next
lowest rank's node alerts, without waiting, so three or more nodes still page
once. A peer whose answers went stale has its ranks left out of the
judgement, so a node left alone is its own owner. Once a node has sent an
incident's firing alert it sends the rest of it too (changes, resolved):
receivers see one story.

`route_open` applies this to a tick's open incidents; `alert_for` builds the
message they send.
"""
from __future__ import annotations

from collections.abc import Iterable

from ...observe.jobs.discovery import owner_uid
from .base import Alert


def owner_node(ranks: Iterable, here: str, mute: frozenset = frozenset()) -> str:
    """The node that should alert for a job judged from `ranks` (RankVerdicts,
    remote ones with the node they run on as `host`); nodes in `mute` have no
    webhooks and are passed over."""
    identified = [v for v in ranks if v.rank >= 0 and not (v.remote and v.host in mute)]
    if not identified:
        return here
    lowest = min(identified, key=lambda v: v.rank)
    return lowest.host if lowest.remote and lowest.host else here


class AlertRoute:
    """Per open incident: alerting from here, left to a peer that claimed its
    job, or waiting for that peer's claim."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self._sending: dict[str, str] = {}      # incident id -> job key, alerted from here
        self._waiting: dict[str, float] = {}    # incident id -> when it began waiting
        self._elsewhere: dict[str, str] = {}    # incident id -> the peer that alerts

    def route(self, incident_id: str, job: str, owner: str, here: str,
              claims: dict[str, frozenset], now: float) -> bool:
        """True if this node sends the incident's alerts. claims: peer node ->
        the job keys it alerts for, from its fresh /peer answers; only the
        owner's counts (the module's doc)."""
        if incident_id in self._sending:
            return True
        claimer = owner if owner != here and job in claims.get(owner, ()) else None
        if claimer is not None:
            self._elsewhere[incident_id] = claimer
            self._waiting.pop(incident_id, None)
            return False
        self._elsewhere.pop(incident_id, None)  # a claim that lapsed: decide again
        if owner != here:
            started = self._waiting.setdefault(incident_id, now)
            if now - started < self.grace_s:
                return False
        self._waiting.pop(incident_id, None)
        self._sending[incident_id] = job
        return True

    def sending(self, incident_id: str) -> bool:
        return incident_id in self._sending

    def alerts_from(self, incident_id: str, here: str) -> str:
        """The node that sends this incident's alerts; "" while undecided."""
        if incident_id in self._sending:
            return here
        return self._elsewhere.get(incident_id, "")

    def sent_from_here(self) -> dict[str, str]:
        """incident id -> job key of what this node alerts for (kept across restarts)."""
        return dict(self._sending)

    def resume(self, sending: dict[str, str]) -> None:
        """A restarted daemon keeps alerting for what it alerted for (and so sends
        their resolved messages, and no second firing one)."""
        self._sending.update(sending)

    def forget(self, incident_id: str) -> bool:
        """The incident resolved: True if this node had alerted for it (and so
        sends its resolved message)."""
        self._waiting.pop(incident_id, None)
        self._elsewhere.pop(incident_id, None)
        return self._sending.pop(incident_id, None) is not None


def route_open(route: AlertRoute, book, views: dict, here: str, peers, news: set,
               now: float, send, say, run_id=lambda incident: incident.job) -> None:
    """One tick's routing of the open incidents of `book` (publish/incidents.py):
    each is sent from here (`send(incident)`) when this node alerts for it and it
    is new to its receivers (opened, changed, or just handed to this node), or
    left to the node that claims it. `views`: owner key -> this tick's JobView;
    `peers`: the peer view (observe/peers.py PeerPoller) or None; `news`: ids of
    incidents opened or changed this tick; `say`: the journal's info line;
    `run_id(incident)`: the name its job's other nodes know it by, which their
    claims name (publish/view.py JobView.run_id)."""
    mute = peers.without_webhooks() if peers else frozenset()
    for incident in book.open():
        # a peer's claim counts for a job of this incident's owner only (peers.py)
        claims = peers.claims(owner_uid(incident.owner)) if peers else {}
        view = views.get(incident.owner)
        owner = owner_node(view.judgement.ranks if view else (), here, mute)
        was_sending = route.sending(incident.id)
        if route.route(incident.id, run_id(incident), owner, here, claims, now):
            if not was_sending or incident.id in news:
                send(incident)
        elif incident.id in news:
            sender = route.alerts_from(incident.id, here)
            say("incident %s: its webhooks come from node %s%s", incident.id,
                sender or owner, "" if sender else " if it claims the job within "
                f"{route.grace_s:g}s, else from this node")
        book.set_alerts_from(incident.id, route.alerts_from(incident.id, here))


def alert_for(incident, node: str, status_url: str, incident_url: str = "") -> Alert:
    """The webhook message of an incident as it stands (publish/alerts/base.py)."""
    firing = incident.state != "resolved"
    return Alert(status="firing" if firing else "resolved", incident_id=incident.id, node=node,
                 job=incident.job, verdict=incident.verdict, culprits=incident.culprits,
                 summary=incident.summary, started_at=incident.opened_at,
                 ended_at=0.0 if firing else incident.resolved_at, status_url=status_url,
                 incident_url=incident_url)


def alerting(route: AlertRoute, book, run_id) -> tuple:
    """(run id, owner uid) of the jobs this node sends webhooks for, told to its
    peers (publish/peers.py): a claim names whose job it is, not only its name.
    `run_id(incident)`: the run id its other nodes know the incident's job by."""
    return tuple(sorted({(run_id(i), owner_uid(i.owner))
                         for i in book.open() if route.sending(i.id)}))
