"""What a flood of fake jobs may cost the people the daemon pages.

Any local user can start a process that looks like a rank (argv0 `python3`,
`RANK` in its environment) and end it a second later: judged `dead`, it opened
an incident, wrote a bundle and sent a webhook at once, over and over
(tests/hostile/test_floods.py). Three bounds, pure here, applied by `Gate`:

* A death pages only for a job that lived `min_life_s` (10 s), from the start of
  its oldest process (the owner key's start time, discovery.owner_key, so a
  daemon restarted beside an old job still pages it) to the last tick it was
  seen alive, or that was judged `healthy` on some tick before (it trained: a
  small job is killed seconds after its first steps in
  tests/thirdparty/test_thirdparty_killed.py, and must page). A job that dies sooner
  without ever working failed at start in front of whoever started it (its
  launcher says why), and a fake rank that sleeps a second never pages. A fake
  that passes for healthy is bounded by the uid's bucket below. Other verdicts
  (a stall, a hang) open whatever the job's age: those take a live process.
* A job opens no incident until a look saw more of it than a claim
  (`shows_a_job`: a record or a socket of a rank) or judged it healthy: a
  process with RANK in its environment and nothing else is nobody's job.
* Incidents and bundles per uid (the job owner's, from the owner key): a token
  bucket of `uid_incidents` (and `uid_bundles`) refilled one each
  `uid_refill_s`. A problem held back is not lost: it opens when the uid's bucket
  has a token again, if it still stands; a bundle held back is retried each
  tick while its job is there (publish/evidence.py `Evidence.retry`).
* What was held back is counted (/metrics: ddpwatch_incidents_limited_total,
  ddpwatch_bundles_limited_total); bundles are pruned by age and total size
  (bundle.prune), and the alert queues drop by severity (alerts/dispatch.py).
"""
from __future__ import annotations

from ..observe.jobs.discovery import born_s, owner_uid

DEATHS = frozenset({"dead"})  # verdicts held to min_life_s


def shows_a_job(snap) -> bool:
    """Whether a look saw more of a job than a claim: a rank's heartbeat record
    or a TCP socket of a rank (the store it dials or hosts, its peers). RANK and
    WORLD_SIZE in an environment are anyone's to write; a process with nothing
    else, however long it lives, is no job that can hang or die for anyone
    (tests/hostile/test_floods.py), and opens no incident."""
    ranks = snap.job.rank_pids
    records = snap.heartbeats.by_pid if snap.heartbeats is not None else {}
    if any(pid in records for pid in ranks):
        return True
    sockets = snap.sockets.by_pid if snap.sockets is not None else {}
    return any(sockets[pid].sockets for pid in ranks if pid in sockets)


def life_s(key: str, alive_at_s: float | None) -> float | None:
    """How long the job lived until `alive_at_s` (boot-time seconds of the last
    tick it had a live rank); None when either end is unknown."""
    born = born_s(key)
    if born is None or alive_at_s is None:
        return None
    return max(0.0, alive_at_s - born)


def too_young(verdict: str, life: float | None, min_life_s: float,
              worked: bool = False) -> bool:
    """A death of a job that did not live `min_life_s` and was never judged
    healthy (`worked`); unknown life: not young, so a job the daemon cannot date
    still pages."""
    return verdict in DEATHS and not worked and life is not None and life < min_life_s


class Buckets:
    """A token bucket per uid: `burst` at once, one more each `refill_s`."""

    def __init__(self, burst: int, refill_s: float):
        self.burst, self.refill_s = burst, refill_s
        self._tokens: dict[int, tuple[float, float]] = {}  # uid -> (tokens, as of when)

    def take(self, uid: int, now: float) -> bool:
        tokens, at = self._tokens.get(uid, (float(self.burst), now))
        if self.refill_s > 0:
            tokens = min(float(self.burst), tokens + (now - at) / self.refill_s)
        else:
            tokens = float(self.burst)
        if tokens < 1.0:
            self._tokens[uid] = (tokens, now)
            return False
        self._tokens[uid] = (tokens - 1.0, now)
        self._forget_full(now)
        return True

    def _forget_full(self, now: float) -> None:
        """Buckets full again are the same as none: the map stays as small as the
        uids recently limited."""
        if len(self._tokens) > 64:
            self._tokens = {u: (t, at) for u, (t, at) in self._tokens.items()
                            if t + (now - at) / max(self.refill_s, 1e-9) < self.burst}


class Gate:
    """The IncidentBook's gate (`may_open`) over the bounds above, and what a
    watched job showed of itself (`saw`). `clock`: the daemon's (the buckets'
    time); life is dated in boot-time seconds (WatchedJob.alive_at)."""

    def __init__(self, config, clock):
        self.clock = clock
        self.reconfigure(config)

    def reconfigure(self, config) -> None:
        """A reload (SIGHUP) keeps the uids' buckets unless their size changed."""
        self.config = config
        bucket = (config.uid_incidents, config.uid_refill_s)
        if bucket != getattr(self, "_bucket", None):
            self._bucket, self.buckets = bucket, Buckets(*bucket)

    @staticmethod
    def saw(watched, verdict: str, last) -> None:
        """What a tick's judgement of a watched job (watch/job.py) says of it:
        judged healthy (`worked`), a look saw a record or socket of a rank (`shown`)."""
        watched.worked |= verdict == "healthy"
        watched.shown = watched.shown or shows_a_job(last)

    def may_open(self, key: str, verdict: str, watched) -> str:
        """"" to open `key`'s incident now, else why not (metrics.LIMITED)."""
        # a job that only claims ranks (no record, no socket, never healthy);
        # without the sockets probe nothing could show one, so nothing is held
        if (watched is not None and not (watched.shown or watched.worked)
                and self.config.probe_on("sockets")):
            return "claims_only"
        if too_young(verdict, life_s(key, watched and watched.alive_at),
                     self.config.min_life_s, bool(watched and watched.worked)):
            return "young"
        if not self.buckets.take(owner_uid(key), self.clock()):
            return "uid_rate"
        return ""
