"""Judgements from stacks alone for third-party jobs without heartbeats:
desync from the collectives and call sites the ranks wait at, bf16 compute from
mixed-precision frames. Real mp.spawn, Lightning and accelerate jobs on 2 CPU ranks over Gloo
(tests/jobs/thirdparty, faults `desync:RANK:STEP`, `uneven:RANK` and
DDPWATCH_TEST_AUTOCAST), no
ddpwatch inside them; then the pure parts on made-up stacks. bf16 expectations
follow this machine's CPU flags, and the same real snapshot is replayed with the
flags swapped. `DDPWATCH_SAVE_FIXTURES=1` keeps the snapshots as replay fixtures
(tests/fixtures/snapshots/thirdparty_*; tests/unit/judge/test_replay.py).
"""
from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import Job, free_port, need, wait_until
from diag import by_rank, cpu_has_bf16, diagnose, until_verdict
from thirdparty_jobs import ANNOUNCE, LAUNCH, SNAPSHOTS, THIRDPARTY, start

from ddpwatch.judge.signals import stack as stack_family
from ddpwatch.judge.stackmatch import bf16_evidence, call_site, loop_position
from ddpwatch.observe.probes.stacks import PidStacks, find_py_spy, parse_dump

DESYNC_STEP = 20
DESYNC = {0: ("desync", "victim"), 1: ("desync", "culprit")}
HEALTHY = {0: ("healthy", "none"), 1: ("healthy", "none")}
AUTOCAST_FILE = "torch/amp/autocast_mode.py"
# Waiting for samples that catch a short forward: shorter windows, more tries a second
SHORT = ("--window=0.5", "--save-snapshot")


def findings(report: dict) -> dict[int, set[str]]:
    return {r["rank"]: {f["id"] for f in r["findings"]} for r in report["ranks"]}


def swap_cpu_bf16(src: str, dst: str, native: bool) -> None:
    """The very snapshot with the other CPU's bf16 flags (nothing else changed)."""
    with open(src) as f:
        history = json.load(f)
    for snap in history["history"]:
        cpu = snap["host"]["cpu"]
        if native:
            cpu["flags"] = [x for x in cpu["flags"] if x not in ("avx512_bf16", "amx_bf16", "bf16")]
        else:
            cpu["flags"] = sorted(set(cpu["flags"]) | {"avx512_bf16"})
        cpu["bf16_native"] = not native
    with open(dst, "w") as f:
        json.dump(history, f, indent=1)


def frames_seen(path: str, suffix: str) -> bool:
    with open(path) as f:
        history = json.load(f)["history"]
    return any(frame["filename"].endswith(suffix) for snap in history if snap.get("stacks")
               for pid in snap["stacks"]["pids"] for thread in pid.get("threads", ())
               for frame in thread["frames"])


# --- desync: one real job per launcher; Lightning's in bf16-mixed for the bf16 half -------
@pytest.fixture(scope="module", params=["lightning", "spawn"])
def desynced(request, tmp_path_factory):
    need(find_py_spy() is not None, "py-spy is not installed")  # (need_py_spy is per test)
    env = {"DDPWATCH_TEST_PRECISION": "bf16-mixed"} if request.param == "lightning" else {}
    tp = start(request.param, str(tmp_path_factory.mktemp(request.param)),
               fault=f"desync:1:{DESYNC_STEP}", env=env)
    try:
        wait_until(lambda: "desyncs at step" in tp.job.output(), 120, what="rank 1's desync")
        state = "bf16_desync" if request.param == "lightning" else "desync"
        tp.report = tp.until(state, DESYNC)
        tp.saved = os.path.join(tp.tmp, f"thirdparty_{tp.launcher}_{state}.json")
        yield tp
    finally:
        tp.job.kill()


