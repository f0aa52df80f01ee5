"""A seeded MLP trained for N steps; PERTURB_AT_STEP=K writes one ulp into a weight after step K.

    python perturbed_train.py 1075          # the reference
    PERTURB_AT_STEP=1050 python perturbed_train.py 1075
"""

import os
import sys

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
perturb_at = int(os.environ.get("PERTURB_AT_STEP", "-1"))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Tanh(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(256, 128), torch.randint(0, 10, (256,))
for step in range(steps):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    if step == perturb_at:
        with torch.no_grad():
            weight = model[0].weight.view(-1)
            weight[0] = torch.nextafter(weight[0], torch.tensor(float("inf")))
print(f"loss {loss.item():.6f}")
