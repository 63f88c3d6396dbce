"""A plain DDP script for torchrun, as PyTorch's "Fault-tolerant distributed
training with torchrun" tutorial writes it (CPU, Gloo):

    torchrun --nproc_per_node=2 torchrun_ddp.py
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
    dist.init_process_group(backend="gloo")
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    announce(rank, local_rank, dist.get_world_size())
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    while STEPS <= 0 or step < STEPS:
        maybe_hang(rank, step)
        maybe_desync(rank, step)
        x, y = torch.randn(16, 20), torch.randn(16, 1)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