def test_desync_names_the_rank_that_left_and_both_call_sites(desynced, need_py_spy):
    """Rank 1 waits in a broadcast its peer never calls; rank 0 went on to the next
    step's backward and waits in DDP's gradient all-reduce."""
    report = desynced.report
    script = {"lightning": "lightning_ddp.py", "spawn": "spawn_ddp.py"}[desynced.launcher]
    ranks = by_rank(report)
    assert {r: (v["verdict"], v["role"], v["rule"]) for r, v in ranks.items()} == {
        0: ("desync", "victim", "desync-stack"), 1: ("desync", "culprit", "desync-stack-deviant")}
    assert report["job"]["verdict"] == "desync" and report["job"]["culprits"] == [1]
    deviant = "broadcast at faults.py:"
    common = "DDP's gradient all-reduce in backward"
    # rank 1 at the broadcast its own code called (faults.py, from the script's step)
    assert ranks[1]["signals"]["stack_site"].startswith(deviant)
    assert f"<- {script}:" in ranks[1]["signals"]["stack_site"]
    assert ranks[0]["signals"]["stack_site"].startswith(common)
    assert f"{script}:" in ranks[0]["signals"]["stack_site"]
    for r in (0, 1):  # each rank's evidence names both call sites, the summary too
        assert deviant in ranks[r]["evidence"] and common in ranks[r]["evidence"], ranks[r]
        assert ranks[r]["signals"]["stack_samples"] >= 2
    assert deviant in report["job"]["summary"] and common in report["job"]["summary"]


@pytest.mark.parametrize("desynced", ["lightning"], indirect=True)  # the spawn job is fp32
def test_bf16_mixed_precision_from_lightning_stacks(desynced, tmp_path, need_py_spy):
    """Lightning's bf16-mixed plugin runs every step under its optimizer_step: a
    bf16_on_cpu finding on a CPU without bf16 support, none on one with it (this
    machine's flags decide); the same real snapshot with the flags swapped gives
    the other answer."""
    native = cpu_has_bf16()
    for r in desynced.report["ranks"]:
        assert "Lightning's mixed-precision plugin" in r["signals"]["stack_bf16"], r["signals"]
        assert r["signals"]["cpu_bf16"] is native
    assert findings(desynced.report) == {0: set() if native else {"bf16_on_cpu"},
                                         1: set() if native else {"bf16_on_cpu"}}
    swapped = str(tmp_path / "swapped.json")
    swap_cpu_bf16(desynced.saved, swapped, native)
    _, replayed = diagnose(0, "--replay", swapped)
    assert findings(replayed) == {0: {"bf16_on_cpu"} if native else set(),
                                  1: {"bf16_on_cpu"} if native else set()}
    if not native:
        return
    found = next(f for f in replayed["ranks"][1]["findings"] if f["id"] == "bf16_on_cpu")
    assert "amp.py" in found["evidence"], found
    if os.environ.get("DDPWATCH_SAVE_FIXTURES") == "1":  # the edited twin, as trainer_bf16's
        swap_cpu_bf16(desynced.saved, os.path.join(
            SNAPSHOTS, "thirdparty_lightning_bf16_desync_no_cpu_bf16.json"), native)


# --- uneven data: the rank that ran out left the training loop ---------------------------
def test_uneven_data_names_the_rank_that_left_the_loop(tmp_path, need_py_spy):
    """Lightning with half the data on rank 1: after its 4 batches it leaves the
    epoch and waits in ModelCheckpoint's epoch-end collective, while rank 0, with 8,
    waits in the next step's broadcast. Neither is DDP's all-reduce: only where
    the stacks are in the loop names rank 1, and both places are shown."""
    tp = start("lightning", str(tmp_path), fault="uneven:1",
               env={"DDPWATCH_TEST_OUT": str(tmp_path)})
    try:
        report = tp.until("uneven", DESYNC, timeout=180)
    finally:
        tp.job.kill()
    ranks = by_rank(report)
    assert {r: (v["verdict"], v["role"], v["rule"]) for r, v in ranks.items()} == {
        0: ("desync", "victim", "desync-stack"), 1: ("desync", "culprit", "desync-left-loop")}
    assert report["job"]["verdict"] == "desync" and report["job"]["culprits"] == [1]
    assert ranks[1]["signals"]["loop_position"] == "left_epoch"
    assert ranks[0]["signals"]["loop_position"] == "in_epoch"
    left = "out of the training loop at ModelCheckpoint.on_train_epoch_end"
    mid = "mid-epoch at _TrainingEpochLoop.advance"
    for r in (0, 1):  # each rank's evidence: both collectives, both places, the user's line
        evidence = ranks[r]["evidence"]
        assert left in evidence and mid in evidence, evidence
        assert ranks[0]["signals"]["stack_site"] in evidence
        assert ranks[1]["signals"]["stack_site"] in evidence
        assert "at lightning_ddp.py:" in ranks[r]["signals"]["stack_site"]
    assert left in report["job"]["summary"] and mid in report["job"]["summary"]


