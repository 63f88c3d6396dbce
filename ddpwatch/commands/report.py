"""`ddpwatch report`: an incident's page (HTML), drawn again from its bundle,
or drawn from a saved snapshot history (`--replay`, judged with the rules)."""
from __future__ import annotations

import os
import sys

from .. import errors
from ..judge import classify
from ..observe import snapshot
from ..publish import bundle, page, report
from . import load_rules


def main(args) -> int:
    if bool(args.bundle) == bool(args.replay):
        raise errors.UsageError("give a bundle directory or --replay SNAPSHOT.json (one of them)")
    if args.replay:
        history = snapshot.load(args.replay)  # exit 2 naming the file and the JSON path
        if not history:
            raise snapshot.SnapshotFileError(f"{args.replay}: the history holds no snapshot")
        rules = load_rules("report", args.rules)
        # with the peers' signals and the job's past it was judged with, if saved
        # (a bundle's snapshots.json: rules of stage over-time)
        judgement = classify.judge(history, rules, snapshot.load_remote(args.replay),
                                   snapshot.load_over_time(args.replay))
        html = page.render(report.as_json(judgement, history[-1]), history, None,
                           evidence_base=None)
        out = args.output or "-"
    else:
        html = bundle.render_page(args.bundle)  # exit 66 naming what is wrong
        out = args.output or os.path.join(args.bundle, bundle.PAGE)
    if out == "-":
        sys.stdout.write(html)
        return errors.OK
    try:
        with open(out, "w") as f:
            f.write(html)
    except OSError as err:
        raise errors.CantCreate(f"{out}: cannot write the page: {err.strerror}") from err
    print(out)
    return errors.OK
