"""The peer view: this daemon asks the other nodes' daemons what their ranks do.
An input of the judgement like a probe (what it serves them in turn:
publish/peers.py).

For people without Prometheus (two machines on a home LAN): a job spread over
nodes has its culprit on one node and its waiting ranks on the others, and no
daemon alone can tell who the waiting ranks wait for. Each daemon serves its own
ranks' signals at `/peer` (measured there, clock-free: judge.signals.local);
a daemon with `peers:` configured fetches them in the background and judges its
jobs with the remote ranks added (classify.judge(..., remote=...)).

The fetching never blocks a tick: one thread per peer polls it once per
interval, with a timeout, and keeps the last answer. A tick takes only answers younger than
`max_age_s`; a peer that stops answering drops out of the judgement (its ranks are
not judged from stale data) and shows with its error in /status.

A job is its run id *and* its owner's uid: a run id is any user's to pick, so
two users' jobs under one run id are two entries of the answer's `owned` list,
and a node joins (and hears claims of) only the entry of its own job's uid. The
older maps (`jobs`, `owners`, `alerting`: keyed by run id alone) still go out
for older peers, without any run id two owners share there (an older peer then
sees neither, rather than the wrong one: tests/unit/observe/test_peers_unit.py).
"""
from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
from dataclasses import dataclass, field

from ..signed import client

log = logging.getLogger("ddpwatch")
MAX_ANSWER_BYTES = 4 << 20  # a /peer answer of thousands of ranks is well under this


@dataclass(frozen=True)
class PeerState:
    url: str
    node: str = ""
    fetched_at: float = 0.0        # monotonic; 0.0 until a first good answer
    # (job key, owner uid) -> tuple of signal dicts; uid -1: an older daemon did not say
    jobs: dict = field(default_factory=dict)
    error: str = ""                 # the last attempt's failure ("" if it succeeded)
    # (job key, owner uid) of the jobs it sends webhooks for (alerts/route.py)
    alerting: frozenset = frozenset()
    webhooks: bool = True  # it has webhooks to send (an older daemon does not say: assume so)


class PeerDocumentError(ValueError):
    pass


def parse(doc) -> tuple[str, dict, frozenset, bool]:
    """(node, {(job key, owner uid): (signal dict, ...)}, the (job key, owner uid)
    it alerts for, whether it has webhooks) from a /peer answer; PeerDocumentError
    names the first field that is wrong. An answer without `owned` (an older
    daemon) is read from its label-keyed maps, the uid from `owners` or -1
    (unknown); one without "alerting" (older than alert routing) claims nothing,
    one without "webhooks" is taken to have them."""
    if not isinstance(doc, dict) or not isinstance(doc.get("node"), str):
        raise PeerDocumentError("not a ddpwatch /peer document (no 'node')")
    webhooks = doc.get("webhooks", True)
    if not isinstance(webhooks, bool):
        raise PeerDocumentError("'webhooks' is not true or false")
    if "owned" in doc:
        jobs, alerting = _owned(doc)
    else:
        jobs, alerting = _by_label(doc)
    return doc["node"], jobs, frozenset(alerting), webhooks


def _owned(doc) -> tuple[dict, set]:
    owned = doc["owned"]
    if not isinstance(owned, list):
        raise PeerDocumentError("'owned' is not a list")
    jobs: dict = {}
    alerting = set()
    for i, entry in enumerate(owned):
        if not (isinstance(entry, dict) and isinstance(entry.get("key"), str)
                and _int(entry.get("uid")) and isinstance(entry.get("alerting", False), bool)):
            raise PeerDocumentError(f"owned[{i}] is not a job (key, uid, ranks, alerting)")
        at = (entry["key"], entry["uid"])
        # one user's two jobs under one label are one job to a label-keyed join
        jobs[at] = jobs.get(at, ()) + _ranks(doc, entry.get("ranks"), f"owned[{i}].ranks")
        if entry.get("alerting"):
            alerting.add(at)
    return jobs, alerting


def _by_label(doc) -> tuple[dict, set]:
    jobs = doc.get("jobs")
    if not isinstance(jobs, dict):
        raise PeerDocumentError("'jobs' is not a mapping")
    owners = doc.get("owners", {})
    if not isinstance(owners, dict) or not all(
            isinstance(k, str) and _int(v) for k, v in owners.items()):
        raise PeerDocumentError("'owners' is not a mapping of job keys to uids")
    alerting = doc.get("alerting", [])
    if not isinstance(alerting, list) or not all(isinstance(k, str) for k in alerting):
        raise PeerDocumentError("'alerting' is not a list of job keys")
    out = {(key, owners.get(key, -1)): _ranks(doc, ranks, f"jobs[{key!r}]")
           for key, ranks in jobs.items()}
    return out, {(key, owners.get(key, -1)) for key in alerting}


def _ranks(doc, ranks, where: str) -> tuple[dict, ...]:
    if not isinstance(ranks, list):
        raise PeerDocumentError(f"{where} is not a list")
    checked = []
    for i, s in enumerate(ranks):
        if not isinstance(s, dict) or not all(
                _int(s.get(k)) for k in ("pid", "rank")) or not all(
                v is None or isinstance(v, (int, float, str, bool)) for v in s.values()):
            raise PeerDocumentError(f"{where}[{i}] is not a rank's signals")
        if s["rank"] < 0:
            continue  # a rank its own node could not identify: nothing to line up with
        checked.append(dict(s, node=s.get("node") or doc["node"]))
    return tuple(checked)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class PeerView:
    """A configured peer daemon as of this tick (the daemon's /status, /metrics)."""
    url: str
    node: str               # "" until it first answered
    error: str              # the last attempt's failure, "" if it answered
    age_s: float | None     # since its last good answer; None if it never answered
    fresh: bool             # its ranks were part of this tick's judgement


