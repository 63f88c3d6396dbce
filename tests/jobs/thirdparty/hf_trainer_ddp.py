"""Training with the Hugging Face Trainer, as its docs write it for a custom model:
a `torch.nn.Module` whose forward returns the loss, a `Dataset` of dicts, and
`TrainingArguments`, launched on 2 CPU processes over Gloo:

    torchrun --nproc_per_node=2 --master_port=PORT hf_trainer_ddp.py OUTPUT_DIR

The Trainer wraps the model in DistributedDataParallel itself (ddp_backend gloo)
and runs its own loop; the fault knob (faults.py) runs at each step's start, from
a TrainerCallback. Nothing is downloaded: the model is built here.
"""
import os
import sys

import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import STEPS, announce, maybe_hang  # noqa: E402


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x, labels=None):
        out = self.net(x)
        loss = nn.functional.mse_loss(out, labels) if labels is not None else None
        return {"loss": loss, "logits": out}


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 32, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Faults(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        maybe_hang(int(os.environ.get("RANK", "0")), state.global_step)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "hf-trainer-out"
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=16, max_steps=STEPS if STEPS > 0 else 10**9,
        use_cpu=True, ddp_backend="gloo", report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0)
    announce(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),
             int(os.environ["WORLD_SIZE"]))
    Trainer(model=Regression(), args=args, train_dataset=Pairs(),
            callbacks=[Faults()]).train()


if __name__ == "__main__":
    main()
