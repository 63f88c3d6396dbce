"""A nanoGPT-shaped training loop (karpathy/nanoGPT's train.py, cut down): torchrun,
Gloo on CPU, and what makes it a test of judgement over time: the master process
alone evaluates (`estimate_loss` under `torch.no_grad`) every EVAL_INTERVAL
iterations and, with CKPT_MB, saves a checkpoint, while the other ranks wait in the
next step's gradient all-reduce. That is healthy training, not a hang.

    torchrun --nproc_per_node=2 nanogpt_ddp.py

Knobs (environment): DDPWATCH_TEST_EVAL_INTERVAL (iterations, default 100),
DDPWATCH_TEST_EVAL_ITERS (batches per split, default 30), DDPWATCH_TEST_CKPT_MB
(0: no checkpoint; else rank 0 saves one of about that size after each
evaluation), DDPWATCH_TEST_OUT (where), DDPWATCH_TEST_LOADER=1 (batches from a
DataLoader with 2 workers that are not persistent: a pause at each epoch's
start, DDPWATCH_TEST_EPOCH_BATCHES batches an epoch; each worker first works
DDPWATCH_TEST_WORKER_INIT_S seconds, as one that opens its shards or builds an
index does), DDPWATCH_TEST_COMPILE=1 (torch.compile the model before DDP, as
nanoGPT does) with DDPWATCH_TEST_RECOMPILE_AT=N (at iteration N rank 1 alone trains
on half-length sequences: a new shape, a recompile on that rank while rank 0
waits in the gradients' all-reduce). Faults (DDPWATCH_TEST_FAULT, README.md):
`hang:RANK:STEP`, `spin:RANK:STEP` (busy for ever outside any collective, in a
function no pause ran before), `longeval:STEP:FACTOR` (that iteration's
evaluation runs FACTOR times as long as the others). A test that must choose
the moment writes a fault to the file DDPWATCH_TEST_FAULT_FILE instead, read
each iteration (one stat), applied once: `longeval:FACTOR` (the next
evaluation), `spin:RANK`, `lock:RANK` (waits for ever on a lock nobody releases).
"""
import math
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import STEPS, _faults, announce, maybe_hang  # noqa: E402

eval_interval = int(os.environ.get("DDPWATCH_TEST_EVAL_INTERVAL", "100"))
eval_iters = int(os.environ.get("DDPWATCH_TEST_EVAL_ITERS", "30"))
ckpt_mb = int(os.environ.get("DDPWATCH_TEST_CKPT_MB", "0"))
out_dir = os.environ.get("DDPWATCH_TEST_OUT", "/tmp")
block_size, batch_size, vocab_size = 64, 8, 256
n_layer, n_head, n_embd = 2, 4, 64


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False, is_causal=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block() for _ in range(n_layer)])
        self.lm_head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.blocks(self.wte(idx) + self.wpe(pos))
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1))


data = torch.randint(0, vocab_size, (100_000,), generator=torch.Generator().manual_seed(0))


