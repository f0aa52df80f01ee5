"""Fault-injection script: logs known numbers of points and says where it is through marker files.

out/started   written after --early points are flushed, before torch is imported
out/step      the last step whose points are flushed (rewritten every step)
out/hold      written after step --hold-at; the script then sleeps --hold-s seconds (with --hold-while,
              only as long as that file exists: a test that stops the run there removes it before
              the restore's re-run)
out/done      written at the end, after the --bulk points were logged
"""

import argparse
import os
import time
from pathlib import Path

import cascade_repro

cli = argparse.ArgumentParser()
cli.add_argument("--early", type=int, default=0, help="points logged before torch is imported")
cli.add_argument("--steps", type=int, default=10)
cli.add_argument("--step-sleep", type=float, default=0.0)
cli.add_argument("--hold-at", type=int, default=None, help="after this step, write out/hold and sleep")
cli.add_argument("--hold-s", type=float, default=120.0)
cli.add_argument("--hold-while", metavar="FILE", help="hold (up to --hold-s) only while FILE exists")
cli.add_argument("--bulk", type=int, default=0, help="points logged at the end, as fast as possible")
cli.add_argument("--checkpoint", action="store_true", help="save a checkpoint at the end")
cli.add_argument("--read", metavar="FILE", help="read this file first (an input)")
args = cli.parse_args()
if args.read:
    Path(args.read).read_bytes()

out = Path("out")
out.mkdir(exist_ok=True)
for i in range(args.early):
    cascade_repro.log_metrics({"early": float(i)}, step=i)
cascade_repro.flush()
(out / "started").write_text(str(os.getpid()))

import torch  # noqa: E402 - after the start marker on purpose: the parent is still opening the run

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 4)
for step in range(args.steps):
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    cascade_repro.log_metrics({"loss": loss.item()}, step=step)
    cascade_repro.flush()
    (out / "step").write_text(str(step))
    if args.hold_at == step:
        (out / "hold").write_text(str(step))
        held_until = time.monotonic() + args.hold_s
        while time.monotonic() < held_until and (args.hold_while is None or os.path.exists(args.hold_while)):
            time.sleep(0.05)
    time.sleep(args.step_sleep)
for i in range(args.bulk):
    cascade_repro.log_metrics({"bulk": float(i)}, step=i)
if args.checkpoint:
    cascade_repro.checkpoint({"w": torch.randn(256, 256)}, step=args.steps, metrics={"loss": 0.0})
cascade_repro.flush()
print("faults script done", flush=True)
(out / "done").write_text("1")
