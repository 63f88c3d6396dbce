"""What the in-job block benchmarks share (trainer_blocks.py, exec_blocks.py):
the order of the arms, the bundled trainer's parts and step, the result file,
and the pooled-ratio bootstrap. Why blocks inside one job: trainer_blocks.py."""
from __future__ import annotations

import itertools
import json
import os
import random
import sys
from typing import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # the workers import trainer/ and ddpwatch/ from this checkout
WARM_STEPS = 3  # DDP's first iteration rebuilds buckets; the next ones settle


def schedule(arms: tuple[str, ...], rounds: int) -> list[str]:
    """Each round runs every arm once, rounds cycling through every order."""
    orders = list(itertools.permutations(arms))
    return [arm for r in range(rounds) for arm in orders[r % len(orders)]]


def trainer_parts(rank: int):
    """The bundled trainer's model, optimizer and batches at its default size
    (trainer/train.py), and the tokens of one rank's step."""
    import torch

    from trainer import data
    from trainer.model import GPT, GPTConfig
    from trainer.train import build_parser

    a = build_parser().parse_args([])  # the trainer's defaults
    torch.manual_seed(a.seed)
    model = GPT(GPTConfig.from_depth(a.depth, vocab_size=a.vocab_size, seq_len=a.seq_len))
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95),
                                  weight_decay=0.0)
    batches = data.synthetic_batches(a.device_batch_size, a.seq_len, a.vocab_size, a.seed, rank)
    return model, optimizer, batches, a.device_batch_size * a.seq_len


def trainer_step(ddp, optimizer, batches, world: int) -> None:
    """The trainer's step (grad_accum 1): forward, backward, AdamW step,
    zero_grad, the loss all-reduce (through whatever dist.all_reduce is now)
    and .item()."""
    import torch
    import torch.distributed as dist
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


def write_result(out_path: str, tokens_per_step: int, steps: int, seconds: dict,
                 heartbeats_per_step: float) -> None:
    with open(out_path, "w") as f:
        json.dump({"tokens_per_step": tokens_per_step, "steps": steps, "seconds": seconds,
                   "heartbeats_per_step": heartbeats_per_step}, f)


def pooled_ratios(jobs: list[dict], arms: tuple[str, ...],
                  ratio_of: Callable[[dict], dict[str, float]],
                  draws: int = 2000) -> dict[str, tuple[float, float, float]]:
    """`ratio_of(total seconds by arm)` pooled over every job's rounds, with a 90%
    bootstrap interval that resamples jobs, then rounds inside each (a round:
    one block of each arm). Time per step is the inverse of tokens/s."""
    rng = random.Random(0)

    def ratio(picked):  # picked: [(job, [round indices])]
        t = {arm: 0.0 for arm in arms}
        for job, rounds in picked:
            for r in rounds:
                for arm in arms:
                    t[arm] += job["seconds"][arm][r]
        return ratio_of(t)

    def rounds_of(job):
        return len(job["seconds"][arms[0]])
    point = ratio([(job, range(rounds_of(job))) for job in jobs])
    boot: dict[str, list[float]] = {key: [] for key in point}
    for _ in range(draws):
        picked = []
        for job in rng.choices(jobs, k=len(jobs)):
            n = rounds_of(job)
            picked.append((job, rng.choices(range(n), k=n)))
        for key, value in ratio(picked).items():
            boot[key].append(value)
    out = {}
    for key in point:
        values = sorted(boot[key])
        out[key] = (point[key], values[int(0.05 * draws)], values[int(0.95 * draws)])
    return out


def collect(jobs: int, launch: Callable[[str], object]) -> list[dict]:
    """The result files of `jobs` jobs, each started by `launch(result path)`."""
    import tempfile
    results = []
    for _ in range(jobs):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            launch(out.name)
            results.append(json.load(out))
    return results


def tokens_per_s(results: list[dict], arm: str) -> tuple[float, float]:
    """Mean tokens/s of `arm` and of the two plain arms ("off", "off_again")."""
    import statistics
    seconds = {a: statistics.mean(x for job in results for x in job["seconds"][a])
               for a in (arm, "off", "off_again")}
    tokens = results[0]["tokens_per_step"]
    return tokens / seconds[arm], 2 * tokens / (seconds["off"] + seconds["off_again"])
