"""A tiny seeded training loop (a few optimizer steps): something real for read commands to list."""

import sys

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
lr = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
torch.manual_seed(0)
model = torch.nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=lr)
x, y = torch.randn(32, 16), torch.randint(0, 2, (32,))
for _ in range(steps):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
print(f"loss {loss.item():.4f}")