def get_batch(split):
    # nanoGPT reads random windows of train.bin / val.bin; the halves of one tensor here
    lo, hi = (0, 90_000) if split == "train" else (90_000, 100_000)
    ix = torch.randint(lo, hi - block_size - 1, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x, y


class Windows(torch.utils.data.Dataset):
    """The training half as a map-style dataset, for DDPWATCH_TEST_LOADER=1: a
    DataLoader with worker processes that are not persistent, so each epoch
    starts by forking its workers again and waiting for their first batches."""

    def __len__(self):
        return int(os.environ.get("DDPWATCH_TEST_EPOCH_BATCHES", "300")) * batch_size

    def __getitem__(self, i):
        j = (i * 7919) % (90_000 - block_size - 1)
        return data[j:j + block_size], data[j + 1:j + 1 + block_size]


def open_shards(worker_id):
    """worker_init_fn: each worker of each epoch works this long before its first
    batch (DDPWATCH_TEST_WORKER_INIT_S), while its rank waits for it."""
    until = time.monotonic() + float(os.environ.get("DDPWATCH_TEST_WORKER_INIT_S", "0"))
    x = 0
    while time.monotonic() < until:
        x += sum(range(1000))


def batches():
    """Training batches for ever: get_batch's, or a DataLoader's epoch after epoch."""
    if os.environ.get("DDPWATCH_TEST_LOADER") != "1":
        while True:
            yield get_batch("train")
    loader = torch.utils.data.DataLoader(Windows(), batch_size=batch_size, shuffle=True,
                                         num_workers=2, persistent_workers=False,
                                         worker_init_fn=open_shards)
    while True:
        yield from loader


@torch.no_grad()
def estimate_loss(model, iters):
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(iters)
        for k in range(iters):
            X, Y = get_batch(split)
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def spin_forever(rank, step):
    """spin:RANK:STEP - busy for ever, outside any collective, in a place no pause
    of this job ran before."""
    for fault_rank, fault_step in _faults("spin"):
        if rank == fault_rank and step == fault_step:
            print(f"thirdparty: rank {rank} spins at step {step}", flush=True)
            x = 0.0
            while True:
                x = math.sin(x + 1.0)


def eval_factor(step):
    """longeval:STEP:FACTOR - that iteration's evaluation is FACTOR times as long."""
    return max([factor for at, factor in _faults("longeval") if at == step] or [1])


fault_file = os.environ.get("DDPWATCH_TEST_FAULT_FILE", "")
_applied = set()


def file_fault(rank):
    """The fault the test wrote to DDPWATCH_TEST_FAULT_FILE, once per line."""
    if not fault_file or not os.path.exists(fault_file):
        return []
    with open(fault_file) as f:
        lines = [line.strip() for line in f if line.strip()]
    new = [line for line in lines if line not in _applied]
    _applied.update(new)
    return [line.split(":") for line in new]


def wait_on_lock(rank):
    print(f"thirdparty: rank {rank} waits on a lock", flush=True)
    held = threading.Lock()
    held.acquire()
    held.acquire()  # nobody releases it


def spin(rank):
    print(f"thirdparty: rank {rank} spins", flush=True)
    x = 0.0
    while True:
        x = math.sin(x + 1.0)


def main():
    dist.init_process_group(backend="gloo")
    rank = int(os.environ["RANK"])
    master_process = rank == 0
    announce(rank, int(os.environ["LOCAL_RANK"]), dist.get_world_size())
    torch.manual_seed(1337 + rank)
    model = GPT()
    if os.environ.get("DDPWATCH_TEST_COMPILE") == "1":
        model = torch.compile(model)  # nanoGPT compiles, then wraps in DDP
    model = DDP(model)
    recompile_at = int(os.environ.get("DDPWATCH_TEST_RECOMPILE_AT", "-1"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    iter_num, factor = 0, 1
    train_batches = batches()
    while STEPS <= 0 or iter_num < STEPS:
        for fault in file_fault(rank):
            if fault[0] == "longeval":
                factor = int(fault[1])
            elif fault[0] == "spin" and int(fault[1]) == rank:
                spin(rank)
            elif fault[0] == "lock" and int(fault[1]) == rank:
                wait_on_lock(rank)
        # evaluate the loss on train/val sets and write checkpoints (master only)
        if iter_num % eval_interval == 0 and iter_num > 0 and master_process:
            started = time.monotonic()
            factor = max(factor, eval_factor(iter_num))
            if factor > 1:
                print(f"thirdparty: long eval started ({factor}x) at step {iter_num}",
                      flush=True)
            losses = estimate_loss(model, eval_iters * factor)
            factor = 1
            print(f"thirdparty: step {iter_num}: train loss {losses['train']:.4f}, val loss "
                  f"{losses['val']:.4f} ({time.monotonic() - started:.1f}s)", flush=True)
            if ckpt_mb:
                checkpoint = {"model": model.module.state_dict(),
                              "optimizer": optimizer.state_dict(),
                              "ballast": torch.zeros(ckpt_mb * 2 ** 20 // 4),
                              "iter_num": iter_num}
                torch.save(checkpoint, os.path.join(out_dir, f"ckpt-{os.getpid()}.pt"))
        maybe_hang(rank, iter_num)
        spin_forever(rank, iter_num)
        X, Y = next(train_batches)
        if iter_num == recompile_at and rank == 1:
            print(f"thirdparty: rank 1 recompiles at step {iter_num}", flush=True)
            X, Y = X[:, :block_size // 2].contiguous(), Y[:, :block_size // 2].contiguous()
        step_began = time.monotonic()
        _, loss = model(X, Y)
        loss.backward()
        if iter_num == recompile_at and rank == 1:
            print(f"thirdparty: rank 1 recompiled in {time.monotonic() - step_began:.1f}s",
                  flush=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
