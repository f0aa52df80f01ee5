"""Test script: six checkpoints through cascade_repro.checkpoint (top-k on val_loss) and torch.saves."""

import os
import sys
from pathlib import Path

import torch

import cascade_repro

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 4)
data = Path("data/input.bin")
if data.exists():  # the DVC-tracked input, when the test made one
    x = x + float(data.read_bytes()[0]) / 255
val_losses = [5.0, 3.0, 4.0, 1.0, 2.0, 6.0]
for step, val_loss in enumerate(val_losses):
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    cascade_repro.checkpoint({"model": model.state_dict(), "step": step}, step=step,
                             metrics={"val_loss": val_loss}, monitor="val_loss", save_top_k=3)  # fmt: skip
torch.save(model.state_dict(), "checkpoints/final.pt")
if len(sys.argv) > 1:  # a path outside the repository
    torch.save(model.state_dict(), os.path.join(sys.argv[1], "outside.pt"))
