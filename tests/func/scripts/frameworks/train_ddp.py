"""A plain DDP script as torchrun runs it: gloo on CPU, each rank its shard of synthetic data.

torchrun --nproc-per-node 2 train_ddp.py --steps 6
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--seed", type=int, default=1234)
args = parser.parse_args()

backend = "nccl" if torch.cuda.is_available() and os.environ.get("DDP_BACKEND") != "gloo" else "gloo"
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(args.seed)  # the same initial weights on every rank
layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
model = DistributedDataParallel(layers)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
data = torch.Generator().manual_seed(args.seed)
inputs, targets = torch.randn(64 * world, 8, generator=data), torch.randn(64 * world, 1, generator=data)
skew = float(os.environ.get("DDP_SKEW", "0"))  # tests: rank 1's data alone changed
if rank == 1:
    inputs = inputs + skew
dataset = torch.utils.data.TensorDataset(inputs, targets)
sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)  # each rank its own shard
loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
step = 0
while step < args.steps:
    sampler.set_epoch(step)
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if str(rank) == os.environ.get("DDP_FAIL_RANK") and step == 1:  # tests: one rank crashes
            raise RuntimeError(f"rank {rank} gave up at step {step}")
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}")
        step += 1
        if step == args.steps:
            break
dist.destroy_process_group()
print(f"rank {rank} of {world} done")
