"""`ddpwatch rules check [FILE...]`: validate rule files; exit 78 on the first error,
65 when it is a rule comparing a string signal with a value the signal does not
declare (`stack == 'cuda_synch'`: errors.UndeclaredValue).

Each FILE is checked as `diagnose --rules` and the daemon's `rules:` load it: on
top of the shipped rules and the files before it, so that its overrides and
replacements are checked against the rules they name. A rule of the old format
(`priority:`) loads, with a warning on stderr saying what replaces it."""
from __future__ import annotations

import sys

from .. import errors
from ..judge import rules, stages
from ..resources import shipped


def main(args) -> int:
    try:
        return _check(args)
    except errors.UndeclaredValue as err:
        raise errors.DataError(str(err)) from err


def _check(args) -> int:
    for i, path in enumerate(args.files or [shipped("rules", "default.yaml")]):
        loaded = rules.load(path)
        merged = rules.load_default(args.files[:i + 1])
        for note in stages.deprecations(merged):
            if note.startswith(f"{path}:"):
                print(f"ddpwatch rules check: warning: {note}", file=sys.stderr)
        kinds = sum(1 for r in loaded if r.verdict), sum(1 for r in loaded if r.finding)
        print(f"{path}: ok ({kinds[0]} verdict rules, {kinds[1]} finding rules)")
    return errors.OK
