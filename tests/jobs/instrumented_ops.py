"""A 2-rank job exercising every kind of collective ddpwatch.instrument() wraps.

Run by tests/instrumented/test_instrumentation.py under torchrun. Prints one JSON line of
what it did so the test can compare with the heartbeat records.
"""
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn

import ddpwatch
import ddpwatch.rank.instrumentation

ddpwatch.instrument()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(256)

dist.all_reduce(t)                                                  # sync
dist.all_reduce(t, async_op=True).wait()                            # async with a future
# (async reduce_scatter_tensor, which also lacks a future on Gloo, is left out: with or
# without ddpwatch it sometimes aborts the process at exit on torch 2.13 -
# "terminate called without an active exception".)
peer = 1 - rank
work = dist.isend(torch.ones(10), peer) if rank == 0 else dist.irecv(torch.zeros(10), peer)
work.wait()   # Gloo's p2p Work has no future (the compatibility path) and is_completed() stays False until wait()
dist.barrier()
objs = [None] * world
dist.all_gather_object(objs, {"rank": rank})                        # inner collectives counted

model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8)),
                                            bucket_cap_mb=0.01)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
params = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"rank": rank, "param_bytes": params, "pid": os.getpid(),
                  "wrapper": type(dist.all_reduce).__name__,
                  "core": type(ddpwatch.rank.instrumentation.writer().core).__name__}), flush=True)
dist.barrier()
dist.destroy_process_group()
