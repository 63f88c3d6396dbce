"""Lightning with a DataLoader that reads files and a validation loop, as
tests/jobs/pausesites.py is for a plain script: every pause at a path a harness
can block from outside (a FIFO where a file was).

    python pausesites_lightning.py --dir DIR [--workers N] [--val-every K]

    DIR/data-rank{R}.bin   read per item by rank R's training DataLoader workers
    DIR/val-rank{R}.bin    read per item by rank R's validation DataLoader (in the
                           rank: no workers), inside Lightning's evaluation loop

Trainer(strategy="ddp", devices=2, accelerator="cpu"): Lightning's rank 0 is this
process, which re-executes the script for rank 1. Each rank prints `rank R pid P
ready` once training starts and `rank R step S` at each step.
"""
import argparse
import os

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True)
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--val-every", type=int, default=5, help="training steps between "
                    "validations")
parser.add_argument("--steps", type=int, default=-1, help="-1: train until killed")
parser.add_argument("--items", type=int, default=64, help="training items per rank and epoch")
args = parser.parse_args()
WIDTH = 64


class Shards(Dataset):
    """Each item read from the rank's file, as a dataset opening its shard per
    item does: a mount that stalls blocks the read where it happens."""

    def __init__(self, path, n):
        self.path, self.n = path, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with open(self.path, "rb") as f:
            raw = f.read(WIDTH)
        x = torch.tensor(list(raw), dtype=torch.float32) / 255.0
        return x, x.sum(dim=0, keepdim=True)


class LitRegressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(WIDTH, 256), nn.ReLU(), nn.Linear(256, 1))

    def setup(self, stage):
        os.makedirs(args.dir, exist_ok=True)
        for name in (f"data-rank{self.global_rank}.bin", f"val-rank{self.global_rank}.bin"):
            path = os.path.join(args.dir, name)
            if not os.path.exists(path):
                with open(path + ".tmp", "wb") as f:
                    f.write(os.urandom(64 * 1024))
                os.replace(path + ".tmp", path)

    def train_dataloader(self):
        data = Shards(os.path.join(args.dir, f"data-rank{self.global_rank}.bin"),
                      args.items * self.trainer.world_size)
        return DataLoader(data, batch_size=8, num_workers=args.workers)

    def val_dataloader(self):
        return DataLoader(Shards(os.path.join(args.dir, f"val-rank{self.global_rank}.bin"),
                                 32 * self.trainer.world_size), batch_size=8)

    def on_train_start(self):
        print(f"rank {self.global_rank} pid {os.getpid()} ready", flush=True)

    def training_step(self, batch, batch_idx):
        x, y = batch
        print(f"rank {self.global_rank} step {self.global_step + 1}", flush=True)
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.001)


def main():
    L.seed_everything(0)
    trainer = L.Trainer(strategy="ddp", devices=2, accelerator="cpu", max_epochs=-1, max_steps=args.steps,
                        val_check_interval=args.val_every, check_val_every_n_epoch=None,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, num_sanity_val_steps=0)
    trainer.fit(LitRegressor())


if __name__ == "__main__":
    main()
