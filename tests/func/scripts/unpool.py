"""Test training script that uses an op torch flags as nondeterministic on CPU (max_unpool2d)."""

import torch

conv = torch.nn.Conv2d(1, 2, 3, padding=1)
opt = torch.optim.SGD(conv.parameters(), lr=0.1)
x = torch.randn(4, 1, 8, 8)
for _ in range(5):
    opt.zero_grad()
    pooled, indices = torch.nn.functional.max_pool2d(conv(x), 2, return_indices=True)
    loss = torch.nn.functional.max_unpool2d(pooled, indices, 2).square().mean()
    loss.backward()
    opt.step()
print("trained")
