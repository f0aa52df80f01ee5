"""Test script: weights updated by hand, no torch.optim; dropout uses the torch RNG."""

import torch

import cascade_repro

hp = cascade_repro.params()
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
x = torch.randn(32, 8)
y = x.sum(dim=1, keepdim=True)
for step in range(hp["steps"]):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= hp["optimizer"]["lr"] * p.grad
            p.grad = None
    cascade_repro.log_metrics({"loss": loss.item()}, step=step)
