"""A typical Accelerate loop: prepare(), backward(), save_state() every 20 steps. With --auto,
ProjectConfiguration names the directories itself (acc/checkpoints/checkpoint_<i>) and keeps the last 2.
Just before each, torch.saves a small marker (the step cascade records for a plain torch.save)."""
import argparse
import os

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--auto", action="store_true")
args = parser.parse_args()
config = ProjectConfiguration(project_dir="acc", automatic_checkpoint_naming=True, total_limit=2)
accelerator = Accelerator(cpu=True, project_config=config if args.auto else None)
torch.manual_seed(0)
x = torch.randn(320, 8)
y = x.sum(1, keepdim=True)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
loader = DataLoader(TensorDataset(x, y), batch_size=16)
model, opt, scheduler, loader = accelerator.prepare(model, opt, scheduler, loader)
step = 0
for _ in range(3):
    for xb, yb in loader:
        opt.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(model(xb), yb))
        opt.step()
        scheduler.step()
        step += 1
        if step % 20 == 0:
            os.makedirs("markers", exist_ok=True)
            torch.save({"step": step}, f"markers/step_{step}.pt")
            print("saved", accelerator.save_state(None if args.auto else f"ckpt/step_{step}"))
