"""A framework's checkpoint is labelled with the step the trace uses (defect 10): the last optimizer
step done when it was saved, numbered from 0 in this run, as a plain `torch.save` is, not the
framework's own count (HF's `global_step`, Lightning's) that is one ahead and, on a resume, absolute.
So `cascade checkout RUN --checkpoint N` finds the checkpoint saved after trace step N. Real `cascade
run`s of the real Hugging Face Trainer and Lightning, tiny models, synthetic data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.plugin import Project

pytestmark = pytest.mark.slow

lightning = pytest.importorskip("lightning", reason="lightning is a test extra (pip install -e '.[dev]')")
transformers = pytest.importorskip("transformers", reason="transformers is a test extra")

HF = """\
import sys

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 32, (16, 8), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


max_steps, resume = int(sys.argv[1]), sys.argv[2:] == ["resume"]
# Two micro-batches per optimizer step: the trace counts optimizer steps, as HF's global_step does.
args = TrainingArguments(output_dir="checkpoints/hf", max_steps=max_steps, save_steps=2,
                         per_device_train_batch_size=2, gradient_accumulation_steps=2, report_to="none",
                         use_cpu=True, save_only_model=True)
model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=1))
trainer = Trainer(model=model, args=args, train_dataset=Tokens())
trainer.train(resume_from_checkpoint=True if resume else None)
torch.save(model.state_dict(), "checkpoints/final.pt")  # labelled by the trace, as ever
"""

LIGHTNING = """\
import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.tuner import Tuner
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, lr=0.01):
        super().__init__()
        self.lr = lr
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


L.seed_everything(1)
x = torch.randn(8, 4)
data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)  # 2 steps an epoch
trainer = L.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                    accelerator="cpu", devices=1, callbacks=[ModelCheckpoint(dirpath="checkpoints/lit",
                    save_top_k=-1, filename="{epoch}-{step}")])
model = Regressor()
# lr_find saves the model before its 3 trial steps (trace steps 0..2), restores it, removes the file.
Tuner(trainer).lr_find(model, data, num_training=3, early_stop_threshold=None)
trainer.fit(model, data)  # trace steps 3..6; Lightning counts this fit's from 1: step=2, step=4
"""


def _checkpoints(project: Project, run_id: str) -> dict[str, dict[str, Any]]:
    shown = json.loads(project.cascade("show", run_id, "--json", check=True).stdout)["data"]
    return {Path(c["path"]).name: c for c in shown["manifest"]["checkpoints"]}


def _trace_steps(project: Project, run_id: str) -> list[int]:
    shown = json.loads(project.cascade("show", run_id, "--trace", "--json", check=True).stdout)["data"]
    return [shown["trace"]["first_step"], shown["trace"]["last_step"]]


def test_hf_trainer_checkpoints_carry_the_trace_step_also_on_resume(project: Project) -> None:
    project.write("train_hf.py", HF)
    project.cascade("init", check=True)  # a DVC cache for the checkpoints
    project.commit("an HF Trainer script, cascade init")

    first = project.record("train_hf.py", "4")
    assert _trace_steps(project, first) == [0, 3]
    steps = {name: c["step"] for name, c in _checkpoints(project, first).items()}
    # checkpoint-2 is written after 2 optimizer steps (trace 0, 1), checkpoint-4 after trace step 3,
    # like the torch.save after training.
    assert steps == {"checkpoint-2": 1, "checkpoint-4": 3, "final.pt": 3}
    taken = project.cascade("checkout", first, "--checkpoint", "1", "--to", str(project.root / "out"))
    assert taken.returncode == 0 and "checkpoints/hf/checkpoint-2" in taken.stderr, taken.stderr

    # A resume from checkpoint-4 takes this run's steps 0 and 1: checkpoint-6 is this run's step 1.
    resumed = project.record("train_hf.py", "6", "resume")
    assert _trace_steps(project, resumed) == [0, 1]
    steps = {name: c["step"] for name, c in _checkpoints(project, resumed).items()}
    assert steps == {"checkpoint-6": 1, "final.pt": 1}


def test_lightning_checkpoints_carry_the_trace_step_and_none_before_the_first(project: Project) -> None:
    project.write("train_lit.py", LIGHTNING)
    project.cascade("init", check=True)
    project.commit("a Lightning script, cascade init")

    run_id = project.record("train_lit.py")
    assert _trace_steps(project, run_id) == [0, 6]
    checkpoints = _checkpoints(project, run_id)
    steps = {name: c["step"] for name, c in checkpoints.items() if not name.startswith(".lr_find")}
    assert steps == {"epoch=0-step=2.ckpt": 4, "epoch=1-step=4.ckpt": 6}
    found = [c for name, c in checkpoints.items() if name.startswith(".lr_find")]
    assert len(found) == 1 and found[0]["step"] is None  # saved before any step
    taken = project.cascade("checkout", run_id, "--checkpoint", "4", "--to", str(project.root / "out"))
    assert taken.returncode == 0 and "epoch=0-step=2.ckpt" in taken.stderr, taken.stderr
