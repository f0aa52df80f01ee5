"""Benchmark training loop: blocks of steps with and without per-step metric logging, interleaved.

    python steps.py OUT.json mlflow     # mlflow.log_metric each step (MLFLOW_TRACKING_URI set)
    cascade run steps.py OUT.json cascade

Interleaving on/off blocks in one process measures the logging cost itself, not process noise.
"""

import json
import sys
import time

import torch

import cascade_repro

out, mode = sys.argv[1], sys.argv[2]
blocks, block_steps = 20, 50
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))

if mode == "mlflow":
    import mlflow

    mlflow.start_run()


def log(step: int, loss: float) -> None:
    values = {"loss": loss, "lr": 0.01, "grad": 1.0, "acc": 0.5, "epoch": 0.0}
    if mode == "cascade":
        cascade_repro.log_metrics(values, step=step)
    else:
        mlflow.log_metrics(values, step=step)


step = 0
times = {"off": [], "on": []}
for _ in range(3 * block_steps):  # warm-up
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
for block in range(2 * blocks):
    logging_on = block % 2 == 1
    started = time.perf_counter()
    for _ in range(block_steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if logging_on:
            log(step, loss.item())
        else:
            loss.item()  # the same device sync as the logging branch
        step += 1
    times["on" if logging_on else "off"].append((time.perf_counter() - started) / block_steps)

enqueue_us = None
if mode == "cascade":
    calls = 20000
    values = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0, "e": 5.0}
    started = time.perf_counter()
    for i in range(calls):
        cascade_repro.log_metrics(values, step=i)
    enqueue_us = (time.perf_counter() - started) / calls * 1e6

with open(out, "w") as handle:
    json.dump({"times": times, "enqueue_us": enqueue_us, "logged_steps": step}, handle)
