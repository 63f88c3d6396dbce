"""The bundled trainer's step, instrumented and not, in blocks that take turns
inside one 2-rank job: the trainer figure of benchmarks/heartbeat.py.

Why inside one job: separate runs of the trainer differ by 5-10% in tokens/s
on a 2-core VM, in phases of several runs (scheduling, memory layout, the
host's neighbours), so 60 rounds of separate runs resolve about +-1.2%, not the
1% the target is about. Blocks a second apart in the same processes share all
of that; only what watching changes differs between them.

What differs, arm by arm (everything ddpwatch.instrument() does to a trainer):
* "on": dist.all_reduce is ddpwatch's wrapper (the trainer's loss all-reduce),
  DDP carries ddpwatch's gradient-bucket comm hook, the optimizer step post-hook
  is registered, and each step ends with ddpwatch.step() and the trainer's two
  counters() reads for its log line;
* "off" and "off_again": torch's own all_reduce, DDP's built-in C++ all-reduce,
  no optimizer hook, no heartbeat. Two identical arms: their ratio is the
  control, the noise floor of this very measurement;
* "torch_python_hook": "off" with torch's own Python all-reduce comm hook
  (default_hooks.allreduce_hook). A Python hook must return a future whose
  value is a Python object, so torch runs a Python callback on Gloo's thread
  for every bucket: this arm is what any Python comm hook costs, the floor of
  ddpwatch's bucket heartbeats (without a hook, DDP's own buckets are invisible).
Every block builds a fresh DDP around the same model (torch removes the old
reducer's autograd hooks), so both arms train the same parameters; its first
steps (DDP rebuilds its buckets after the first) are not timed. A step is timed
from its start to the next one's, so everything the arm does counts.

The step is the trainer's (trainer/train.py): forward, backward, AdamW step,
zero_grad, the loss all-reduce and .item(), at the trainer's default size.
Rounds run the three arms in every order in turn (benchmarks/pairs.py).

    torchrun --standalone --nproc_per_node=2 benchmarks/trainer_blocks.py ROUNDS STEPS OUT
"""
from __future__ import annotations

import sys
import time

from blocks import (WARM_STEPS, pooled_ratios, schedule, trainer_parts, trainer_step,
                    write_result)

ARMS = ("on", "off", "off_again", "torch_python_hook")


def worker(rounds: int, steps: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.optim.optimizer as optim_mod
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ddpwatch
    from ddpwatch.rank import instrumentation
    from trainer.train import no_buffer_sync

    torch.set_num_threads(1)
    ddpwatch.instrument(auto_steps=False)  # as the trainer: before init_process_group
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    wrapped = dist.all_reduce
    bare = wrapped.__ddpwatch_original__
    hooks = dict(optim_mod._global_optimizer_post_hooks)  # ddpwatch's step post-hook
    counters = instrumentation.writer().counters
    model, optimizer, batches, tokens = trainer_parts(rank)
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    heartbeats = {arm: 0 for arm in ARMS}  # collectives the record counted, by arm
    for arm in schedule(ARMS, rounds):
        on = arm == "on"
        optim_mod._global_optimizer_post_hooks.clear()
        if on:
            optim_mod._global_optimizer_post_hooks.update(hooks)
        dist.all_reduce = wrapped if on else bare
        ddp = DDP(model, **no_buffer_sync())
        if on:
            ddpwatch.instrument(model=ddp)  # the bucket hook, as the trainer does
        else:  # keep ddpwatch's patched forward from hooking it at its first forward
            ddp.__dict__.update(_ddpwatch_seen=True, _ddpwatch_hooked=True)
        if arm == "torch_python_hook":
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        counted = counters()[1]
        starts = []
        for _ in range(WARM_STEPS + steps + 1):
            starts.append(time.perf_counter())
            if on:
                coll0 = counters()
            trainer_step(ddp, optimizer, batches, world)
            if on:  # the trainer's heartbeat, and its log line's collective seconds
                ddpwatch.step(tokens=tokens)
                coll_seconds = counters()[0] - coll0[0]  # noqa: F841
        timed = starts[WARM_STEPS:]
        seconds[arm].append((timed[-1] - timed[0]) / steps)  # mean step time of the block
        heartbeats[arm] += counters()[1] - counted
        del ddp
    dist.all_reduce = wrapped
    optim_mod._global_optimizer_post_hooks.update(hooks)
    # The arms are what they say: every step of "on" wrote heartbeats for its loss
    # all-reduce and its gradient bucket(s); "off" none.
    per_step = heartbeats["on"] / (rounds * (WARM_STEPS + steps + 1))
    if per_step < 2 or any(heartbeats[arm] for arm in ARMS if arm != "on"):
        sys.exit(f"trainer_blocks: heartbeats by arm {heartbeats}: the arms are not what "
                 f"they should be")
    if rank == 0:
        write_result(out_path, tokens * world, steps, seconds, per_step)
    dist.barrier()
    dist.destroy_process_group()


def report(jobs: list[dict], draws: int = 2000) -> dict[str, tuple[float, float, float]]:
    """tokens/s of "on" and "torch_python_hook" over both uninstrumented arms, and
    of "off" over "off_again" (the control), pooled over jobs (blocks.pooled_ratios)."""
    def ratio_of(t):  # a slower "on" gives a ratio < 1
        base = (t["off"] + t["off_again"]) / 2
        return {"on": base / t["on"], "control": t["off"] / t["off_again"],
                "torch_python_hook": base / t["torch_python_hook"]}
    return pooled_ratios(jobs, ARMS, ratio_of, draws)


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