# --- accelerate's bf16 autocast on a healthy job -----------------------------------------
def test_bf16_from_accelerate_stacks_on_a_healthy_job(tmp_path, need_py_spy):
    """`accelerate launch --mixed_precision=bf16`: the model's forward runs under
    accelerate's autocast wrapper; a healthy job with bf16_on_cpu by this CPU's
    flags, the opposite with them swapped."""
    try:
        import accelerate  # noqa: F401
    except ImportError:
        need(False, "accelerate is not installed (setup.cfg extra 'test')")
    argv = LAUNCH["accelerate"](free_port(), os.path.join(THIRDPARTY, "accelerate_ddp.py"))
    argv.insert(argv.index("launch") + 1, "--mixed_precision=bf16")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("DDPWATCH_DIR", None)
    job = Job(argv, env, str(tmp_path / "accelerate.log"))
    saved = str(tmp_path / "thirdparty_accelerate_bf16.json")
    try:
        pids = wait_until(lambda: (lambda f: f if len(f) == 2 else None)(
            {int(r): int(p) for r, _, p in ANNOUNCE.findall(job.output())}),
            240, interval=0.5, what="accelerate's 2 ranks")

        # The wrapper's frames are on the stack during forward only, a small share of
        # this small model's step (backward, AdamW and DDP's hooks take the rest): a
        # healthy judgement whose samples caught some rank in its forward.
        def seen():
            report = until_verdict(pids[0], HEALTHY, timeout=150, extra=SHORT + (saved,))
            return report if any(r["signals"].get("stack_bf16") for r in report["ranks"]) else None
        report = wait_until(seen, 150, interval=0.2, what="a rank sampled in its bf16 forward")
    finally:
        job.kill()
    native = cpu_has_bf16()
    caught = {r["rank"] for r in report["ranks"] if r["signals"].get("stack_bf16")}
    for r in report["ranks"]:
        assert r["rank"] not in caught or r["signals"]["stack_bf16"].startswith(
            "accelerate's bf16 autocast"), r["signals"]
    assert report["job"]["culprits"] == []
    bf16 = {r: {"bf16_on_cpu"} if r in caught else set() for r in (0, 1)}
    assert findings(report) == ({0: set(), 1: set()} if native else bf16)
    if os.environ.get("DDPWATCH_SAVE_FIXTURES") == "1":
        shutil.copy(saved, SNAPSHOTS)
    swapped = str(tmp_path / "swapped.json")
    swap_cpu_bf16(saved, swapped, native)
    _, replayed = diagnose(0, "--replay", swapped)
    assert findings(replayed) == (bf16 if native else {0: set(), 1: set()})


