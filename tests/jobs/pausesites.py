"""A plain DDP script (no ddpwatch import) with the pauses real training loops
have, each at a place a fault can be injected from outside the job: what the
hangs at pause sites look like (docs/judgement-over-time.md "Is anybody
working?").

    torchrun --nproc_per_node=2 pausesites.py --dir DIR [--workers N] [--persistent]
             [--eval-every K] [--ckpt-every K] [--log-to HOST:PORT --log-every K]
             [--steps N]

Every path lives in DIR, so a harness blocks a pause by putting a FIFO where a
file was (os.mkfifo to a temporary name, then os.replace onto the path): an
open() for reading waits for a writer that never comes, one for writing for a
reader (a dead NFS or FUSE mount, a producer that died):

    DIR/data-rank{R}.bin   read by rank R's DataLoader workers in __getitem__
                           (in the main process with --workers 0)
    DIR/val.bin            read by rank 0's estimate_loss (nanoGPT's shape:
                           rank 0 evaluates while the others wait in the next
                           all-reduce)
    DIR/ckpt-rank0.pt      written by rank 0's torch.save, in place

--log-to: rank 0 sends one line per --log-every steps and waits for a one-line
reply (a metrics server; one that accepts and never answers hangs it).
--eval-work S and --ckpt-mb M make the pauses long enough to be seen working.
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True, help="where the data, validation and checkpoint "
                    "files are (created here if absent)")
parser.add_argument("--steps", type=int, default=0, help="0: run until killed")
parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
parser.add_argument("--persistent", action="store_true", help="persistent_workers=True")
parser.add_argument("--items", type=int, default=64, help="items per epoch per rank: "
                    "non-persistent workers are forked again at each epoch's start")
parser.add_argument("--eval-every", type=int, default=0)
parser.add_argument("--eval-work", type=float, default=1.0,
                    help="seconds estimate_loss computes")
parser.add_argument("--ckpt-every", type=int, default=0)
parser.add_argument("--ckpt-mb", type=float, default=8.0, help="size of a checkpoint")
parser.add_argument("--log-to", default="", help="HOST:PORT of a line-based metrics server")
parser.add_argument("--log-every", type=int, default=5)
parser.add_argument("--width", type=int, default=256)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
os.makedirs(args.dir, exist_ok=True)
DATA = os.path.join(args.dir, f"data-rank{rank}.bin")
VAL = os.path.join(args.dir, "val.bin")
CKPT = os.path.join(args.dir, f"ckpt-rank{rank}.pt")
for path in (DATA, VAL):
    if not os.path.exists(path):
        tmp = f"{path}.{rank}.tmp"  # val.bin is every rank's: each writes its own
        with open(tmp, "wb") as f:
            f.write(os.urandom(64 * 1024))
        os.replace(tmp, path)


class Shards(Dataset):
    """Each item is read from the rank's data file, as a dataset that opens its
    shard per item does (a dead mount blocks the read, in the worker)."""

    def __init__(self, path, n, width):
        self.path, self.n, self.width = path, n, width

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with open(self.path, "rb") as f:
            raw = f.read(self.width)
        return torch.tensor(list(raw[:self.width]), dtype=torch.float32) / 255.0


data = Shards(DATA, args.items * world, args.width)
loader = DataLoader(data, batch_size=8, num_workers=args.workers,
                    persistent_workers=args.persistent and args.workers > 0,
                    sampler=DistributedSampler(data, num_replicas=world, rank=rank))
model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(),
                      nn.Linear(args.width, args.width))
ddp = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)


@torch.no_grad()
def estimate_loss():
    """nanoGPT's shape: rank 0 reads held-out data and computes on it."""
    with open(VAL, "rb") as f:
        raw = f.read(args.width)
    x = torch.tensor(list(raw), dtype=torch.float32).repeat(64, 1) / 255.0
    until, loss = time.perf_counter() + args.eval_work, 0.0
    while time.perf_counter() < until:
        loss = model(x).pow(2).mean().item()
    return loss


def save_checkpoint():
    state = {"model": model.state_dict(),
             "pad": torch.zeros(int(args.ckpt_mb * 2 ** 20 / 4))}
    torch.save(state, CKPT)  # in place: a FIFO there blocks the open for writing


def log_metrics(conn, step, loss):
    conn.sendall(f"step={step} loss={loss:.4f}\n".encode())
    reply = b""
    while not reply.endswith(b"\n"):  # a server that never answers blocks here
        chunk = conn.recv(64)
        if not chunk:
            raise ConnectionError("metrics server closed the connection")
        reply += chunk


conn = None
if args.log_to and rank == 0:
    host, _, port = args.log_to.rpartition(":")
    conn = socket.create_connection((host, int(port)))
print(f"rank {rank} pid {os.getpid()} ready", flush=True)
step, epoch = 0, 0
while args.steps <= 0 or step < args.steps:
    loader.sampler.set_epoch(epoch)
    for x in loader:
        opt.zero_grad()
        loss = ddp(x).pow(2).mean()
        loss.backward()
        opt.step()
        step += 1
        print(f"rank {rank} step {step}", flush=True)
        if rank == 0 and args.eval_every and step % args.eval_every == 0:
            estimate_loss()
        if rank == 0 and args.ckpt_every and step % args.ckpt_every == 0:
            save_checkpoint()
        if conn is not None and step % args.log_every == 0:
            log_metrics(conn, step, loss.item())
        if args.steps > 0 and step >= args.steps:
            break
    epoch += 1
dist.destroy_process_group()
