"""Unit tests of the trainer's pure parts: fault specs, dtype choice, data plans, model size."""
from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

from trainer import data
from trainer.dtype import choose_dtype, parse_cpu_flags
from trainer.faults import (Fault, FaultSpecError, Injector, check_world, parse_fault,
                            parse_faults)
from trainer.model import GPT, GPTConfig, param_breakdown

NO_FLAGS = frozenset({"avx2", "avx512f"})


# --- faults -------------------------------------------------------------------------
def test_parse_every_kind():
    faults = parse_faults([
        "hang:rank=1:step=20", "hang:rank=0:step=3:secs=2.5", "stop:rank=1:step=5",
        "exit:rank=0:step=7", "slow:rank=1:factor=3", "slow:factor=1.5:step=4",
        "desync:rank=1:step=9", "bf16", "bf16:rank=1", "data-mismatch:rank=0",
    ])
    assert faults == (
        Fault("hang", rank=1, step=20, spec="hang:rank=1:step=20"),
        Fault("hang", rank=0, step=3, secs=2.5, spec="hang:rank=0:step=3:secs=2.5"),
        Fault("stop", rank=1, step=5, spec="stop:rank=1:step=5"),
        Fault("exit", rank=0, step=7, spec="exit:rank=0:step=7"),
        Fault("slow", rank=1, step=0, factor=3.0, spec="slow:rank=1:factor=3"),
        Fault("slow", step=4, factor=1.5, spec="slow:factor=1.5:step=4"),
        Fault("desync", rank=1, step=9, spec="desync:rank=1:step=9"),
        Fault("bf16", spec="bf16"),
        Fault("bf16", rank=1, spec="bf16:rank=1"),
        Fault("data-mismatch", rank=0, spec="data-mismatch:rank=0"),
    )