# --- a bf16 flag with no effect -----------------------------------------------------------
def test_autocast_for_another_device_is_no_bf16_finding(tmp_path, need_py_spy):
    """The spawn script's forward under torch.autocast("cuda", dtype=bfloat16) on a
    CPU job: autocast's frame is on the stack, the CPU computes in float32. No
    finding, whatever the CPU, even with the flags of a CPU without bf16."""
    tp = start("spawn", str(tmp_path), env={"DDPWATCH_TEST_AUTOCAST": "cuda"})
    saved = os.path.join(tp.tmp, "thirdparty_spawn_autocast_cuda.json")
    try:
        def seen():  # a healthy judgement made on samples that caught the forward
            report = until_verdict(tp.pids[0], HEALTHY, timeout=150, extra=SHORT + (saved,))
            return report if frames_seen(saved, AUTOCAST_FILE) else None
        report = wait_until(seen, 150, interval=0.2, what="a sample inside the forward")
    finally:
        tp.job.kill()
    if os.environ.get("DDPWATCH_SAVE_FIXTURES") == "1":
        shutil.copy(saved, SNAPSHOTS)
    assert report["job"]["culprits"] == []
    assert findings(report) == {0: set(), 1: set()}
    assert not any(r["signals"].get("stack_bf16") for r in report["ranks"])
    swapped = str(tmp_path / "swapped.json")
    swap_cpu_bf16(saved, swapped, cpu_has_bf16())
    _, replayed = diagnose(0, "--replay", swapped)
    assert findings(replayed) == {0: set(), 1: set()}


# --- the pure parts, on made-up stacks ----------------------------------------------------
def _dump(pid: int, frames: list[tuple[str, str, int]], active=False, module="") -> PidStacks:
    text = json.dumps([{"thread_id": 1, "os_thread_id": pid, "thread_name": "MainThread",
                        "active": active, "owns_gil": False, "frames": [
                            {"name": n, "filename": f, "line": line,
                             "short_filename": f.split("site-packages/")[-1],
                             "module": module if not line else ""}
                            for n, f, line in frames]}])
    return PidStacks(pid, "ok", "S", False, parse_dump(text))


SITE = "/venv/lib/python3.11/site-packages/"
BROADCAST = [("broadcast", SITE + "torch/distributed/distributed_c10d.py", 3151),
             ("step", "/home/u/train.py", 40), ("<module>", "/home/u/train.py", 60)]
BACKWARD = [("_engine_run_backward", SITE + "torch/autograd/graph.py", 979),
            ("backward", SITE + "torch/autograd/__init__.py", 395),
            ("step", "/home/u/train.py", 33), ("<module>", "/home/u/train.py", 60)]
BARRIER = [("barrier", SITE + "torch/distributed/distributed_c10d.py", 4800),
           ("<module>", "/home/u/train.py", 62)]


def test_call_site_names_the_collective_and_the_users_lines():
    assert call_site(_dump(1, BROADCAST)) == (
        "broadcast at /home/u/train.py:40 (step) <- /home/u/train.py:60 (<module>)")
    assert call_site(_dump(1, BACKWARD)).startswith("DDP's gradient all-reduce in backward at ")
    assert call_site(_dump(1, BACKWARD, active=True)) is None  # computing its backward


def _rank(rank, dump):
    site = call_site(dump)
    waiting = "ddp_bucket_all_reduce" if "DDP" in site else site.split(" ")[0]
    return {"rank": rank, "pid": 100 + rank, "blocked": True, "state": "S",
            "waiting_in": waiting, "stack_site": site}


@pytest.mark.parametrize("stacks, deviant", [
    ((BACKWARD, BROADCAST), {1}),                     # 2 ranks: outside DDP's gradient sync
    ((BROADCAST, BACKWARD), {0}),
    ((BACKWARD, BACKWARD, BARRIER, BACKWARD), {2}),   # the minority
    ((BARRIER, BARRIER, BARRIER, BACKWARD), {3}),     # ... even in DDP's (more batches)
    ((BARRIER, BROADCAST), set()),                    # a tie without DDP: no guess
])
def test_the_rank_that_left_the_common_path(stacks, deviant):
    ranks = [_rank(i, _dump(100 + i, s)) for i, s in enumerate(stacks)]
    stack_family.link(ranks)
    assert {s["rank"] for s in ranks if s["desync_deviant"]} == deviant
    assert all(f"rank {1 - i}" in ranks[i]["desync_others"] for i in (0, 1))


