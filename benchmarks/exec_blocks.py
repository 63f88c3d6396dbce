"""The bundled trainer's step, unmodified (no ddpwatch call), in blocks that take
turns inside one 2-rank job started under `ddpwatch exec`: the in-job figure of
benchmarks/exec_cost.py. Why blocks inside one job: trainer_blocks.py.

The job runs under `ddpwatch exec -- torchrun ...`, so ddpwatch instrumented it
from outside when it called init_process_group (ddpwatch/rank/auto.py). Arms:
* "exec": everything that did: dist.all_reduce is ddpwatch's wrapper, DDP's
  forward is ddpwatch's (gradient-bucket comm hook at the first forward, the
  autocast/dtype check at every one), the optimizer step post-hook counts steps;
* "off" and "off_again": torch's own all_reduce and DDP.forward, no comm hook,
  no optimizer hook. Their ratio is the control, the noise floor.
The step is trainer_blocks.py's (the trainer's), without its ddpwatch.step():
an unmodified script never calls ddpwatch.

    ddpwatch exec -- torchrun --standalone --nproc_per_node=2 benchmarks/exec_blocks.py ROUNDS STEPS OUT
"""
from __future__ import annotations

import sys
import time

from blocks import (WARM_STEPS, pooled_ratios, schedule, trainer_parts, trainer_step,
                    write_result)

ARMS = ("exec", "off", "off_again")


def worker(rounds: int, steps: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.optim.optimizer as optim_mod
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainer.train import no_buffer_sync

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # under ddpwatch exec: instrumented here, from outside
    from ddpwatch.rank import instrumentation
    if not instrumentation.installed() or instrumentation.writer().path is None:
        sys.exit("exec_blocks: not instrumented: run it under `ddpwatch exec`")
    rank, world = dist.get_rank(), dist.get_world_size()
    wrapped = dist.all_reduce
    bare = wrapped.__ddpwatch_original__
    forward = DDP.forward
    bare_forward = forward.__ddpwatch_original__
    hooks = dict(optim_mod._global_optimizer_post_hooks)
    counters = instrumentation.writer().counters
    model, optimizer, batches, tokens = trainer_parts(rank)
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    heartbeats = {arm: 0 for arm in ARMS}
    for arm in schedule(ARMS, rounds):
        on = arm == "exec"
        optim_mod._global_optimizer_post_hooks.clear()
        if on:
            optim_mod._global_optimizer_post_hooks.update(hooks)
        dist.all_reduce = wrapped if on else bare
        DDP.forward = forward if on else bare_forward
        ddp = DDP(model, **no_buffer_sync())  # hooked at its first forward when on
        counted = counters()[1]
        starts = []
        for _ in range(WARM_STEPS + steps + 1):
            starts.append(time.perf_counter())
            trainer_step(ddp, optimizer, batches, world)
        timed = starts[WARM_STEPS:]
        seconds[arm].append((timed[-1] - timed[0]) / steps)
        heartbeats[arm] += counters()[1] - counted
        del ddp
    dist.all_reduce = wrapped
    DDP.forward = forward
    optim_mod._global_optimizer_post_hooks.update(hooks)
    per_step = heartbeats["exec"] / (rounds * (WARM_STEPS + steps + 1))
    if per_step < 2 or heartbeats["off"] or heartbeats["off_again"]:
        sys.exit(f"exec_blocks: heartbeats by arm {heartbeats}: the arms are not what they "
                 f"should be")
    if rank == 0:
        write_result(out_path, tokens * world, steps, seconds, per_step)
    dist.barrier()
    dist.destroy_process_group()


def report(jobs: list[dict], draws: int = 2000) -> dict[str, tuple[float, float, float]]:
    """tokens/s of "exec" over both plain arms, and "off" over "off_again" (the
    control), pooled over jobs (blocks.pooled_ratios)."""
    def ratio_of(t):
        base = (t["off"] + t["off_again"]) / 2
        return {"exec": base / t["exec"], "control": t["off"] / t["off_again"]}
    return pooled_ratios(jobs, ARMS, ratio_of, draws)


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
