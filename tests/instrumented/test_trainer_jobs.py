"""The bundled trainer under torchrun: heartbeats advance, rings agree, and
`ddpwatch ranks` shows them. What each fault does to the records is asserted by
the test that diagnoses it (tests/diagnose/test_diagnose_trainer.py), on the same job."""
from __future__ import annotations

import json
import os
import subprocess
import sys


from conftest import REPO, trainer, wait_until
from ddpwatch.heartbeat import read_dir

RANKS_KEYS = {"rank", "local_rank", "pid", "step", "collective_seq", "op", "in_collective_s",
              "tokens_per_s", "comm_share"}


def ranks_json(hb_dir: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "ddpwatch", "ranks", "--json", "--dir", hb_dir],
                         capture_output=True, text=True, check=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=REPO))
    return json.loads(out.stdout)["ranks"]


def records(hb_dir):
    recs, skipped = read_dir(hb_dir)
    assert skipped == []
    return {r.rank: r for r in recs}


def test_healthy_run_records_advance_together_and_rings_agree(start_job, hb_dir):
    job = start_job(trainer("--steps=8"))
    assert job.wait(300) == 0, job.output()
    recs = records(hb_dir)
    assert sorted(recs) == [0, 1]
    for r in recs.values():
        assert r.step == 8 and r.phase == "exited" and r.tokens > 0
        buckets = [e for e in r.ring if e.op == "ddp_bucket_all_reduce"]
        assert len(buckets) >= 8 and all(e.bytes > 0 for e in buckets)
    assert [(e.seq, e.op, e.bytes) for e in recs[0].ring] == \
           [(e.seq, e.op, e.bytes) for e in recs[1].ring]
    assert "done: steps=8" in job.output()


def test_ranks_command_shows_live_progress(start_job, hb_dir):
    start_job(trainer("--steps=0"))
    rows = wait_until(lambda: (lambda rs: rs if len(rs) == 2 and all(r["step"] >= 3 for r in rs)
                               else None)(ranks_json(hb_dir)), 180, what="2 ranks past step 3")
    for row in rows:
        assert RANKS_KEYS <= set(row)
        assert row["tokens_per_s"] > 0 and 0 <= row["comm_share"] <= 1
    pids = {str(row["pid"]) for row in rows}
    # No --dir and another DDPWATCH_DIR: the ranks' own DDPWATCH_DIR is read too.
    table = subprocess.run([sys.executable, "-m", "ddpwatch", "ranks"],
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=REPO,
                                    DDPWATCH_DIR=os.path.join(hb_dir, "elsewhere"))).stdout
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["RANK", "LOCAL", "PID"]
    assert pids <= {line.split()[2] for line in lines[1:]}, table
