"""Do completion callbacks on Gloo's threads keep their Python thread state?

    torchrun --nproc_per_node=2 callback_threads.py off|ddp|async

First, by mode: off, nothing; ddp, instrumented DDP steps (the gradient bucket
hook's callbacks run on Gloo's threads); async, instrumented async all-reduces
(asyncwork's callbacks). Then, in every mode, raw all-reduces
(ProcessGroup.allreduce, which ddpwatch does not wrap) whose future runs a
callback of this script's, which marks a threading.local. Where each
callback gets a fresh thread state, it never finds its mark. Prints {"rank",
"mode", "fresh": callbacks that found no mark, "threads": threads they ran on}.
"""
import json
import os
import sys
import threading

import torch
import torch.distributed as dist

mode = sys.argv[1]
if mode != "off":
    import ddpwatch
    ddpwatch.instrument()
dist.init_process_group("gloo")
group = dist.group.WORLD


def train_ddp():  # the model is local: DDP goes before the process group does
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    for _ in range(30):  # enough that both of Gloo's threads run some
        model(torch.randn(8, 64)).sum().backward()


if mode == "ddp":
    train_ddp()
elif mode == "async":
    for _ in range(30):
        dist.all_reduce(torch.ones(4), async_op=True).wait()

local = threading.local()
fresh = []     # callbacks that found no count: a thread state new to this script
threads = set()


def count(fut):
    if not hasattr(local, "seen"):
        local.seen = True
        fresh.append(1)
    threads.add(threading.get_ident())
    return fut.value()


for _ in range(40):
    group.allreduce([torch.ones(4)]).get_future().then(count).wait()
print(json.dumps({"rank": dist.get_rank(), "mode": mode, "fresh": len(fresh),
                  "threads": len(threads)}), flush=True)
# Not a normal exit: Gloo's thread may still be releasing this script's last
# raw callback, and would abort the rank if the interpreter were finalizing by
# then (ddpwatch waits for its own callbacks at exit, not for these).
os._exit(0)