def test_faults_are_frozen():
    fault = parse_fault("hang:rank=1:step=2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        fault.step = 3


def test_omitted_rank_means_every_rank():
    fault = parse_fault("hang:step=2")
    assert fault.rank is None
    assert fault.applies_to(0) and fault.applies_to(7)
    assert not parse_fault("hang:rank=1:step=2").applies_to(0)


@pytest.mark.parametrize("spec, message", [
    ("xyz", "--fault 'xyz': unknown fault kind 'xyz' (known: hang, stop, exit, slow, "
            "desync, bf16, data-mismatch)"),
    ("", "--fault '': unknown fault kind ''"),
    ("hang:rank=1", "--fault 'hang:rank=1': hang needs step"),
    ("slow:rank=1", "--fault 'slow:rank=1': slow needs factor"),
    ("desync:step=3", "--fault 'desync:step=3': desync needs rank"),
    ("data-mismatch", "--fault 'data-mismatch': data-mismatch needs rank"),
    ("hang:step=2:foo=1", "--fault 'hang:step=2:foo=1': unknown key 'foo' for hang "
                          "(keys: rank, secs, step)"),
    ("bf16:step=2", "--fault 'bf16:step=2': unknown key 'step' for bf16 (keys: rank)"),
    ("hang:rank=a:step=2", "--fault 'hang:rank=a:step=2': rank='a' is not an integer"),
    ("hang:rank=1:step=2.5", "--fault 'hang:rank=1:step=2.5': step='2.5' is not an integer"),
    ("slow:factor=fast", "--fault 'slow:factor=fast': factor='fast' is not a number"),
    ("hang:step=1:secs=inf", "--fault 'hang:step=1:secs=inf': secs='inf' is not a finite"),
    ("hang:step=2:step=3", "--fault 'hang:step=2:step=3': step given twice"),
    ("hang:rank:step=2", "--fault 'hang:rank:step=2': 'rank' is not key=value"),
    ("hang:rank=-1:step=2", "--fault 'hang:rank=-1:step=2': rank must be >= 0"),
    ("hang:step=2:secs=0", "--fault 'hang:step=2:secs=0': secs must be > 0"),
    ("slow:factor=0.5", "--fault 'slow:factor=0.5': factor must be >= 1"),
])
def test_bad_specs_name_the_spec_and_the_problem(spec, message):
    with pytest.raises(FaultSpecError) as err:
        parse_faults(["bf16", spec])
    assert str(err.value).startswith(message)


def test_faults_checked_against_world_size():
    check_world(parse_faults(["hang:rank=1:step=2", "desync:rank=1:step=3"]), 2)
    with pytest.raises(FaultSpecError, match="rank 2 but the world size is 2"):
        check_world(parse_faults(["stop:rank=2:step=1"]), 2)
    with pytest.raises(FaultSpecError, match="desync needs at least 2 ranks"):
        check_world(parse_faults(["desync:rank=0:step=1"]), 1)


def test_injector_keeps_only_this_ranks_faults():
    faults = parse_faults(["exit:rank=1:step=3", "desync:rank=0:step=3", "slow:factor=2:step=5",
                           "slow:rank=1:factor=3:step=6", "bf16:rank=1"])
    rank1 = Injector(faults, rank=1, log=lambda msg: None)
    assert rank1.has("bf16") and not rank1.has("desync")
    assert rank1.at_step_start(2) == set()
    assert rank1.at_step_start(3) == {"exit"}
    assert [rank1.slow_factor(s) for s in (4, 5, 6)] == [1.0, 2.0, 6.0]
    rank0 = Injector(faults, rank=0, log=lambda msg: None)
    assert rank0.at_step_start(3) == {"desync"}
    assert not rank0.has("bf16")


def test_one_call_per_step_does_what_the_faults_say():
    """The training loop asks its faults once per step (Injector.before_step)."""
    import time
    faults = parse_faults(["exit:rank=1:step=3", "slow:rank=1:factor=3:step=1"])
    rank1 = Injector(faults, rank=1, log=lambda msg: None)
    assert rank1.before_step(0, None) == ""
    started = time.perf_counter()
    assert rank1.before_step(1, None) == ""  # nothing timed yet: nothing to burn
    assert rank1.before_step(2, 0.05) == ""  # slow x3: burns 2 x 0.05 s
    assert time.perf_counter() - started >= 0.1
    assert rank1.before_step(3, 0.05) == "exit"


# --- dtype ----------------------------------------------------------------------------
def test_cpu_run_with_a_gpu_in_the_machine_stays_float32():
    # Field report: "COMPUTE_DTYPE: bfloat16 (auto-detected: CUDA SM 89)" on a CPU run.
    dtype, why = choose_dtype("auto", "cpu", cpu_flags=NO_FLAGS, cuda_capability=(8, 9))
    assert dtype == "float32"
    assert "cuda" not in why.lower().replace("auto on cpu", "")
    assert "no avx512_bf16/amx_bf16" in why


def test_cpu_without_bf16_flags():
    assert choose_dtype("auto", "cpu", cpu_flags=NO_FLAGS, cuda_capability=None) == (
        "float32", "auto on cpu: no avx512_bf16/amx_bf16: bf16 would be emulated and "
                   "many times slower")


def test_cpu_with_avx512_bf16_but_no_amx():
    dtype, why = choose_dtype("auto", "cpu", cpu_flags=NO_FLAGS | {"avx512_bf16"},
                              cuda_capability=None)
    assert dtype == "float32"
    assert "avx512_bf16 but no AMX: bf16 is not faster than fp32 here" in why


def test_cpu_with_amx():
    flags = NO_FLAGS | {"avx512_bf16", "amx_bf16", "amx_tile"}
    assert choose_dtype("auto", "cpu", cpu_flags=flags, cuda_capability=None)[0] == "bfloat16"


@pytest.mark.parametrize("capability, expected", [((8, 9), "bfloat16"), ((8, 0), "bfloat16"),
                                                  ((7, 5), "float32"), (None, "float32")])
def test_cuda_by_capability(capability, expected):
    dtype, why = choose_dtype("auto", "cuda", cpu_flags=frozenset(), cuda_capability=capability)
    assert dtype == expected
    if capability:
        assert f"SM {capability[0]}{capability[1]}" in why


@pytest.mark.parametrize("requested", ["float32", "bfloat16"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_requested_dtype_wins(requested, device):
    assert choose_dtype(requested, device, cpu_flags=frozenset(),
                        cuda_capability=(7, 5)) == (requested, "requested")


def test_unknown_dtype_or_device():
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        choose_dtype("fp8", "cpu", cpu_flags=frozenset(), cuda_capability=None)
    with pytest.raises(ValueError, match="unknown device type 'mps'"):
        choose_dtype("auto", "mps", cpu_flags=frozenset(), cuda_capability=None)


def test_parse_cpu_flags():
    text = ("processor\t: 0\nvendor_id\t: GenuineIntel\n"
            "flags\t\t: fpu avx512f avx512_bf16 amx_bf16\nbugs\t\t: spectre_v1\n")
    assert parse_cpu_flags(text) == {"fpu", "avx512f", "avx512_bf16", "amx_bf16"}
    assert parse_cpu_flags("processor : 0\n") == frozenset()


# --- data -------------------------------------------------------------------------------
SHARDS = [("shard_00000.bin", 5122), ("shard_00001.bin", 5122), ("shard_00002.bin", 5122)]


def test_fingerprint_differs_for_different_shard_lists():
    same = data.fingerprint(list(SHARDS), 20)
    assert same == data.fingerprint(SHARDS, 20)
    assert len(same) == 16 and int(same, 16) >= 0
    assert data.fingerprint(SHARDS[:2], 20) != same                       # a missing shard
    assert data.fingerprint(SHARDS[:2] + [("shard_00002.bin", 9)], 20) != same  # other size
    assert data.fingerprint(SHARDS, 19) != same                           # other batch count


def test_synthetic_fingerprint_covers_seed_vocab_and_seq_len():
    base = data.synthetic_fingerprint(1, 512, 64)
    assert base == data.synthetic_fingerprint(1, 512, 64)
    others = {data.synthetic_fingerprint(2, 512, 64), data.synthetic_fingerprint(1, 256, 64),
              data.synthetic_fingerprint(1, 512, 32)}
    assert len(others | {base}) == 4


def test_shard_striding():
    names = [f"s{i}" for i in range(5)]
    assert data.stride(names, 0, 2) == ["s0", "s2", "s4"]
    assert data.stride(names, 1, 2) == ["s1", "s3"]
    assert data.stride(names, 3, 4) == ["s3"]
    assert data.stride(names, 0, 1) == names


def test_batches_in_shard():
    # 2561 tokens: 40 windows of 64 (+1 target), 10 batches of 4.
    assert data.batches_in_shard(2561 * 2, 4, 64) == 10
    assert data.batches_in_shard(2560 * 2, 4, 64) == 9
    assert data.batches_in_shard(0, 4, 64) == 0


def test_shard_plans_and_batches(tmp_path):
    data.write_shards(str(tmp_path), 3, 2561, 512, seed=0)
    rank0 = data.plan_shards(str(tmp_path), 0, 2, 4, 64)
    rank1 = data.plan_shards(str(tmp_path), 1, 2, 4, 64)
    assert [os.path.basename(p) for p in rank0.paths] == ["shard_00000.bin", "shard_00002.bin"]
    assert (rank0.shards, rank0.batches, rank1.shards, rank1.batches) == (2, 20, 1, 10)
    # Unequal batch counts would hang the run at the end of rank 1's data: they differ.
    assert rank0.fingerprint != rank1.fingerprint
    batches = list(data.shard_batches(rank1.paths, 4, 64, 512))
    assert len(batches) == rank1.batches
    assert all(b.shape == (4, 65) and b.dtype == torch.long for b in batches)
    tokens = data.read_shard(rank1.paths[0])
    assert tokens.numel() == 2561 and int(tokens.max()) < 512
    assert torch.equal(batches[1][0], tokens[256:321])  # windows advance by seq_len
    mismatched = data.plan_shards(str(tmp_path), 1, 2, 4, 64, drop_last_shard=True)
    assert mismatched.fingerprint != rank1.fingerprint


def test_shard_tokens_beyond_vocab_are_an_error(tmp_path):
    data.write_shards(str(tmp_path), 1, 600, 512, seed=0)
    plan = data.plan_shards(str(tmp_path), 0, 1, 2, 64)
    with pytest.raises(ValueError, match=">= --vocab-size 100"):
        next(data.shard_batches(plan.paths, 2, 64, 100))


def test_synthetic_batches_are_deterministic_per_rank():
    def first(rank, seed=0):
        return next(data.synthetic_batches(4, 16, 512, seed, rank))
    assert first(0).shape == (4, 17)
    assert torch.equal(first(0), first(0))
    assert not torch.equal(first(0), first(1))
    assert not torch.equal(first(0), first(0, seed=1))


# --- model ------------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_param_breakdown_sums_to_total(depth):
    model = GPT(GPTConfig.from_depth(depth, vocab_size=300, seq_len=16))
    counts = param_breakdown(model)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert sum(n for kind, n in counts.items() if kind != "total") == counts["total"]
    n_embd = depth * 64
    assert counts["embedding"] == counts["lm_head"] == 300 * n_embd  # untied
    assert counts["attention"] == depth * 4 * n_embd ** 2
    assert counts["mlp"] == depth * 8 * n_embd ** 2
    assert counts["norms"] == 0


def test_model_first_loss_is_uniform():
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_depth(1, vocab_size=128, seq_len=8))
    idx = torch.randint(0, 128, (2, 9))
    loss = model(idx[:, :-1], idx[:, 1:])
    assert loss.item() == pytest.approx(math.log(128), rel=1e-5)  # zero-initialised head
    loss.backward()
