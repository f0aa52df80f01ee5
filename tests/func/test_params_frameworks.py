"""Params are what the script used, also where a framework of configuration stands between the command
line and the script: timm's two-stage argparse (a config parser's `parse_known_args`, a YAML file as
the defaults, then the real parser given what is left: defect 6) and Hydra (`@hydra.main` composes a
config from files and overrides; its own command-line flags are not the script's params: defect 7).

Real `cascade run`s in real git repositories with a real MLflow store.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.plugin import Project

pytestmark = pytest.mark.slow

TIMM_STYLE = """\
import argparse

import yaml

config_parser = argparse.ArgumentParser(description="Training Config", add_help=False)
config_parser.add_argument("-c", "--config", default="", type=str)
parser = argparse.ArgumentParser(description="Training")
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--model", default="resnet18")


def _parse_args():
    args_config, remaining = config_parser.parse_known_args()
    if args_config.config:
        with open(args_config.config) as f:
            parser.set_defaults(**yaml.safe_load(f))
    return parser.parse_args(remaining), args_config


args, args_config = _parse_args()
print("used", args.lr, args.epochs, args.model, args_config.config, flush=True)
"""


def _params(project: Project, script: str, text: str, *args: str, run: tuple[str, ...] = (),
            **files: str) -> tuple[dict[str, str], dict]:  # fmt: skip
    """`cascade run SCRIPT ARGS` (or `cascade run RUN`) of `text` with `files`: the run's MLflow params,
    and its record's params section with the output beside them."""
    project.write(script, text)
    for name, content in files.items():
        project.write(name.replace("__", "/"), content)
    project.commit(f"add {script}")
    result = project.cascade("run", *(run or (script, *args)), check=True)
    run = project.runs()[0]
    record = project.manifest(run.info.run_id)["params"]
    return dict(run.data.params), {**record, "output": result.stdout + result.stderr}


def test_timm_style_two_stage_argparse_records_what_the_script_used(project: Project) -> None:
    params, record = _params(project, "timmstyle.py", TIMM_STYLE, "-c", "cfg.yaml", "--lr", "0.02",
                             **{"cfg.yaml": "epochs: 4\nmodel: vit\n"})  # fmt: skip
    assert "used 0.02 4 vit cfg.yaml" in record["output"]
    # The final parse's namespace (the YAML's defaults, the command line over them) and the config
    # parser's: the union, as the script used them.
    assert record["argparse"] == {"config": "cfg.yaml", "lr": 0.02, "epochs": 4, "model": "vit"}
    assert record["values"] == record["argparse"] and record["source"] == "argparse"
    assert params == {"config": "cfg.yaml", "lr": "0.02", "epochs": "4", "model": "vit", "seed": "3"}


HYDRA_APP = """\
import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    print("used", cfg.optimizer.lr, cfg.optimizer.momentum, cfg.train.steps, cfg.seed, flush=True)


if __name__ == "__main__":
    main()
"""

HYDRA_CONFIG = """\
optimizer:
  lr: 0.05
  momentum: 0.9
train:
  steps: 8
  batch: ${optimizer.batch}
seed: 7
"""


@pytest.mark.skipif(importlib.util.find_spec("hydra") is None,
                    reason="hydra-core is a test extra (pip install hydra-core)")  # fmt: skip
def test_a_hydra_app_records_its_composed_config_not_hydras_flags(project: Project) -> None:
    project.write(".gitignore", "mlflow.db\nmlruns/\n.cascade/\nout/\noutputs/\n")
    params, record = _params(project, "app.py", HYDRA_APP, "optimizer.lr=0.01", "+optimizer.batch=16",
                             **{"conf__config.yaml": HYDRA_CONFIG})  # fmt: skip
    assert "used 0.01 0.9 8 7" in record["output"]
    # The config the task function got, overrides and interpolations applied, flattened as cascade
    # flattens its own params; none of Hydra's own flags (config_name, overrides, multirun, ...).
    composed = {"optimizer.lr": 0.01, "optimizer.momentum": 0.9, "optimizer.batch": 16, "train.steps": 8,
                "train.batch": 16, "seed": 7}  # fmt: skip
    assert record["hydra"] == composed and record["values"] == composed
    assert record["source"] == "hydra" and "argparse" not in record
    assert params == {"optimizer.lr": "0.01", "optimizer.momentum": "0.9", "optimizer.batch": "16",
                      "train.steps": "8", "train.batch": "16", "seed": "7",
                      "cascade.seed": "3"}  # the seed cascade applied, beside the app's own  # fmt: skip


