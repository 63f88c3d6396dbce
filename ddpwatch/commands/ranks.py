"""`ddpwatch ranks`: a one-shot table of this node's ranks from their records."""
from __future__ import annotations

import json
import sys
import time

from .. import errors, ranks
from ..probes import ProbeContext
from ..probes.heartbeats import run as read_heartbeats


def main(args) -> int:
    obs = read_heartbeats(ProbeContext(heartbeat_dir=args.dir), ())
    for skipped in obs.skipped:
        print(f"ddpwatch: skipped {skipped.path}: {skipped.reason}", file=sys.stderr)
    rows = ranks.rows(obs.records, obs.alive, time.monotonic(), show_all=args.all)
    if args.json:
        print(json.dumps({"ranks": rows}, indent=2))
    else:
        print(ranks.table(rows))
    return errors.OK
