"""A plain DDP training script with no ddpwatch import: what users run.

    torchrun --nproc_per_node=2 plain_ddp.py [--hang-rank R --at-step S]
             [--desync-rank R] [--exit-rank R] [--dtype bfloat16] [--compute bf16]
             [--slow-rank R --factor F] [--steps N] [--width W] [--batch B]

--dtype bfloat16 is accepted and ignored (a flag with no effect, as in scripts
that parse a dtype and never use it); --compute bf16 really computes in bf16.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=0, help="0: run until killed")
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--desync-rank", type=int, default=-1)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--factor", type=float, default=3.0)
parser.add_argument("--at-step", type=int, default=5)
parser.add_argument("--dtype", default="float32", help="parsed, never used")
parser.add_argument("--compute", default="float32", choices=["float32", "bf16"])
parser.add_argument("--width", type=int, default=256)
parser.add_argument("--batch", type=int, default=64, help="rows a step (1 and a wide model: "
                    "a step all-reduce, little compute)")
parser.add_argument("--compile", action="store_true", help="torch.compile the model")
parser.add_argument("--layers", type=int, default=1, help="hidden layers (compile time grows)")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
dtype = torch.bfloat16 if args.compute == "bf16" else torch.float32
hidden = [m for _ in range(args.layers) for m in (nn.Linear(args.width, args.width), nn.ReLU())]
model = nn.Sequential(*hidden, nn.Linear(args.width, args.width)).to(dtype)
if args.compile:
    model = torch.compile(model)
ddp = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
x = torch.randn(args.batch, args.width, dtype=dtype)
step = 0
print(f"rank {rank} pid {os.getpid()} ready", flush=True)
while args.steps <= 0 or step < args.steps:
    if rank == args.hang_rank and step == args.at_step:
        print(f"rank {rank} hangs outside collectives at step {step}", flush=True)
        while True:
            time.sleep(1)
    if rank == args.desync_rank and step == args.at_step:
        print(f"rank {rank} calls broadcast where its peers all-reduce", flush=True)
        dist.broadcast(torch.zeros(3), src=0)
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = ddp(x).float().pow(2).mean()
    if rank == args.slow_rank:
        extra_until = time.perf_counter() + (args.factor - 1) * 0.02
        while time.perf_counter() < extra_until:
            torch.mm(x.float(), x.float().T)
    loss.backward()
    opt.step()
    loss_t = loss.detach().float().reshape(1)
    dist.all_reduce(loss_t)
    step += 1
    if step % 20 == 0:
        print(f"rank {rank} step {step} loss {loss_t.item():.4f}", flush=True)
dist.barrier()
dist.destroy_process_group()
# A finite run ends without finalizing the interpreter. torch 2.13 sometimes
# aborts a rank right here ("terminate called without an active exception"):
# Gloo's thread still holds a Work whose tensor has a Python object and needs
# the GIL while the interpreter is finalizing (ddpwatch/rank/asyncwork.py;
# benchmarks/exit_aborts.py measures it without ddpwatch). A node whose rank
# aborts never reaches torchrun's exit barrier, and the other node's agent
# then waits out that barrier's 300 s: a launch that trained, failed by its
# teardown (tests/nodes/test_preflight.py runs this with --steps).
sys.stdout.flush()
os._exit(0)
