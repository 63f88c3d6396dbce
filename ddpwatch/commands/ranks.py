"""`ddpwatch ranks`: a one-shot table of this node's ranks from their records."""
from __future__ import annotations

import json
import sys
import time

from ..observe.jobs import discovery
from .. import errors
from ..publish import ranks
from ..publish.terminal import printable, printable_lines
from ..observe.probes import ProbeContext
from ..observe.probes.heartbeats import read as read_heartbeats


def main(args) -> int:
    # Also where running ranks say they write (their DDPWATCH_DIR), not only ours.
    named = discovery.heartbeat_dirs(discovery.read_table())
    obs = read_heartbeats(ProbeContext(heartbeat_dir=args.dir), named)
    for skipped in obs.skipped:
        print(printable(f"ddpwatch: skipped {skipped.path}: {skipped.reason}"), file=sys.stderr)
    rows = ranks.rows(obs.records, obs.alive, time.monotonic(), show_all=args.all)
    if args.json:
        print(json.dumps({"ranks": rows}, indent=2))
    else:
        print(printable_lines(ranks.table(rows)))
    return errors.OK