class PeerPoller:
    def __init__(self, urls, token: str = "", interval_s: float = 1.0, timeout_s: float = 2.0,
                 max_age_s: float = 5.0, clock=time.monotonic):
        self.urls = tuple(u.rstrip("/") for u in urls)
        self.token = token
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s
        self.clock = clock
        # url -> PeerState, replaced whole by that peer's thread (readers see one or the other)
        self._states = {u: PeerState(u) for u in self.urls}
        self._stop = threading.Event()
        # One thread per peer: a peer that times out must not age the others' answers.
        self._threads = [threading.Thread(target=self._run, args=(u,), daemon=True,
                                          name=f"ddpwatch-peer-{i}")
                         for i, u in enumerate(self.urls)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()

    def states(self) -> tuple[PeerState, ...]:
        return tuple(self._states[u] for u in self.urls)

    def _fresh(self, state: PeerState, now: float) -> bool:
        return bool(state.fetched_at) and now - state.fetched_at <= self.max_age_s

    def views(self) -> tuple[PeerView, ...]:
        """Each peer as of now, for /status and /metrics."""
        now = self.clock()
        return tuple(PeerView(st.url, st.node, st.error,
                              round(now - st.fetched_at, 3) if st.fetched_at else None,
                              self._fresh(st, now)) for st in self.states())

    def remote_signals(self, key: str, uid: int | None = None) -> tuple[dict, ...]:
        """The ranks of job `key` that fresh peers report; with `uid`, only from a
        job of that owner there: another user's look-alike under the same label
        is not joined to this one."""
        now = self.clock()
        return tuple(s for st in self.states() if self._fresh(st, now)
                     for (k, theirs), ranks in st.jobs.items()
                     if k == key and _same_owner(theirs, uid) for s in ranks)

    def claims(self, uid: int | None = None) -> dict[str, frozenset]:
        """Fresh peers' node -> the job keys it sends webhooks for; with `uid`,
        only its claims of jobs of that owner."""
        now = self.clock()
        return {st.node: frozenset(k for k, theirs in st.alerting if _same_owner(theirs, uid))
                for st in self.states() if self._fresh(st, now) and st.node}

    def without_webhooks(self) -> frozenset:
        """Fresh peers' nodes that have no webhooks to send: never a job's alerter."""
        now = self.clock()
        return frozenset(st.node for st in self.states()
                         if self._fresh(st, now) and st.node and not st.webhooks)

    def poll_once(self) -> None:
        for url in self.urls:
            self._states[url] = self._fetch(url, self._states[url])

    def _run(self, url: str) -> None:
        while not self._stop.is_set():
            started = self.clock()
            self._states[url] = self._fetch(url, self._states[url])
            self._stop.wait(max(0.0, self.interval_s - (self.clock() - started)))

    def _fetch(self, url: str, old: PeerState) -> PeerState:
        """One poll; every failure becomes the peer's error (this thread must not die).
        With a token the request is signed and the answer must prove it
        (client.py): a program on the peer's port without the token learns
        nothing and is not believed, so it can neither add ranks nor claim a
        job's alerts (alerts/route.py)."""
        try:
            body = client.get(url, "/peer", self.token, self.timeout_s, MAX_ANSWER_BYTES)
            node, jobs, alerting, webhooks = parse(json.loads(body))
            if old.error:
                log.info("peer %s answers again", url)
            return PeerState(url, node, self.clock(), jobs, "", alerting, webhooks)
        except client.Unproven:
            error = "answer not proven by peer_token: not a ddpwatch daemon, not used"
        except client.TooLarge:
            error = f"bad answer: larger than {MAX_ANSWER_BYTES} bytes"
        except urllib.error.HTTPError as err:
            error = f"HTTP {err.code}" + (" (wrong or missing peer_token)" if err.code == 401 else
                                          " (redirects are not followed)" if 300 <= err.code < 400
                                          else "")
        except (urllib.error.URLError, OSError) as err:
            error = f"no answer ({getattr(err, 'reason', err)})"
        except (ValueError, PeerDocumentError) as err:  # JSON errors are ValueErrors
            error = f"bad answer: {err}"
        except Exception as err:  # not HTTP at all (a wrong port), nesting too deep...
            error = f"bad answer: {err!r}"
        if error != old.error:
            log.warning("peer %s: %s", url, error)
        return PeerState(url, old.node, old.fetched_at, old.jobs, error, old.alerting,
                         old.webhooks)


def _same_owner(theirs: int, uid: int | None) -> bool:
    """Whether a peer's job of owner `theirs` may be this node's job of owner
    `uid`: yes when either side does not know (uid None or -1, an older peer),
    else only the same uid (clusters share their users' uids)."""
    return uid is None or uid < 0 or theirs < 0 or theirs == uid


def poller_inputs(cfg) -> tuple:
    """Everything the peer poller is built from (a reload rebuilds it if any changed)."""
    return (cfg.peers, cfg.peer_token or cfg.token, cfg.tick_s, cfg.probe_timeout_s,
            cfg.peer_max_age_s)


def poller_for(cfg) -> PeerPoller | None:
    """The config's peer view (None without peers), not started yet."""
    if not cfg.peers:
        return None
    peers, token, tick_s, timeout_s, max_age_s = poller_inputs(cfg)
    return PeerPoller(peers, token, interval_s=tick_s, timeout_s=timeout_s, max_age_s=max_age_s)
