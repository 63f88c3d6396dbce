"""An incident's evidence on disk: its bundle (publish/bundle.py), written when
the incident opens or changes, held back past its owner's budget, retried while
the job is still here, and pruned by age and total size once the incident is
no longer open. The daemon's tick hands it what happened (daemon.py _incidents);
the counters it keeps are published in /metrics (ddpwatch_bundles_*_total)."""
from __future__ import annotations

import collections
import logging
import time

from ..observe.jobs.discovery import owner_uid
from . import limits
from .bundle import prune as prune_bundles, rewrite_page, write_bundle

log = logging.getLogger("ddpwatch")
PRUNE_EVERY_S = 30.0  # bundles are pruned (age, total size) at most this often
HELD_BUNDLE = ("held back: the job owner's uid wrote its uid_bundles bundles; written "
               "when its bucket refills (uid_refill_s), if the job is still here")


class Evidence:
    """The bundles of one daemon's incidents. `incidents`: its IncidentBook (the
    bundle's path, or why there is none, is attached to the incident);
    `failures`: the daemon's stage failure counter ("bundle")."""

    def __init__(self, incidents, config, clock, failures: collections.Counter):
        self.incidents, self.config, self.clock = incidents, config, clock
        self.failures = failures
        self.buckets = limits.Buckets(config.uid_bundles, config.uid_refill_s)
        self.limited = 0                      # incidents held back by their owner's budget
        self.pruned = {"age": 0, "size": 0}   # bundles removed, by why
        self._held: set[str] = set()          # incident ids whose bundle waits a token
        self._pruned_at = -1e18

    def reconfigure(self, config) -> None:
        """New settings (SIGHUP); the per-uid budget starts afresh only if it changed."""
        if (config.uid_bundles, config.uid_refill_s) != (self.buckets.burst,
                                                         self.buckets.refill_s):
            self.buckets = limits.Buckets(config.uid_bundles, config.uid_refill_s)
        self.config = config

    def write(self, incident, view, history, record_dirs) -> bool:
        """Write the incident's evidence; on failure (a full disk) the incident
        says why in `bundle_error` and `retry` tries again next tick. At most
        uid_bundles per uid, one more each uid_refill_s (publish/limits.py); one
        held back is counted once and retried the same way."""
        if not self.buckets.take(owner_uid(incident.owner), self.clock()):
            if incident.id not in self._held:
                self._held.add(incident.id)
                self.limited += 1
            if not incident.bundle:  # a changed incident keeps its earlier evidence
                self.incidents.attach_bundle(incident.id, "", HELD_BUNDLE)
            return False
        self._held.discard(incident.id)
        try:
            path = write_bundle(self.config.effective_state_dir(), incident, view, history,
                                record_dirs)
        except Exception as err:
            self.failures["bundle"] += 1
            error = f"{type(err).__name__}: {err}"
            if error != incident.bundle_error:  # said once, not every tick of a full disk
                log.warning("incident %s: evidence bundle not written (%s); retried each "
                            "tick", incident.id, error)
            self.incidents.attach_bundle(incident.id, "", error)
            return False
        if incident.bundle_error:
            log.info("incident %s: evidence bundle written at last: %s", incident.id, path)
        self.incidents.attach_bundle(incident.id, path)
        return True

    def resolved(self, incident) -> None:
        """The incident's page says when and how it resolved."""
        if incident.bundle:
            rewrite_page(incident.bundle, incident)

    def retry(self, job_of, record_dirs) -> None:
        """Open incidents whose bundle could not be written, while their job is
        still here to be written about (its snapshots are the evidence).
        `job_of`: owner key -> (JobView, history), or None when it is gone."""
        for incident in self.incidents.open():
            job = job_of(incident.owner)
            if not incident.bundle and incident.bundle_error and job is not None:
                self.write(incident, job[0], job[1], record_dirs)
        self._held &= {i.id for i in self.incidents.open()}

    def prune(self) -> None:
        """Bundles of incidents no longer open, by age and total size, every
        PRUNE_EVERY_S (publish/bundle.py prune)."""
        now = self.clock()
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        keep = frozenset(i.bundle for i in self.incidents.open() if i.bundle)
        removed = prune_bundles(self.config.effective_state_dir(), self.config.bundle_max_age_s,
                                self.config.bundle_max_mb * 2**20, keep, time.time())
        for reason, n in removed.items():
            self.pruned[reason] += n
        if any(removed.values()):
            log.info("bundles pruned: %d past bundle_max_age_s, %d past bundle_max_mb",
                     removed["age"], removed["size"])
