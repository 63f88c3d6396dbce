"""DDP started by SLURM's srun, as cluster sites' PyTorch guides write it (CPU,
Gloo): the rank, world size and local rank from the task's SLURM variables,
the store's address from the environment srun passes on (--export=ALL, its
default):

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 srun -n 2 python srun_ddp.py
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import STEPS, announce, maybe_desync, maybe_hang  # noqa: E402


def main():
    rank, world_size = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    local_rank = int(os.environ["SLURM_LOCALID"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)  # env:// store
    announce(rank, local_rank, world_size)
    torch.manual_seed(1234 + rank)
    model = DDP(nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = 0
    while STEPS <= 0 or step < STEPS:
        maybe_hang(rank, step)
        maybe_desync(rank, step)
        x = torch.randn(32, 32)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
