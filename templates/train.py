"""A training script skeleton that cascade can record: `cascade run train.py`."""

import torch

import cascade_repro


def main() -> None:
    hp = cascade_repro.params()  # hyperparameters.yaml + `--set` overrides; seeded already
    model = torch.nn.Linear(10, 1)
    opt = torch.optim.SGD(model.parameters(), lr=hp["optimizer"]["lr"], momentum=hp["optimizer"]["momentum"])
    x, y = torch.randn(256, 10), torch.randn(256, 1)
    for step in range(hp["epochs"] * 10):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        cascade_repro.log_metrics({"loss": loss.item()}, step=step)


if __name__ == "__main__":
    main()
