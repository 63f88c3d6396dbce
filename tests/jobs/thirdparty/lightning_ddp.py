"""A LightningModule trained with Trainer(strategy="ddp", devices=2,
accelerator="cpu"), as Lightning's tutorials write it. Lightning runs this file
as rank 0 and re-executes it for rank 1 (LOCAL_RANK=1).

    python lightning_ddp.py            DDPWATCH_TEST_PRECISION=bf16-mixed for autocast

With DDPWATCH_TEST_FAULT=uneven:RANK it checkpoints at each epoch's end, as a
default Trainer does (ModelCheckpoint under DDPWATCH_TEST_OUT): the rank that ran
out of data waits there, in its epoch-end collective.
"""
import os
import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import (STEPS, announce, extra_samples, maybe_desync, maybe_hang,  # noqa: E402
                    uneven_ranks)


class LitRegressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def on_train_start(self):
        announce(self.global_rank, self.local_rank, self.trainer.world_size)

    def training_step(self, batch, batch_idx):
        maybe_hang(self.global_rank, self.global_step)
        maybe_desync(self.global_rank, self.global_step)
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        return loss

    def on_train_epoch_end(self):
        # Before ModelCheckpoint's own epoch-end hook (Lightning calls the module's
        # first), where the rank that ran out then waits: the line a harness waits
        # for (benchmarks/faults.yaml uneven-data)
        if self.global_rank in uneven_ranks():
            print(f"thirdparty: rank {self.global_rank} out of data at step "
                  f"{self.global_step}", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    L.seed_everything(0)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    n = 256 + extra_samples(rank)
    short = uneven_ranks()
    if rank in short:
        n //= 2  # a DistributedSampler gives it 4 batches of 16 to its peer's 8
    dataset = TensorDataset(torch.randn(n, 32), torch.randn(n, 1))
    trainer = L.Trainer(strategy="ddp", devices=2, accelerator="cpu",
                        precision=os.environ.get("DDPWATCH_TEST_PRECISION", "32-true"),
                        max_steps=STEPS if STEPS > 0 else -1, max_epochs=-1,
                        logger=False, enable_checkpointing=bool(short),
                        default_root_dir=os.environ.get("DDPWATCH_TEST_OUT", "/tmp"),
                        enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(LitRegressor(), DataLoader(dataset, batch_size=16))


if __name__ == "__main__":
    main()
