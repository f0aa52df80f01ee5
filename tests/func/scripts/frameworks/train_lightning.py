"""A typical Lightning script: Trainer(deterministic=True), ModelCheckpoint (top 3 by val_loss),
MLFlowLogger."""
import argparse

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def main():
    cli = argparse.ArgumentParser()
    cli.add_argument("--epochs", type=int, default=4)
    cli.add_argument("--seed", type=int, default=42)
    args = cli.parse_args()
    L.seed_everything(args.seed)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = x.sum(1, keepdim=True)
    train = DataLoader(TensorDataset(x[:192], y[:192]), batch_size=16, shuffle=True)
    val = DataLoader(TensorDataset(x[192:], y[192:]), batch_size=64)
    checkpoints = ModelCheckpoint(dirpath="checkpoints/lightning", save_top_k=3, monitor="val_loss")
    trainer = L.Trainer(max_epochs=args.epochs, deterministic=True, callbacks=[checkpoints],
                        logger=MLFlowLogger(experiment_name="lightning"), enable_progress_bar=False,
                        accelerator="cpu", devices=1)
    trainer.fit(Regressor(), train, val)
    print("best", checkpoints.best_model_path)


if __name__ == "__main__":
    main()
