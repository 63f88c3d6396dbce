"""Heartbeats for scripts that never call ddpwatch (README "Heartbeats"): the four launchers of
tests/jobs/thirdparty (Lightning, mp.spawn, accelerate launch, torchrun), each
under `ddpwatch exec` and with DDPWATCH_AUTO=1 (the .pth the install put in
site-packages). Each job must write one record per rank with the rank numbers the
script itself announces, none for its launcher, and a stopped (exec) or hung
(DDPWATCH_AUTO) rank is then judged from those heartbeats: `diagnose --no-stacks`,
evidence naming the collective. One job per case, every assertion about it in
one test; the Lightning job under exec is shared (module scope) with the bf16
tests."""
from __future__ import annotations

import json
import os
import re
import signal
import sys

import pytest
from conftest import REPO, Job, free_port, torchrun, wait_until
from diag import by_rank, cpu_has_bf16, diagnose, until_verdict

from ddpwatch.heartbeat import read_dir

JOBS = os.path.join(REPO, "tests", "jobs", "thirdparty")
TIMEOUT = 120
HANG_STEP = 12
ANNOUNCE = re.compile(r"thirdparty: rank=(\d+) local_rank=(\d+) world=(\d+) pid=(\d+)")
NO_STACKS = ("--no-stacks",)  # judged from heartbeats and /proc, not from py-spy


def command(kind: str) -> tuple[list[str], dict]:
    script = os.path.join(JOBS, f"{kind}_ddp.py")
    port = str(free_port())
    if kind == "torchrun":
        return torchrun(2, script), {}
    if kind == "accelerate":
        return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                "--num_processes=2", "--num_machines=1", "--mixed_precision=no",
                "--dynamo_backend=no", f"--main_process_port={port}", script], {}
    return [sys.executable, script], {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}


def launch(kind: str, mode: str, directory, env=None) -> Job:
    argv, extra = command(kind)
    if mode == "exec":
        argv = [sys.executable, "-m", "ddpwatch", "exec", "--", *argv]
    else:
        extra["DDPWATCH_AUTO"] = "1"
    hb = str(directory / "hb")
    full = dict(os.environ, DDPWATCH_DIR=hb, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                PYTHONPATH=REPO, **extra, **(env or {}))
    for name in ("DDPWATCH_AUTO_WARNED", "DDPWATCH_TEST_STEPS", "DDPWATCH_TEST_FAULT"):
        if name not in (env or {}):
            full.pop(name, None)
    if mode == "exec":
        full.pop("DDPWATCH_AUTO", None)  # exec alone must turn it on
    job = Job(argv, full, str(directory / f"{kind}-{mode}.log"))
    job.hb_dir = hb
    return job


def announced(job) -> dict[int, tuple[int, int, int]]:
    """pid -> (rank, local_rank, world) as the script printed them."""
    return {int(pid): (int(r), int(lr), int(w)) for r, lr, w, pid in ANNOUNCE.findall(job.output())}


def records_match(job):
    """Every announced rank has a record saying the same rank, local rank and world
    size, past its rendezvous; and no other process has one. Returns the records."""
    ranks = announced(job)
    if len(ranks) != 2:
        return None
    records, _ = read_dir(job.hb_dir)
    mine = {r.pid: r for r in records}
    if set(mine) != set(ranks):
        return None
    for pid, (rank, local, world) in ranks.items():
        r = mine[pid]
        if (r.rank, r.local_rank, r.world_size) != (rank, local, world) or r.collective_seq < 2:
            return None
    return {r.rank: r for r in mine.values()}


def check_records(job) -> dict:
    try:
        return wait_until(lambda: records_match(job), TIMEOUT,
                          what="a record per rank with the script's own rank numbers")
    except BaseException:
        print(job.output()[-4000:])
        print(read_dir(job.hb_dir))
        raise


def rank_pid(job, rank: int) -> int:
    return next(pid for pid, (r, _, _) in announced(job).items() if r == rank)


def judged_stopped(job) -> None:
    r0, r1 = rank_pid(job, 0), rank_pid(job, 1)
    os.kill(r1, signal.SIGSTOP)
    try:
        report = until_verdict(r0, {0: ("blocked_in_collective", "victim"),
                                    1: ("stopped", "culprit")}, TIMEOUT, hb_dir=job.hb_dir,
                               extra=NO_STACKS)
        assert report["job"]["culprits"] == [1]
        assert_collective_evidence(report, job)  # while both still stand where judged
    finally:
        os.kill(r1, signal.SIGCONT)


