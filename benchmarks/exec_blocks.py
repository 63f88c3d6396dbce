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

import itertools
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = ("exec", "off", "off_again")
WARM_STEPS = 3


def schedule(rounds: int) -> list[str]:
    orders = list(itertools.permutations(ARMS))
    return [arm for r in range(rounds) for arm in orders[r % len(orders)]]


def worker(rounds: int, steps: int, out_path: str) -> None:
    sys.path.insert(0, REPO)
    import torch
    import torch.distributed as dist
    import torch.optim.optimizer as optim_mod
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainer import data
    from trainer.model import GPT, GPTConfig
    from trainer.train import build_parser, no_buffer_sync

    torch.set_num_threads(1)
    a = build_parser().parse_args([])
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
    torch.manual_seed(a.seed)
    model = GPT(GPTConfig.from_depth(a.depth, vocab_size=a.vocab_size, seq_len=a.seq_len))
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95),
                                  weight_decay=0.0)
    batches = data.synthetic_batches(a.device_batch_size, a.seq_len, a.vocab_size, a.seed, rank)
    tokens = a.device_batch_size * a.seq_len
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    heartbeats = {arm: 0 for arm in ARMS}
    for arm in schedule(rounds):
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
            loss_sum = torch.zeros(())
            batch = next(batches)
            x, y = batch[:, :-1], batch[:, 1:]
            loss = ddp(x, y)
            loss.backward()
            loss_sum += loss.detach().float()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_avg = loss_sum / 1
            dist.all_reduce(loss_avg)
            loss_avg /= world
            loss_avg.item()
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
        with open(out_path, "w") as f:
            json.dump({"tokens_per_step": tokens * world, "steps": steps, "seconds": seconds,
                       "heartbeats_per_step": per_step}, f)
    dist.barrier()
    dist.destroy_process_group()


def report(jobs: list[dict], draws: int = 2000) -> dict[str, tuple[float, float, float]]:
    """tokens/s of "exec" over both plain arms, and "off" over "off_again" (the
    control): ratios of total time pooled over jobs, with a 90% bootstrap interval
    that resamples jobs, then rounds inside each (trainer_blocks.report's method)."""
    import random
    rng = random.Random(0)

    def ratio(picked):
        t = {arm: 0.0 for arm in ARMS}
        for job, rounds in picked:
            for r in rounds:
                for arm in ARMS:
                    t[arm] += job["seconds"][arm][r]
        base = (t["off"] + t["off_again"]) / 2
        return {"exec": base / t["exec"], "control": t["off"] / t["off_again"]}
    point = ratio([(job, range(len(job["seconds"]["exec"]))) for job in jobs])
    boot = {key: [] for key in point}
    for _ in range(draws):
        picked = []
        for job in rng.choices(jobs, k=len(jobs)):
            n = len(job["seconds"]["exec"])
            picked.append((job, rng.choices(range(n), k=n)))
        for key, value in ratio(picked).items():
            boot[key].append(value)
    out = {}
    for key in point:
        values = sorted(boot[key])
        out[key] = (point[key], values[int(0.05 * draws)], values[int(0.95 * draws)])
    return out


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
