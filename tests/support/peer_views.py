"""A 2-rank job split across two "nodes" without processes: what a daemon on a node
holding one rank would have seen of a replayed history (node_view), and a
judgement as the other node's /peer serves it, through JSON (over_the_wire).
Used by tests/unit/observe/test_peers_unit.py and tests/unit/publish/test_alert_route_unit.py."""
from __future__ import annotations

import dataclasses
import json


def node_view(history, rank: int, node: str):
    """What a daemon on a node holding only `rank` would have seen."""
    out = []
    for snap in history:
        keep = [i for i, r in enumerate(snap.heartbeats.records) if r.rank == rank]
        pids = tuple(snap.heartbeats.records[i].pid for i in keep)
        hb = dataclasses.replace(snap.heartbeats,
                                 records=tuple(snap.heartbeats.records[i] for i in keep),
                                 alive=tuple(snap.heartbeats.alive[i] for i in keep))
        job = dataclasses.replace(snap.job, rank_pids=tuple(p for p in snap.job.rank_pids
                                                            if p in pids))
        # one rank per node: the master is on another address, one local rank
        procs = tuple(dataclasses.replace(p, env={**p.env, "MASTER_ADDR": "10.0.0.1",
                                                  "LOCAL_WORLD_SIZE": "1"})
                      for p in snap.processes.procs)
        out.append(dataclasses.replace(
            snap, heartbeats=hb, job=job, host=dataclasses.replace(snap.host, hostname=node),
            processes=dataclasses.replace(snap.processes, procs=procs)))
    return tuple(out)


def over_the_wire(judgement):
    return tuple(json.loads(json.dumps(judgement.local)))