LIGHTNING_CLI = """\
import torch
import lightning as L
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        layers = [torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)]
        self.net = torch.nn.Sequential(*layers)

    def training_step(self, batch, index):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        print("used", self.hparams.hidden, self.hparams.lr, flush=True)
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Data(L.LightningDataModule):
    def __init__(self, batch_size: int = 32):
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(128, 8, generator=g), torch.randn(128, 1, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=self.batch_size, shuffle=True)


if __name__ == "__main__":
    LightningCLI(Model, Data, seed_everything_default=42, save_config_callback=None)
"""

FIT_CONFIG = """\
trainer:
  max_epochs: 1
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
model:
  hidden: 32
  lr: 0.05
data:
  batch_size: 16
"""


@pytest.mark.skipif(not all(importlib.util.find_spec(name) for name in ("jsonargparse", "lightning")),
                    reason="lightning and jsonargparse[signatures] are test extras")  # fmt: skip
def test_a_lightning_cli_records_the_config_it_parsed_and_restores_it(project: Project) -> None:
    """LightningCLI's parser (jsonargparse) parses in its own parse_args, never argparse's
    parse_known_args: before, the run recorded no params at all. Run as a module, `-m trainer.cli`."""
    project.write("trainer/__init__.py", "")
    command = ("-m", "trainer.cli", "fit", "--config", "configs/fit.yaml", "--model.lr", "0.02")
    params, record = _params(project, "trainer/cli.py", LIGHTNING_CLI, run=command,
                             **{"configs__fit.yaml": FIT_CONFIG})  # fmt: skip
    assert "used 32 0.02" in record["output"]
    parsed = record["jsonargparse"]
    # the config file merged with the option typed, the subcommand's values at the top, the config
    # file as given (its repr would hold the working directory: a restore's differs)
    assert (parsed["model.lr"], parsed["model.hidden"], parsed["data.batch_size"]) == (0.02, 32, 16)
    assert (parsed["trainer.max_epochs"], parsed["seed_everything"]) == (1, 42)
    assert (parsed["subcommand"], parsed["config"]) == ("fit", ["configs/fit.yaml"])
    assert record["source"] == "jsonargparse" and record["values"] == parsed
    assert (params["model.lr"], params["model.hidden"]) == ("0.02", "32")

    (run,) = project.runs()
    project.cascade("tag", run.info.run_id, "v1", check=True)
    restored = project.cascade("restore", "v1", "--json")
    assert restored.returncode == 0, restored.stderr
    data = json.loads(restored.stdout)["data"]
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", data["verdict"]
    assert project.manifest(data["run"]["run_id"])["params"]["jsonargparse"] == parsed


LIGHTNING_CLI_DICT = LIGHTNING_CLI.replace(
    "    LightningCLI(Model, Data, seed_everything_default=42, save_config_callback=None)",
    """    config = {
        "trainer": {"max_epochs": 1, "logger": False, "enable_checkpointing": False,
                    "enable_progress_bar": False},
        "model": {"hidden": 24, "lr": 0.03},
        "data": {"batch_size": 16},
    }
    cli = LightningCLI(Model, Data, seed_everything_default=42, save_config_callback=None, run=False,
                       args=config)
    cli.trainer.fit(cli.model, cli.datamodule)""",
)


@pytest.mark.skipif(not all(importlib.util.find_spec(name) for name in ("jsonargparse", "lightning")),
                    reason="lightning and jsonargparse[signatures] are test extras")  # fmt: skip
def test_a_lightning_cli_given_its_config_as_a_dict_records_it(project: Project) -> None:
    """`LightningCLI(..., args={...})` (a notebook's, a script's own config) parses the dict with
    jsonargparse's `parse_object`, not `parse_args`: the run recorded `params (none)`."""
    assert "args=config" in LIGHTNING_CLI_DICT
    params, record = _params(project, "cli_dict.py", LIGHTNING_CLI_DICT)
    assert "used 24 0.03" in record["output"]
    parsed = record["jsonargparse"]
    assert (parsed["model.hidden"], parsed["model.lr"], parsed["data.batch_size"]) == (24, 0.03, 16)
    assert (parsed["trainer.max_epochs"], parsed["seed_everything"]) == (1, 42)
    assert record["source"] == "jsonargparse"
    assert (params["model.lr"], params["model.hidden"]) == ("0.03", "24")


