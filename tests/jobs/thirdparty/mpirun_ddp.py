"""DDP started by Open MPI's mpirun, as HPC sites' PyTorch guides write it (CPU,
Gloo): the rank and world size from mpirun's environment, the store's address
from variables mpirun forwards:

    mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 python mpirun_ddp.py
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
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world_size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    local_rank = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
    dist.init_process_group(
        "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=rank, world_size=world_size)
    announce(rank, local_rank, world_size)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
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
