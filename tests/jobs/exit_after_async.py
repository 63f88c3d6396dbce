"""An instrumented script that exits the moment its last collective completes.

    torchrun --nproc_per_node=2 exit_after_async.py async|sync|ddp [--plain]

ddpwatch records completion in a callback that torch runs on Gloo's thread, and
that thread needs the GIL once more to release the callback after the waiter
was woken. If the interpreter is finalizing by then, the thread exits inside
C++ and the rank aborts ("terminate called without an active exception").
--plain leaves ddpwatch out (benchmarks/exit_aborts.py compares).
Prints {"rank", "mode", "done": true} just before exiting.
"""
import json
import sys

import torch
import torch.distributed as dist

import ddpwatch

mode = sys.argv[1]
if "--plain" not in sys.argv:
    ddpwatch.instrument()
dist.init_process_group("gloo")
if mode == "async":
    for _ in range(5):
        dist.all_reduce(torch.ones(4), async_op=True).wait()
elif mode == "sync":
    for _ in range(5):
        dist.all_reduce(torch.ones(4))
else:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    for _ in range(3):
        model(torch.randn(4, 16)).sum().backward()
print(json.dumps({"rank": dist.get_rank(), "mode": mode, "done": True}), flush=True)