HF_EXAMPLE = """\
import sys
from dataclasses import dataclass

from transformers import HfArgumentParser, TrainingArguments


@dataclass
class ModelArguments:
    n_layer: int = 1
    model_type: str = "gpt2"


parser = HfArgumentParser((ModelArguments, TrainingArguments))
if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
    model_args, training_args = parser.parse_json_file(json_file=sys.argv[1])
else:
    model_args, training_args = parser.parse_args_into_dataclasses()
print("used", model_args.n_layer, training_args.learning_rate, flush=True)
"""


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is a test extra")
def test_hf_arguments_from_a_json_file_are_recorded_as_the_script_used_them(project: Project) -> None:
    """The Hugging Face examples' `run_clm.py args.json`: HfArgumentParser makes its dataclasses from
    the file, never parsing a command line. Before, the record held the dataclass's defaults, taken
    from the globals (`ModelArguments.n_layer 1`), where the script used 2 layers."""
    args = '{"output_dir": "out", "n_layer": 2, "learning_rate": 0.003, "report_to": []}'
    params, record = _params(project, "run_lm.py", HF_EXAMPLE, "args.json", **{"args.json": args})

    assert "used 2 0.003" in record["output"]
    parsed = record["argparse"]
    assert (parsed["n_layer"], parsed["model_type"], parsed["learning_rate"]) == (2, "gpt2", 0.003)
    assert parsed["output_dir"] == "out" and record["source"] == "argparse"
    assert "globals" not in record and "ModelArguments.n_layer" not in record["values"]
    assert (params["n_layer"], params["learning_rate"]) == ("2", "0.003")


CLICK_SCRIPT = """\
import click


@click.group()
@click.option("--outdir", default="runs")
def cli(outdir):
    pass


@cli.command()
@click.option("--lr", type=float, default=0.1)
@click.option("--kimg", type=int, default=25)
@click.option("--mirror", is_flag=True)
def train(lr, kimg, mirror):
    print("used", lr, kimg, mirror, flush=True)


@click.command()
@click.option("--depth", default=4)
def other(depth):
    pass


other.main(["--depth", "9"], standalone_mode=False)  # a command given another list: not the script's
cli()
"""


def test_a_click_command_records_the_params_it_parsed(project: Project) -> None:
    """StyleGAN's and EDM's `train.py` are click commands: click parses the command line itself, never
    through argparse. Before, such a run recorded no params but its globals."""
    params, record = _params(project, "train_click.py", CLICK_SCRIPT, "--outdir", "out", "train", "--lr",
                             "0.02", "--mirror")  # fmt: skip
    assert "used 0.02 25 True" in record["output"]
    assert record["click"] == {"outdir": "out", "lr": 0.02, "kimg": 25, "mirror": True}
    assert record["source"] == "click" and record["values"] == record["click"]
    assert (params["lr"], params["kimg"], params["outdir"]) == ("0.02", "25", "out")


FIRE_SCRIPT = """\
import fire


def train(base_model: str = "tiny", learning_rate: float = 3e-4, batch_size: int = 8, **kwargs):
    print("used", base_model, learning_rate, batch_size, kwargs, flush=True)


if __name__ == "__main__":
    fire.Fire(lambda **_: None, command=["--unused", "1"])  # another command line: not the script's
    fire.Fire(train)
"""


@pytest.mark.skipif(importlib.util.find_spec("fire") is None, reason="fire is a test extra")
def test_a_python_fire_script_records_the_arguments_its_function_got(project: Project) -> None:
    """alpaca-lora's and llama-recipes' fine-tuning scripts are `fire.Fire(train)`: Fire parses the
    command line itself. Before, such a run recorded no params but its globals."""
    params, record = _params(project, "finetune.py", FIRE_SCRIPT, "--learning_rate", "0.001", "--lora_r",
                             "16")  # fmt: skip
    assert "used tiny 0.001 8 {'lora_r': 16}" in record["output"]
    # the defaults too, and a **kwargs parameter's items by their names
    assert record["fire"] == {"base_model": "tiny", "learning_rate": 0.001, "batch_size": 8, "lora_r": 16}
    assert record["source"] == "fire" and record["values"] == record["fire"]
    assert (params["learning_rate"], params["lora_r"]) == ("0.001", "16")


TYPER_SCRIPT = """\
import typer


def main(lr: float = 0.1, epochs: int = 3, name: str = "base"):
    print("used", lr, epochs, name, flush=True)


if __name__ == "__main__":
    typer.run(main)
"""


@pytest.mark.skipif(importlib.util.find_spec("typer") is None, reason="typer is a test extra")
def test_a_typer_command_records_the_params_it_parsed(project: Project) -> None:
    """Typer parses with click, from 0.22 on with its own copy of it (`typer._click`): before, such a
    run recorded no params at all."""
    params, record = _params(project, "train_typer.py", TYPER_SCRIPT, "--lr", "0.02", "--name", "x")
    assert "used 0.02 3 x" in record["output"]
    assert record["click"] == {"lr": 0.02, "epochs": 3, "name": "x"}
    assert record["source"] == "click" and (params["lr"], params["epochs"]) == ("0.02", "3")
