"""DDP with torch.multiprocessing.spawn, as PyTorch's "Getting Started with
Distributed Data Parallel" tutorial writes it (CPU, Gloo), with a
DistributedSampler as its multi-GPU training series does."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import (STEPS, announce, autocast_forward, extra_samples, maybe_desync,  # noqa: E402
                    maybe_hang)


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ.setdefault("MASTER_PORT", "12355")
    # initialize the process group
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size):
    setup(rank, world_size)
    announce(rank, rank, world_size)
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(64 + extra_samples(rank), 10), torch.randn(64 + extra_samples(rank), 5))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)

    # create model and move it to GPU with id rank (here: CPU)
    model = autocast_forward(ToyModel())
    ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    step, epoch = 0, 0
    while STEPS <= 0 or step < STEPS:
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            maybe_hang(rank, step)
            maybe_desync(rank, step)
            optimizer.zero_grad()
            outputs = ddp_model(inputs)
            loss_fn(outputs, labels).backward()
            optimizer.step()
            step += 1
            if STEPS > 0 and step >= STEPS:
                break
        epoch += 1
    cleanup()


def run_demo(demo_fn, world_size):
    mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)


if __name__ == "__main__":
    run_demo(demo_basic, 2)
