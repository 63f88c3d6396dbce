"""DDP started by hand, one command per rank, as in PyTorch's "Writing
Distributed Applications" and DDP tutorials when run without a launcher:

    python byhand_ddp.py --rank 0 --world-size 2 --init-method tcp://127.0.0.1:29500 &
    python byhand_ddp.py --rank 1 --world-size 2 --init-method tcp://127.0.0.1:29500 &

Nothing of the job is in the processes' exec-time environment (no RANK,
MASTER_ADDR, WORLD_SIZE) and no launcher is their parent. Without
--init-method the script sets MASTER_ADDR/MASTER_PORT in os.environ itself
(the port from --port), as the tutorial's init_process does.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import STEPS, announce, maybe_hang  # noqa: E402


def init_process(rank, size, init_method=None, port=29500, backend="gloo"):
    """Initialize the distributed environment."""
    if init_method is None:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group(backend, rank=rank, world_size=size)
    else:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size)


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def train(rank):
    torch.manual_seed(rank)
    model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(model.parameters(), lr=0.001)
    step = 0
    while STEPS <= 0 or step < STEPS:
        maybe_hang(rank, step)
        optimizer.zero_grad()
        outputs = model(torch.randn(8, 10))
        loss_fn(outputs, torch.randn(8, 5)).backward()
        optimizer.step()
        step += 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--init-method", default=None)
    parser.add_argument("--port", type=int, default=29500)
    args = parser.parse_args()
    init_process(args.rank, args.world_size, args.init_method, args.port)
    announce(args.rank, args.rank, args.world_size)
    train(args.rank)
    dist.destroy_process_group()
