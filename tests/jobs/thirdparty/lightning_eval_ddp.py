"""A LightningModule with validation and checkpoints, as Lightning's tutorials
write them: Trainer(strategy="ddp", devices=2, accelerator="cpu") validates every
DDPWATCH_TEST_VAL_EVERY training steps on both ranks (a DistributedSampler
splits the validation set), and ModelCheckpoint saves every
DDPWATCH_TEST_CKPT_EVERY steps from rank 0 while rank 1 waits in Lightning's
barrier. Healthy training, with pauses (benchmarks/soak.py).

    python lightning_eval_ddp.py
"""
import os
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import announce  # noqa: E402

VAL_EVERY = int(os.environ.get("DDPWATCH_TEST_VAL_EVERY", "100"))
CKPT_EVERY = int(os.environ.get("DDPWATCH_TEST_CKPT_EVERY", "200"))


class LitRegressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        # a checkpoint of ~3 MB: a short pause behind the barrier
        self.net = nn.Sequential(nn.Linear(32, 512), nn.ReLU(), nn.Linear(512, 512),
                                 nn.ReLU(), nn.Linear(512, 1))

    def on_train_start(self):
        announce(self.global_rank, self.local_rank, self.trainer.world_size)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.001)


def main():
    L.seed_everything(0)
    train = TensorDataset(torch.randn(100_000, 32), torch.randn(100_000, 1))
    val = TensorDataset(torch.randn(2048, 32), torch.randn(2048, 1))
    out = os.environ.get("DDPWATCH_TEST_OUT", "/tmp")
    trainer = L.Trainer(strategy="ddp", devices=2, accelerator="cpu", max_epochs=-1,
                        val_check_interval=VAL_EVERY, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[ModelCheckpoint(dirpath=os.path.join(out, "lightning-ckpt"),
                                                   every_n_train_steps=CKPT_EVERY,
                                                   save_top_k=1)])
    trainer.fit(LitRegressor(), DataLoader(train, batch_size=16),
                DataLoader(val, batch_size=64))


if __name__ == "__main__":
    main()
