"""What this daemon serves its peers at `/peer` (observe/peers.py asks them):
its own ranks' signals, measured here and clock-free (judge.signals.local), per
job and owner. A job is its run id *and* its owner's uid: a run id is any
user's to pick, so two users' jobs under one run id are two entries of the
answer's `owned` list, and a node joins (and hears claims of) only the entry
of its own job's uid. The older maps (`jobs`, `owners`, `alerting`: keyed by
run id alone) still go out for older peers, without any run id two owners
share there (an older peer then sees neither, rather than the wrong one:
tests/unit/observe/test_peers_unit.py).
"""
from __future__ import annotations

import collections

from .. import __version__
from ..observe.jobs.discovery import owner_uid


def document(view) -> dict:
    """What this daemon serves at /peer: its own ranks' signals, per job and owner.
    A job goes by the run id its other nodes know it by, not the label this node
    gave it to tell its jobs sharing one apart (observe/jobs/discovery.py labels:
    a look-alike that started first takes the bare label here), and by its
    owner's uid (a run id is any user's to pick; README, "Trust model")."""
    keyed = [(j.run_id or j.key, owner_uid(j.owner) if j.owner else -1, j) for j in view.jobs]
    shared = collections.Counter(key for key, _, _ in keyed)
    alone = [(key, uid, j) for key, uid, j in keyed if shared[key] == 1]
    alerting = set(view.alerting_jobs)  # (run id, owner uid)
    return {"node": view.node, "tick": view.tick, "wall_time": view.wall_time,
            "version": __version__,
            "owned": [{"key": key, "uid": uid, "ranks": list(j.judgement.local),
                       "alerting": (key, uid) in alerting} for key, uid, j in keyed],
            # for peers older than `owned`: run ids held by one job only
            "jobs": {key: list(j.judgement.local) for key, _, j in alone},
            "owners": {key: uid for key, uid, j in alone if j.owner},
            "alerting": sorted(key for key, uid, _ in alone if (key, uid) in alerting),
            "webhooks": view.webhooks}
