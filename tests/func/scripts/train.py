"""Test training script: a tiny MLP whose behaviour the tests choose through arguments."""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

import cascade_repro

cli = argparse.ArgumentParser()
cli.add_argument("--crash", action="store_true", help="raise after logging half the steps")
cli.add_argument("--exit", type=int, default=None, help="sys.exit with this code at the end")
cli.add_argument("--hang", action="store_true", help="after logging, write out/ready and sleep")
cli.add_argument("--mlflow", action="store_true", help="also log through mlflow's own API")
cli.add_argument("--points", type=int, default=0, help="log this many extra points quickly")
args, unknown = cli.parse_known_args()

hp = cascade_repro.params()
out = Path("out")
out.mkdir(exist_ok=True)
(out / "seen.json").write_text(
    json.dumps(
        {
            "params": hp,
            "argv": sys.argv[1:],
            "unknown": unknown,
            "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
            "torch_initial_seed": torch.initial_seed(),
            "mlflow_tracking_uri": os.environ.get("MLFLOW_TRACKING_URI"),
        }
    )
)

model = torch.nn.Sequential(
    torch.nn.Linear(8, hp["model"]["hidden"]), torch.nn.Tanh(), torch.nn.Linear(hp["model"]["hidden"], 1)
)
opt = torch.optim.SGD(model.parameters(), lr=hp["optimizer"]["lr"], momentum=hp["optimizer"]["momentum"])
x = torch.randn(64, 8)
y = x.sum(dim=1, keepdim=True)
losses = []
for step in range(hp["steps"]):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    # Not allow-listed: recorded because the script reads them; the secret-looking one is redacted.
    if str(step) in (os.environ.get("PERTURB_AT_STEP"), os.environ.get("PERTURB_SECRET_STEP")):
        with torch.no_grad():
            weight = model[0].weight.view(-1)
            weight[0] = torch.nextafter(weight[0], torch.tensor(float("inf")))
    losses.append(loss.item())
    cascade_repro.log_metrics({"loss": loss.item(), "lr": hp["optimizer"]["lr"]}, step=step)
    if args.crash and step == hp["steps"] // 2:
        raise RuntimeError("boom at half time")

for i in range(args.points):
    cascade_repro.log_metrics({"extra": float(i)}, step=i)

if args.mlflow:
    import mlflow

    mlflow.log_metric("from_mlflow", 42.0, step=1)
    mlflow.log_param("from_mlflow_param", "yes")

(out / "losses.json").write_text(json.dumps(losses))
print(f"trained {len(losses)} steps", flush=True)
if args.hang:
    cascade_repro.flush()
    (out / "ready").write_text("1")
    time.sleep(120)
if args.exit is not None:
    sys.exit(args.exit)
