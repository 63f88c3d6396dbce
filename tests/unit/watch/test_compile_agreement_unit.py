"""`diagnose` and the daemon's /status give the same verdicts for the same window
of a compiling job: torch.compile on one rank while its peer waits
(tests/fixtures/snapshots/trainer_compile_apart: rank 1 compiles, rank 0 waits in
the bucket all-reduce) is a pause of kind compile to both (rules
compiling-while-peers-wait, waits-for-compiling-peer); the daemon's per-job watch
adds only what the job's past makes of it, a hang once past its bound (rule
pause-past-bound). tests/diagnose/test_diagnose_plain.py
test_compile_is_warm_up_not_a_hang checks the same on a real job's windows."""
from __future__ import annotations

import contextlib
import io
import json
import os

from conftest import REPO
from crafted import watched_status

from ddpwatch import cli

FIXTURE = os.path.join(REPO, "tests", "fixtures", "snapshots", "trainer_compile_apart.json")


def diagnosed(path: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["diagnose", "--replay", path, "--json"])
    assert code == 1, out.getvalue()  # paused is no fine verdict (exit 1), as for any pause
    return json.loads(out.getvalue())


def verdicts(doc: dict) -> dict:
    return {r["rank"]: (r["verdict"], r["role"], r["rule"]) for r in doc["ranks"]}


def test_diagnose_and_status_agree_on_a_compiling_window():
    alone = diagnosed(FIXTURE)
    assert verdicts(alone) == {0: ("paused", "none", "waits-for-compiling-peer"),
                               1: ("paused", "none", "compiling-while-peers-wait")}
    for ticks in (1, 5, 60):
        status = watched_status(FIXTURE, ticks)
        assert verdicts(status) == verdicts(alone), ticks
        assert status["job"]["verdict"] == alone["job"]["verdict"] == "paused"
        assert status["job"]["culprits"] == alone["job"]["culprits"] == []
        assert status["jobs"][0]["pause"]["kind"] == "compile"
    # the daemon's past adds only the bound: a compile that never ends is a hang
    status = watched_status(FIXTURE, 301)
    assert verdicts(status) == {0: ("blocked_in_collective", "victim", "waits-past-pause-bound"),
                                1: ("hung_outside_collective", "culprit", "pause-past-bound")}
