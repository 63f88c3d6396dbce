"""A training loop with Hugging Face Accelerate, as its quick tour writes it:

    accelerate launch --multi_gpu --num_processes=2 --main_process_port=PORT accelerate_ddp.py

(on a CPU-only host --multi_gpu runs torchrun with 2 CPU processes over Gloo).
"""
import os
import sys

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import STEPS, announce, maybe_desync, maybe_hang  # noqa: E402


def main():
    accelerator = Accelerator(cpu=True)
    announce(accelerator.process_index, accelerator.local_process_index, accelerator.num_processes)
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(256, 32), torch.randn(256, 1))
    dataloader = DataLoader(dataset, batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)

    step = 0
    while STEPS <= 0 or step < STEPS:
        for inputs, targets in dataloader:
            maybe_hang(accelerator.process_index, step)
            maybe_desync(accelerator.process_index, step)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            step += 1
            if STEPS > 0 and step >= STEPS:
                break
    accelerator.end_training()


if __name__ == "__main__":
    main()
