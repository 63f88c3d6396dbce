"""A judgement made without the ranks' stacks must say so: the kernel refused
py-spy (observe/system/ptrace.py says why before the dump; a dump refused
anyway, observe/probes/stacks.py `refused`, says it after). Each rank's
evidence then ends with "judged without stacks", and the job says once what
is missing and the remedy."""
from __future__ import annotations

import dataclasses

from ..judge.classify import Judgement
from ..observe.probes.stacks import refused
from ..observe.snapshot import Snapshot
from ..observe.system.ptrace import Refusal, SUDO

NOTE = "judged without stacks"


def refused_dump(last: Snapshot) -> Refusal | None:
    """A refusal seen in the dumps themselves (an LSM, a rule ptrace.py does not
    know): every dump of the last look that failed was refused."""
    stacks = last.stacks
    if stacks is None:
        return None
    failed = [p for p in stacks.pids if p.status == "error"]
    if not failed or not all(refused(p.error) for p in failed):
        return None
    return Refusal(f"the kernel refused py-spy's attach to pid {failed[0].pid} "
                   f"({failed[0].error[:120]})", SUDO)


def mark(judgement: Judgement, refusal: Refusal | None) -> Judgement:
    """`judgement` with every rank's evidence saying it had no stacks."""
    if refusal is None:
        return judgement
    ranks = tuple(dataclasses.replace(r, evidence=f"{r.evidence} ({NOTE})")
                  for r in judgement.ranks)
    return dataclasses.replace(judgement, ranks=ranks)


def as_json(refusal: Refusal | None) -> dict:
    """The `stacks` entry of a job's report."""
    if refusal is None:
        return {"read": True}
    return {"read": False, "missing": refusal.missing, "remedy": refusal.remedy}
