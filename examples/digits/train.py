"""Train a small MLP on scikit-learn's bundled digits (8x8 images, no download).

An ordinary PyTorch script: run it with `python train.py` or record it with `cascade run train.py`.
The only cascade calls are params() and log_metrics(); both work without cascade run too.
"""

import argparse
import time

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cascade_repro


def main() -> None:
    hp = cascade_repro.params()
    cli = argparse.ArgumentParser()
    cli.add_argument("--epochs", type=int, default=hp.get("epochs", 20))
    args = cli.parse_args()

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    split = int(len(x) * 0.8)
    train = DataLoader(TensorDataset(x[:split], y[:split]), batch_size=hp["batch_size"], shuffle=True)
    x_val, y_val = x[split:], y[split:]

    model = nn.Sequential(
        nn.Linear(64, hp["model"]["hidden"]),
        nn.ReLU(),
        nn.Dropout(hp["model"]["dropout"]),
        nn.Linear(hp["model"]["hidden"], hp["model"]["hidden"]),
        nn.ReLU(),
        nn.Linear(hp["model"]["hidden"], 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=hp["optimizer"]["lr"], momentum=hp["optimizer"]["momentum"])
    loss_fn = nn.CrossEntropyLoss()

    step = 0
    started = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        for xb, yb in train:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            cascade_repro.log_metrics({"train_loss": loss.item()}, step=step)
            step += 1
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            val_loss = loss_fn(logits, y_val).item()
            val_acc = (logits.argmax(1) == y_val).float().mean().item()
        cascade_repro.log_metrics({"val_loss": val_loss, "val_acc": val_acc, "epoch": epoch}, step=step)
        if (epoch + 1) % 5 == 0:  # the best 3 by val_loss and the last stay; cascade puts them in DVC
            print(f"epoch {epoch:3d}  step {step:5d}  val_loss {val_loss:.4f}  val_acc {val_acc:.4f}")
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}
            cascade_repro.checkpoint(state, step=step, metrics={"val_loss": val_loss}, monitor="val_loss")
    print(f"trained {step} steps in {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
