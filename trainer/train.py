"""Train a small GPT, with or without torchrun:

    python -m trainer --steps 3                                  # one process, no DDP
    torchrun --standalone --nproc_per_node=2 -m trainer          # DDP over Gloo on CPU

Reads like nanoGPT: the defaults below are the config, each knob is the flag of
the same name (`device_batch_size` is `--device-batch-size`). `--fault` puts the
run into a known-bad state on purpose (faults.py); `--no-ddpwatch` runs it
unwatched, for overhead benchmarks.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import inspect
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from . import data
from . import faults as faultlib
from .dtype import choose_dtype, cpu_flags, cuda_capability, resolve_device
from .model import GPT, GPTConfig, param_breakdown

# -----------------------------------------------------------------------------
# default config values
depth = 2                # layers; width is depth*64 in heads of 64 (nanochat's one knob)
seq_len = 64             # tokens per sequence; tiny so a CPU step takes milliseconds
vocab_size = 512         # small vocabulary keeps embedding and head small; <= 65536 (uint16 shards)
device_batch_size = 4    # sequences per forward per rank (one micro-step)
total_batch_size = None  # tokens per optimizer step over all ranks; None: one micro-step each
steps = 50               # optimizer steps; 0 or less runs until killed (tests want long jobs)
lr = 3e-3                # AdamW learning rate, constant: runs are short, a schedule adds nothing
device_type = "auto"     # cpu | cuda | auto (cuda if torch can use one)
dtype = "auto"           # auto | float32 | bfloat16; dtype.py says what auto picks and why
data_dir = None          # directory of *.bin uint16 token shards; None: a synthetic stream
seed = 1337              # model init and synthetic data; the same on every rank
compile = False          # torch.compile: every rank compiles alone, first steps take long
log_every = 1            # print every Nth step (and the last)
# -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainer", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(faultlib.__doc__.split("\n\n")[1:4]))
    p.add_argument("--depth", type=int, default=depth)
    p.add_argument("--seq-len", type=int, default=seq_len)
    p.add_argument("--vocab-size", type=int, default=vocab_size)
    p.add_argument("--device-batch-size", type=int, default=device_batch_size)
    p.add_argument("--total-batch-size", type=int, default=total_batch_size,
                   help="tokens per optimizer step, all ranks (default: no accumulation)")
    p.add_argument("--steps", type=int, default=steps, help="0 or less: until killed")
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--device-type", choices=("cpu", "cuda", "auto"), default=device_type)
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default=dtype)
    p.add_argument("--data", default=data_dir, metavar="DIR", help="directory of *.bin shards")
    p.add_argument("--seed", type=int, default=seed)
    p.add_argument("--compile", action="store_true", default=compile)
    p.add_argument("--fault", action="append", default=[], metavar="SPEC",
                   help="inject a fault (repeatable; see below)")
    p.add_argument("--no-ddpwatch", action="store_true", help="do not instrument")
    p.add_argument("--log-every", type=int, default=log_every)
    return p


def check_sizes(parser, args, world_size: int) -> int:
    """Validate the shape knobs; return the gradient accumulation steps."""
    for name in ("depth", "seq_len", "device_batch_size", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 2 <= args.vocab_size <= 65536:
        parser.error("--vocab-size must be in 2..65536 (shards hold uint16 tokens)")
    per_micro_step = args.device_batch_size * args.seq_len * world_size
    total = args.total_batch_size or per_micro_step
    if total <= 0 or total % per_micro_step:
        parser.error(f"--total-batch-size {total} is not a positive multiple of "
                     f"device_batch_size*seq_len*world_size = {args.device_batch_size}*"
                     f"{args.seq_len}*{world_size} = {per_micro_step}")
    return total // per_micro_step


def no_buffer_sync() -> dict:
    """DDP's switch for buffer broadcasts before each forward: torch 2.13 renamed
    `broadcast_buffers` to `forward_sync_buffers` and warns about the old name."""
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        return dict(forward_sync_buffers=False)
    return dict(broadcast_buffers=False)


def decide_dtype(args, device: str, local_rank: int, injector, fault_list,
                 world_size: int) -> tuple[str, str, bool]:
    """(compute dtype, why, whether the whole model is cast to bf16). Decided from
    the training device, never from "is there a GPU" (the field's bf16 on a CPU)."""
    compute_dtype, why = choose_dtype(
        args.dtype, device, cpu_flags=cpu_flags() if device == "cpu" else frozenset(),
        cuda_capability=cuda_capability(device, local_rank))
    if not injector.has("bf16"):
        return compute_dtype, why, False
    without = f"without the fault {compute_dtype}: {why}"
    # A whole model in bf16 (the field run) only where every rank is: DDP
    # all-reduces gradients in the parameters' dtype, and a bf16 bucket against
    # an fp32 one aborts Gloo ("Received data size doesn't match expected
    # size"). A lone bf16 rank keeps fp32 weights and computes under autocast.
    cast_to_bf16 = world_size == 1 or any(f.kind == "bf16" and f.rank is None for f in fault_list)
    how = "whole model cast to bf16" if cast_to_bf16 else "autocast, fp32 weights"
    return "bfloat16", f"fault bf16, {how}; {without}", cast_to_bf16


def make_data(parser, args, rank: int, world_size: int, injector):
    """(plan, batches): each rank its own batches; data-mismatch gives one rank other data."""
    mismatch = injector.has("data-mismatch")
    B, T = args.device_batch_size, args.seq_len
    if args.data:
        try:
            plan = data.plan_shards(args.data, rank, world_size, B, T, drop_last_shard=mismatch)
        except OSError as err:
            parser.error(f"--data {args.data}: {err.strerror}")
        except ValueError as err:
            parser.error(f"--data {args.data}: {err}")
        return plan, data.shard_batches(plan.paths, B, T, args.vocab_size)
    data_seed = args.seed + 1 if mismatch else args.seed
    return (data.synthetic_plan(data_seed, args.vocab_size, T),
            data.synthetic_batches(B, T, args.vocab_size, data_seed, rank))


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; without them this is one plain process.
    distributed = "WORLD_SIZE" in os.environ
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # Everything that can be wrong with the command line fails here, on every rank
    # alike, before any rank waits for another.
    try:
        fault_list = faultlib.parse_faults(args.fault)
        faultlib.check_world(fault_list, world_size)
    except faultlib.FaultSpecError as err:
        parser.error(str(err))
    grad_accum = check_sizes(parser, args, world_size)
    try:
        device = resolve_device(args.device_type)
    except ValueError as err:
        parser.error(str(err))
    prefix = f"[rank {rank}] " if distributed else ""

    def log(msg: str) -> None:
        # One write per line: ranks share torchrun's stdout, print() may split a line.
        sys.stdout.write(f"{prefix}{msg}\n")
        sys.stdout.flush()

    injector = faultlib.Injector(fault_list, rank, log)

    compute_dtype, why, cast_to_bf16 = decide_dtype(args, device, local_rank, injector,
                                                    fault_list, world_size)
    B, T = args.device_batch_size, args.seq_len
    plan, batches = make_data(parser, args, rank, world_size, injector)

    watching = not args.no_ddpwatch
    if watching:
        # First, before init_process_group, so rendezvous itself is watched.
        import ddpwatch
        identity = dict(compute_dtype=compute_dtype, data_fingerprint=plan.fingerprint,
                        data_batches=plan.batches, data_shards=plan.shards,
                        device_type=device)
        if not distributed:  # torchrun runs let ddpwatch learn rank and world itself
            identity.update(rank=0, local_rank=0, world_size=1)
        heartbeat = ddpwatch.instrument(auto_steps=False, **identity)

    if distributed:
        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend)
        # Every rank parses the same faults, so every rank creates this group.
        if any(f.kind == "desync" for f in fault_list):
            injector.desync_group = dist.new_group()

    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP checks shapes)
    config = GPTConfig.from_depth(args.depth, vocab_size=args.vocab_size, seq_len=T)
    raw_model = GPT(config).to(device)
    if cast_to_bf16:
        raw_model.to(torch.bfloat16)
    counts = param_breakdown(raw_model)
    model = torch.compile(raw_model) if args.compile else raw_model
    if distributed:
        # Rotary tables are buffers but equal on every rank: no broadcast per forward.
        model = DDP(model, device_ids=[local_rank] if device == "cuda" else None,
                    **no_buffer_sync())
        if watching:
            ddpwatch.instrument(model=model)  # hook the gradient buckets now
    optimizer = torch.optim.AdamW(raw_model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.0)
    autocast_on = compute_dtype == "bfloat16" and not cast_to_bf16
    amp = (torch.autocast(device_type=device, dtype=torch.bfloat16) if autocast_on
           else contextlib.nullcontext())

    log(f"model: depth {config.n_layer}, n_embd {config.n_embd}, n_head {config.n_head}, "
        f"seq_len {config.seq_len}, vocab {config.vocab_size}")
    log("parameters: {:,} = ".format(counts["total"]) + " + ".join(
        f"{kind} {n:,}" for kind, n in counts.items() if kind != "total"))
    log(f"compute dtype: {compute_dtype} ({why})")
    tokens_per_rank_step = B * T * grad_accum
    tokens_per_step = tokens_per_rank_step * world_size
    log(f"device: {device}, world size {world_size}"
        + (f" ({dist.get_backend()})" if distributed else " (no process group)")
        + f", grad accum steps {grad_accum}, {tokens_per_step} tokens per step")
    log(f"data: {plan.description}, fingerprint {plan.fingerprint}")
    if watching:
        from ddpwatch.rank import instrumentation
        counters = instrumentation.writer().counters
        log(f"ddpwatch: heartbeats in {heartbeat.path or 'nowhere (writer off)'}")
    else:
        log("ddpwatch: off (--no-ddpwatch)")
    for fault in injector.faults:
        log(f"fault armed: {fault.spec}")

    step, left_early = 0, ""
    timed_tokens, timed_seconds = 0, 0.0
    compute_seconds = None  # this rank's last forward+backward time (for slow faults)
    endless = args.steps <= 0
    while endless or step < args.steps:
        t0 = time.perf_counter()
        coll0 = counters() if watching else None
        if injector.before_step(step, compute_seconds) == "exit":  # --fault, faults.py
            left_early = "fault exit"
            break
        t_compute = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        for micro_step in range(grad_accum):
            batch = next(batches, None)
            if batch is None:
                left_early = f"out of data ({plan.batches} batches in {plan.shards} shard(s))"
                break
            batch = batch.to(device)
            x, y = batch[:, :-1], batch[:, 1:]
            last = micro_step == grad_accum - 1
            # in DDP we only sync gradients at the last micro step
            sync = model.no_sync() if distributed and not last else contextlib.nullcontext()
            with sync:
                with amp:
                    loss = model(x, y)
                (loss / grad_accum).backward()
            loss_sum += loss.detach().float()
        if left_early:
            break
        compute_seconds = time.perf_counter() - t_compute
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # The loss for the log, averaged over ranks: a plain collective outside DDP.
        loss_avg = loss_sum / grad_accum
        if distributed:
            dist.all_reduce(loss_avg)  # SUM: Gloo has no AVG
            loss_avg /= world_size
        loss_value = loss_avg.item()
        dt = time.perf_counter() - t0
        if watching:
            ddpwatch.step(tokens=tokens_per_rank_step)
            coll_seconds = counters()[0] - coll0[0]
            coll = f"{coll_seconds * 1000:.1f}ms ({100 * coll_seconds / dt:.1f}%)"
        else:
            coll = "n/a"
        if step > 0 or args.steps == 1:  # step 0 is warm-up (allocations, compile)
            timed_tokens += tokens_per_step
            timed_seconds += dt
        if step % args.log_every == 0 or step == args.steps - 1:
            log(f"step {step}/{'inf' if endless else args.steps} | loss {loss_value:.4f} | "
                f"dt {dt * 1000:.1f}ms | tok/s {tokens_per_step / dt:.0f} | coll {coll}")
        step += 1

    if left_early:
        log(f"leaving the training loop at step {step}: {left_early}")
    mean = timed_tokens / timed_seconds if timed_seconds else 0.0
    log(f"done: steps={step} tokens={step * tokens_per_step} mean tok/s={mean:.0f}")
    if distributed:
        # Wait for the peers. A rank that left early waits here while they sit in
        # all-reduce: the field's "one node had 201 shards, the other 4".
        dist.barrier()
        # Drop DDP (its reducer holds the comm hook and the group) before the
        # group itself: the other order sometimes aborted the process at exit
        # ("terminate called without an active exception", 1 run in 10).
        del model, optimizer
        gc.collect()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