LIGHTNING = SITE + "lightning/pytorch/"
FIT = [("Trainer.fit", LIGHTNING + "trainer/trainer.py", 584),
       ("main", "/home/u/train.py", 57), ("<module>", "/home/u/train.py", 61)]
MID_EPOCH = [("broadcast", SITE + "torch/distributed/distributed_c10d.py", 3151),
             ("_TrainingEpochLoop._broadcast_sigterm_tensor",
              LIGHTNING + "loops/training_epoch_loop.py", 265),
             ("_TrainingEpochLoop.advance", LIGHTNING + "loops/training_epoch_loop.py", 300),
             ("_TrainingEpochLoop.run", LIGHTNING + "loops/training_epoch_loop.py", 153),
             ("_FitLoop.advance", LIGHTNING + "loops/fit_loop.py", 469),
             ("_FitLoop.run", LIGHTNING + "loops/fit_loop.py", 217)] + FIT
EPOCH_END = [("barrier", SITE + "torch/distributed/distributed_c10d.py", 5356),
             ("ModelCheckpoint.on_train_epoch_end",
              LIGHTNING + "callbacks/model_checkpoint.py", 493),
             ("_call_callback_hooks", LIGHTNING + "trainer/call.py", 228),
             ("_FitLoop.on_advance_end", LIGHTNING + "loops/fit_loop.py", 484),
             ("_FitLoop.run", LIGHTNING + "loops/fit_loop.py", 218)] + FIT


def test_where_in_the_training_loop():
    assert loop_position(_dump(1, MID_EPOCH)) == (
        "in_epoch", "_TrainingEpochLoop.advance (training_epoch_loop.py:300)")
    assert loop_position(_dump(1, EPOCH_END)) == (
        "left_epoch", "ModelCheckpoint.on_train_epoch_end (model_checkpoint.py:493) <- "
                      "_FitLoop.on_advance_end (fit_loop.py:484)")
    assert loop_position(_dump(1, BROADCAST)) is None  # a plain script's loop is its own


@pytest.mark.parametrize("positions, left", [
    (("in_epoch", "left_epoch"), {1}),
    (("left_epoch", "in_epoch", "in_epoch"), {0}),
    (("in_epoch", "in_epoch"), set()),      # both mid-epoch: the other tie-breaks decide
    (("left_epoch", None), set()),          # a rank's place unknown: no guess from it
])
def test_the_rank_out_of_the_loop_is_the_culprit(positions, left):
    ranks = [dict(_rank(i, _dump(100 + i, BARRIER if i % 2 else BROADCAST)),
                  loop_position=p) for i, p in enumerate(positions)]
    stack_family.link(ranks)
    assert {s["rank"] for s in ranks if s["left_loop"]} == left
    assert {s["rank"] for s in ranks if s["desync_deviant"]} == left


def test_bf16_evidence_only_from_frames_that_mean_it():
    autocast = [("decorate_autocast", SITE + "torch/amp/autocast_mode.py", 44)]
    lightning = [("MixedPrecision.optimizer_step",
                  SITE + "lightning/pytorch/plugins/precision/amp.py", 76)]
    accelerate = [("ConvertOutputsToFp32.__call__", SITE + "accelerate/utils/operations.py", 820)]
    assert bf16_evidence(_dump(1, autocast + BACKWARD)) is None  # any device, dtype, enabled
    assert bf16_evidence(_dump(1, BACKWARD + lightning))[1] is False  # device not said
    assert bf16_evidence(_dump(1, autocast + accelerate + BACKWARD)) is not None
    # as `py-spy dump --native` names it (seen 2026-11-24, a bf16 matmul on this CPU)
    lib = SITE + "torch/lib/libtorch_cpu.so"
    kernel = [("at::native::mkldnn_gemm<c10::BFloat16>", lib, 0)]
    what, on_cpu = bf16_evidence(_dump(1, kernel + BACKWARD, module=lib))
    assert on_cpu and "BFloat16" in what
