"""Every word ddpwatch judges with: verdicts, roles and findings, in one place.

A new verdict is one row in VERDICTS, its name in SEVERITY where it falls, plus
the rules (rules/*.yaml) that give it; everything else (rule validation, the job's verdict when no rank is a culprit,
incidents, metrics, reports, exit codes, the dashboard's value mappings, the
config's `open_after_s`) reads it from here. The dashboard is regenerated from
this table by `scripts/dashboard_verdicts.py` (a test checks they agree).
docs/architecture.md "Adding things" counts the files a new verdict takes, its
rule's tests and fixture included.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    name: str
    fine: bool          # nothing wrong seen (exit 0 of diagnose, no stack dump)
    calm: bool          # opens no incident (fine, or could not be judged)
    open_after_s: float  # a problem opens an incident once it lasted this long
                         # (0: on its second tick in a row; see publish/incidents.py)
    meaning: str
    color: str          # its colour on the dashboard (Grafana's named colours)
    # where a rank's time goes while it has this verdict (watch/timebook.py STATES;
    # `paused` splits by role there, `slowing` counts as what it would be: "")
    time: str = "unknown"
    page: str = "#c62828"  # its colour on the incident page (publish/page_svg.py): a
                           # problem is red unless it says otherwise

    @property
    def label(self) -> str:
        """How text reports show it."""
        return self.name.upper().replace("_", " ")


# Declaration order is the order of metrics series and of the dashboard's value
# mappings (0, 1, 2...): append new verdicts at the end.
#
# Slow problems wait before they page: every job waits at rendezvous while its
# last node is being started (by hand: seconds to a minute: open_after_s); a rank
# slow for a few seconds (a busy host) is `slowing`, no page, and one slow for
# straggler_after_s (half a minute) is a straggler, paged (the wait is in the
# daemon's per-job watch, watch/slow.py, so /status says it too). Stalls and
# culprits open at once.
VERDICTS: tuple[Verdict, ...] = (
    Verdict("healthy", True, True, 0.0, "heartbeats advancing, step times in family", "green",
            "computing", "#2e7d32"),
    Verdict("warming_up", True, True, 0.0,
            "first steps, compilation, or not yet at the first collective", "blue",
            "starting", "#9e9e9e"),
    Verdict("blocked_in_collective", False, False, 0.0,
            "victim: idle inside a collective its peers have not joined", "orange", "stalled"),
    Verdict("hung_outside_collective", False, False, 0.0,
            "culprit: idle elsewhere while its peers wait in a collective", "red", "stalled"),
    Verdict("stopped", False, False, 0.0, "process stopped (SIGSTOP, debugger)", "red",
            "stalled"),
    Verdict("dead", False, False, 0.0, "rank process gone", "dark-red", "stalled"),
    Verdict("straggler", False, False, 0.0, "culprit: advancing, but arrives last", "red",
            "computing", "#e08a00"),
    Verdict("waiting_on_peer", False, False, 0.0,
            "victim: advancing, but mostly waiting for a straggler", "yellow", "waiting",
            "#e0c000"),
    Verdict("slow_collective", False, False, 30.0,
            "time inside collectives dominates, bytes flow slowly", "yellow", "computing"),
    Verdict("rendezvous_wait", False, False, 60.0,
            "in init_process_group / the store, peers not there yet", "super-light-blue",
            "starting"),
    Verdict("unreachable_peer", False, False, 0.0,
            "connects to the store or a peer go unanswered", "red", "stalled"),
    Verdict("desync", False, False, 0.0, "ranks inside different collectives", "purple",
            "stalled"),
    Verdict("unknown", False, True, 0.0, "could not be observed", "text", "unknown", "#cccccc"),
    # A pause pages only past what is normal for its job (rule pause-past-bound turns
    # one that lasts too long into hung_outside_collective): calm here.
    Verdict("paused", False, True, 0.0,
            "a rank works outside the collectives (evaluation, checkpoint, data...) while "
            "its peers wait for it", "light-blue", "paused", "#7fb3e0"),
    # A straggler is slow over many steps: one slower for less than
    # straggler_after_s (a busy host, a few seconds of one rank computing while its
    # peers wait) is `slowing`, calm; rule slowing-briefly, watch/slow.py.
    Verdict("slowing", False, True, 0.0,
            "a rank falls behind its peers, not yet for long enough to be a straggler",
            "light-yellow", "", "#e8d870"),
)
# Most severe first: which verdict speaks for the job when no rank is a culprit,
# and which change of an incident is told (publish/incidents.py). Every verdict
# once (tests/unit/judge/test_vocabulary_unit.py).
SEVERITY = ("dead", "stopped", "hung_outside_collective", "desync", "unreachable_peer",
            "straggler", "blocked_in_collective", "slow_collective", "rendezvous_wait",
            "waiting_on_peer", "paused", "slowing", "warming_up", "unknown", "healthy")
BY_NAME = {v.name: v for v in VERDICTS}
NAMES = tuple(v.name for v in VERDICTS)
FINE = frozenset(v.name for v in VERDICTS if v.fine)
CALM = frozenset(v.name for v in VERDICTS if v.calm)
PROBLEMS = tuple(v.name for v in VERDICTS if not v.calm)  # what opens incidents
# calm, but not known to be fine: opens nothing, yet does not reset the two-tick
# confirmation of the problem that follows it (publish/incidents.py)
HELD = frozenset({"slowing"})
OPEN_AFTER_S = {v.name: v.open_after_s for v in VERDICTS if v.open_after_s}

ROLES = ("culprit", "victim", "none")
# Findings coexist with any verdict (docs/design.md "Verdicts"); their severity is the
# rule's.
FINDINGS = ("bf16_on_cpu", "oversubscribed", "data_parity", "orphan", "wrong_interface")
SEVERITIES = ("info", "warning", "critical")


def label(verdict: str) -> str:
    found = BY_NAME.get(verdict)
    return found.label if found else verdict.upper().replace("_", " ")

