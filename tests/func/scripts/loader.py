"""Test script: a shuffled DataLoader with worker processes and dropout, seeded only by cascade."""

import torch
from torch.utils.data import DataLoader, TensorDataset

import cascade_repro

hp = cascade_repro.params()
data = TensorDataset(torch.arange(256, dtype=torch.float32).reshape(64, 4) / 256, torch.arange(64) % 2)
loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=2)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=hp["optimizer"]["lr"])
for _epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