def assert_collective_evidence(report: dict, job) -> None:
    """Both ranks' evidence names the collective the heartbeats show, by number."""
    ranks = by_rank(report)
    records, _ = read_dir(job.hb_dir)
    seq = {r.rank: r.collective_seq for r in records if r.pid in announced(job)}
    for rank in (0, 1):
        assert ranks[rank]["signals"]["hb"] is True
        assert f"#{seq[rank]}" in ranks[rank]["evidence"], ranks[rank]["evidence"]
    assert f"collective #{seq[1]}" in ranks[1]["evidence"]
    assert ranks[0]["signals"]["hb_phase"] == "inside"


@pytest.fixture(params=["torchrun", "spawn", "accelerate"])
def kind(request):
    return request.param


def test_under_exec_records_and_a_stopped_rank(kind, tmp_path):
    job = launch(kind, "exec", tmp_path)
    try:
        records = check_records(job)
        assert {r.phase for r in records.values()} <= {"inside", "outside"}
        if kind == "spawn":  # a DistributedSampler: the same data, the same fingerprint
            fps = {r.data_fingerprint for r in records.values()}
            assert len(fps) == 1 and "" not in fps, fps
        judged_stopped(job)
    finally:
        job.kill()


@pytest.mark.parametrize("kind", ["torchrun", "spawn", "accelerate", "lightning"])
def test_with_ddpwatch_auto_records_and_a_hung_rank(kind, tmp_path):
    fault = f"hang:1:{HANG_STEP}" + (",data:1" if kind == "spawn" else "")
    job = launch(kind, "auto", tmp_path, env={"DDPWATCH_TEST_FAULT": fault})
    try:
        check_records(job)
        report = until_verdict(rank_pid(job, 0), {0: ("blocked_in_collective", "victim"),
                                                  1: ("hung_outside_collective", "culprit")},
                               TIMEOUT, hb_dir=job.hb_dir, extra=NO_STACKS)
        assert report["job"]["culprits"] == [1]
        assert_collective_evidence(report, job)
        assert by_rank(report)[1]["signals"]["hb_step"] == HANG_STEP
        if kind == "spawn":  # rank 1's dataset has one sample more: another split
            assert all("data_parity" in {f["id"] for f in r["findings"]}
                       for r in report["ranks"]), report["ranks"]
    finally:
        job.kill()


def test_a_rank_hung_before_its_second_step_has_its_peer_waiting_in_ddps_bucket_rebuild(
        tmp_path):
    """Rank 1 stops right after step 0 (before step 1's forward). Rank 0 waits in
    the broadcast of DDP's rebuilt bucket order, which DDP's C++ reducer makes in
    the second forward, outside torch.distributed's Python functions: its record
    must say so (inside, op ddp_rebuild_buckets), and rank 0 is the hung rank's
    victim, not a rank warming up (its step is 1)."""
    job = launch("torchrun", "auto", tmp_path, env={"DDPWATCH_TEST_FAULT": "hang:1:1"})
    try:
        wait_until(lambda: "rank 1 hangs at step 1" in job.output(), TIMEOUT,
                   what="rank 1 hanging at step 1")
        report = until_verdict(rank_pid(job, 0), {0: ("blocked_in_collective", "victim"),
                                                  1: ("hung_outside_collective", "culprit")},
                               TIMEOUT, hb_dir=job.hb_dir, extra=NO_STACKS)
        zero = by_rank(report)[0]
        assert (zero["signals"]["hb_op"], zero["signals"]["hb_step"]) == (
            "ddp_rebuild_buckets", 1), zero["signals"]
        assert "ddp_rebuild_buckets" in zero["evidence"], zero["evidence"]
    finally:
        job.kill()


# --- Lightning under exec, bf16-mixed: one job for records, bf16 and a stop --------
@pytest.fixture(scope="module")
def lightning_bf16(tmp_path_factory):
    job = launch("lightning", "exec", tmp_path_factory.mktemp("lightning"),
                 env={"DDPWATCH_TEST_PRECISION": "bf16-mixed"})
    yield job
    job.kill()


def findings(report: dict) -> dict[int, set[str]]:
    return {r["rank"]: {f["id"] for f in r["findings"]} for r in report["ranks"]}


def test_lightning_under_exec_records(lightning_bf16):
    records = check_records(lightning_bf16)
    # Lightning's rank 0 is the process the user started (`ddpwatch exec` became it),
    # rank 1 the script Lightning re-executed with LOCAL_RANK=1
    assert records[0].pid == lightning_bf16.proc.pid
    assert records[1].pid != lightning_bf16.proc.pid


