"""`ddpwatch rules check [FILE...]`: validate rule files; exit 78 on the first error."""
from __future__ import annotations

from .. import errors
from ..judge import rules
from ..resources import shipped


def main(args) -> int:
    for path in args.files or [shipped("rules", "default.yaml")]:
        loaded = rules.load(path)
        kinds = sum(1 for r in loaded if r.verdict), sum(1 for r in loaded if r.finding)
        print(f"{path}: ok ({kinds[0]} verdict rules, {kinds[1]} finding rules)")
    return errors.OK
