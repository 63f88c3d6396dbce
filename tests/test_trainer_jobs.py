"""The bundled trainer under torchrun: heartbeats advance, rings agree, and every
fault has the effect it names - seen through the records and `ddpwatch ranks`."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

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


def _stuck(hb_dir, seconds=3.0):
    """Rank 0 sits inside a collective for `seconds` (a peer never arrives)."""
    def check():
        recs = records(hb_dir)
        rows = {r["rank"]: r for r in ranks_json(hb_dir)}
        if 0 in rows and rows[0]["in_collective_s"] > seconds:
            return recs
        return None
    return wait_until(check, 240, what="rank 0 stuck inside a collective")


def test_hang_fault_stops_rank_outside_collectives(start_job, hb_dir):
    start_job(trainer("--steps=0", "--fault=hang:rank=1:step=6"))
    recs = _stuck(hb_dir)
    assert recs[1].step == 6 and recs[1].phase == "outside"
    assert recs[0].phase == "inside" and recs[0].op == "ddp_bucket_all_reduce"
    assert recs[0].collective_seq > recs[1].collective_seq


def test_stop_fault_sigstops_the_rank(start_job, hb_dir):
    start_job(trainer("--steps=0", "--fault=stop:rank=1:step=6"))
    recs = _stuck(hb_dir)
    assert psutil.Process(recs[1].pid).status() == psutil.STATUS_STOPPED
    assert recs[1].step == 6  # the finalizer sends SIGCONT before SIGKILL


def test_exit_fault_leaves_the_loop_and_waits_at_the_end(start_job, hb_dir):
    start_job(trainer("--steps=0", "--fault=exit:rank=1:step=6"))
    recs = _stuck(hb_dir)
    assert (recs[1].phase, recs[1].op, recs[1].step) == ("inside", "barrier", 6)
    assert recs[0].op == "ddp_bucket_all_reduce"


def test_desync_fault_calls_another_collective(start_job, hb_dir):
    start_job(trainer("--steps=0", "--fault=desync:rank=1:step=6"))
    recs = _stuck(hb_dir)
    assert recs[0].phase == recs[1].phase == "inside"
    assert recs[0].op != recs[1].op


def test_slow_fault_makes_a_straggler_that_waits_least(start_job, hb_dir):
    start_job(trainer("--steps=0", "--fault=slow:rank=1:factor=4"))
    recs = wait_until(lambda: (lambda r: r if len(r) == 2 and min(x.step for x in r.values()) >= 15
                               else None)(records(hb_dir)), 240, what="15 steps")
    share = {k: r.collective_seconds / r.step_seconds for k, r in recs.items()}
    assert share[1] < share[0] / 2, share


@pytest.mark.parametrize("fault, expect", [("bf16", {0: "bfloat16", 1: "bfloat16"}),
                                           (None, {0: "float32", 1: "float32"})])
def test_compute_dtype_is_what_the_rank_computes_in(start_job, hb_dir, fault, expect):
    args = ["--steps=3", "--dtype=float32"] + ([f"--fault={fault}"] if fault else [])
    job = start_job(trainer(*args))
    assert job.wait(300) == 0, job.output()
    assert {k: r.compute_dtype for k, r in records(hb_dir).items()} == expect


def test_data_mismatch_changes_the_fingerprint(start_job, hb_dir, tmp_path):
    from trainer.data import write_shards
    write_shards(str(tmp_path / "data"), 4, 20000, 512, 0)
    start_job(trainer("--steps=0", f"--data={tmp_path / 'data'}", "--fault=data-mismatch:rank=1"))
    recs = wait_until(lambda: (lambda r: r if len(r) == 2 and all(x.data_fingerprint for x in
                                                                   r.values()) else None)(
        records(hb_dir)), 180, what="fingerprints")
    assert recs[0].data_fingerprint != recs[1].data_fingerprint
    assert recs[0].data_shards == 2 and recs[1].data_shards == 1