def test_bf16_autocast_found_from_outside(lightning_bf16, tmp_path):
    """bf16_on_cpu from the dtype seen at the DDP forward (Lightning's autocast), on
    this CPU's flags; then the same real snapshot replayed with the flags swapped."""
    job = lightning_bf16
    check_records(job)
    saved = str(tmp_path / "bf16.json")
    healthy = {0: ("healthy", "none"), 1: ("healthy", "none")}
    report = until_verdict(rank_pid(job, 0), healthy, TIMEOUT, hb_dir=job.hb_dir,
                           extra=(*NO_STACKS, "--save-snapshot", saved))
    native = cpu_has_bf16()
    for r in report["ranks"]:
        assert r["signals"]["compute_dtype"] == "bfloat16"
        assert r["signals"]["cpu_bf16"] is native
    assert findings(report) == {0: set() if native else {"bf16_on_cpu"},
                                1: set() if native else {"bf16_on_cpu"}}
    # The other CPU: the very snapshot, its flags swapped.
    with open(saved) as f:
        history = json.load(f)
    for snap in history["history"]:
        cpu = snap["host"]["cpu"]
        if native:
            cpu["flags"] = [x for x in cpu["flags"] if x not in ("avx512_bf16", "amx_bf16")]
        else:
            cpu["flags"] = sorted(set(cpu["flags"]) | {"avx512_bf16"})
        cpu["bf16_native"] = not native
    swapped = str(tmp_path / "bf16_swapped.json")
    with open(swapped, "w") as f:
        json.dump(history, f)
    _, replayed = diagnose(0, "--replay", swapped)
    assert findings(replayed) == {0: {"bf16_on_cpu"} if native else set(),
                                  1: {"bf16_on_cpu"} if native else set()}


def test_lightning_under_exec_a_stopped_rank(lightning_bf16):
    check_records(lightning_bf16)
    judged_stopped(lightning_bf16)


# --- one process, world size 1: what auto-instrumentation fills in, and leaves ------
PROBE = r"""
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler
from ddpwatch.heartbeat import read_dir
mode = sys.argv[1]
if mode == "explicit":
    import ddpwatch
    ddpwatch.instrument(compute_dtype="float32", data_fingerprint="the-scripts-own")
if mode != "no-init":
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0,
                            world_size=1)
    DistributedSampler(TensorDataset(torch.zeros(10, 2)), seed=7)
    model = DDP(torch.nn.Linear(2, 2))
    def record():
        (r,), _ = read_dir(os.environ["DDPWATCH_DIR"])
        return r
    seen = []
    model(torch.zeros(1, 2)).sum().backward()
    seen.append(record().compute_dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.zeros(1, 2)).float().sum().backward()
    seen.append(record().compute_dtype)
    model(torch.zeros(1, 2)).sum().backward()
    seen.append(record().compute_dtype)
    r = record()
    print("record", r.rank, r.world_size, r.data_fingerprint, ",".join(seen), r.collectives_completed)
    dist.destroy_process_group()
print("modules", "ddpwatch.rank.instrumentation" in sys.modules)
"""


def probe(mode: str, tmp_path) -> tuple[list[str], list[str]]:
    hb = tmp_path / mode
    out = __import__("subprocess").run(
        [sys.executable, "-c", PROBE, mode, str(free_port())], capture_output=True, text=True,
        timeout=TIMEOUT, env=dict(os.environ, DDPWATCH_AUTO="1", DDPWATCH_DIR=str(hb),
                                  PYTHONPATH=REPO, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()}
    return lines.get("record", []), lines["modules"]


def test_auto_fills_dtype_at_each_forward_and_the_sampler_fingerprint(tmp_path):
    record, modules = probe("auto", tmp_path)
    rank, world, fingerprint, dtypes, completed = record
    assert (rank, world) == ("0", "1") and int(completed) >= 3
    assert len(fingerprint) == 16 and fingerprint != "the-scripts-own"
    # plain, then under bf16 autocast, then plain again: each forward says it
    assert dtypes == "float32,bfloat16,float32", dtypes


def test_a_script_that_instruments_itself_keeps_what_it_said(tmp_path):
    record, _ = probe("explicit", tmp_path)
    rank, world, fingerprint, dtypes, _ = record
    assert (rank, world, fingerprint) == ("0", "1", "the-scripts-own")
    assert dtypes == "float32,float32,float32"


def test_a_process_that_never_calls_init_process_group_gets_nothing(tmp_path):
    record, modules = probe("no-init", tmp_path)
    assert record == [] and modules == ["False"]  # armed only: not even instrumented
    assert not (tmp_path / "no-init").exists()
