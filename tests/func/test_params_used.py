"""Params are what the script used (issue 14, item 2): the params file only when the script read it,
its parsed argparse namespace, and what it logged to MLflow itself, nothing dropped or shadowed.

Each test drives the real `cascade run` in a real git repository with a real MLflow store.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.plugin import Project, git

pytestmark = pytest.mark.slow

ARGPARSE_ONLY = """\
import argparse
from pathlib import Path

cli = argparse.ArgumentParser()
cli.add_argument("--lr", type=float, default=0.1)
cli.add_argument("--batch-size", type=int, default=64)
cli.add_argument("--epochs", type=int, default=5)
cli.add_argument("--amp", action="store_true")
cli.add_argument("--layers", type=int, nargs="+", default=[8, 8])
cli.add_argument("--out", type=Path, default=Path("out"))
args = cli.parse_args()
# Parsers of other lists are not the script's configuration.
other = argparse.ArgumentParser()
other.add_argument("--inner", default="x")
other.parse_args(["--inner", "y"])
print("lr", args.lr, "batch", args.batch_size, flush=True)
"""

FILE_ONLY = """\
import cascade_repro

hp = cascade_repro.params()
print("lr", hp["optimizer"]["lr"], flush=True)
"""

BOTH = """\
import argparse

import cascade_repro

hp = cascade_repro.params()
cli = argparse.ArgumentParser()
cli.add_argument("--steps", type=int, default=hp["steps"])  # the file has `steps` too
cli.add_argument("--width", type=int, default=4)
args = cli.parse_args()
print("steps", args.steps, flush=True)
"""

LOGS_ITSELF = """\
import argparse

import mlflow

import cascade_repro

hp = cascade_repro.params()
cli = argparse.ArgumentParser()
cli.add_argument("--seed", type=int, default=42)
args = cli.parse_args()
# What a framework does: its own batch of params, one of them a key cascade also logs (seed).
mlflow.log_params({"seed": args.seed, "learning_rate": 0.5, "from_script": "yes"})
print("logged", flush=True)
"""

GLOBALS_ONLY = """\
# nanoGPT's way: the configuration is the module's globals, a configurator overrides them from
# --key=value (no argparse, no Hydra, no params file read).
import sys
import time

import torch

batch_size = 8
learning_rate = 6e-4
n_layer = 2
dropout = 0.0
init_from = "scratch"
compile = False
betas = (0.9, 0.95)
wandb_api_key = "s3cret-key"
out_dir = "out-" + time.strftime("%Y-%m-%d_%H-%M-%S")  # differs every run: not configuration
_private = 1
config_keys = [k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, str))]
for arg in sys.argv[1:]:  # (its loop variables stay among the globals: not configuration)
    key, value = arg[2:].split("=")
    globals()[key] = type(globals()[key])(value)
config = {k: globals()[k] for k in config_keys}  # what it logs: its configuration, collected
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=learning_rate)
t0 = time.time()  # clock readings are not configuration
started = time.perf_counter()
iter_num = 0
while iter_num < 3:
    loss = model(torch.randn(batch_size, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    iter_num += 1
print("trained", iter_num, flush=True)
"""

NOTHING = """\
print("no params, no argparse", flush=True)
"""


def _run(project: Project, script: str, text: str, *args: str) -> tuple[dict[str, str], dict, str]:
    project.write(script, text)
    project.commit(f"add {script}")
    result = project.cascade("run", script, *args, check=True)
    run = project.runs()[0]
    return dict(run.data.params), project.manifest(run.info.run_id)["params"], result.stderr


def test_an_argparse_script_records_its_namespace_not_the_params_file(project: Project) -> None:
    params, record, _ = _run(project, "args.py", ARGPARSE_ONLY, "--lr", "0.01", "--batch-size", "32", "--amp")

    # The parsed namespace: defaults and the command line, as the script saw them.
    assert params == {
        "lr": "0.01", "batch_size": "32", "epochs": "5", "amp": "true", "layers": "[8, 8]",
        "out": "PosixPath('out')", "seed": "3",  # the seed cascade applied: `seed` in hyperparameters.yaml
    }  # fmt: skip
    assert record["source"] == "argparse"
    assert record["values"] == {
        "lr": 0.01, "batch_size": 32, "epochs": 5, "amp": True, "layers": [8, 8], "out": "PosixPath('out')"
    }  # fmt: skip
    assert record["argparse"] == record["values"]
    # The file was there but never read: kept for a restore, said to be unread, logged nowhere.
    assert record["file"]["path"] == "hyperparameters.yaml" and record["file"]["read"] is False
    assert not {"steps", "optimizer.lr", "model.hidden"} & set(params)
    assert "inner" not in params
    assert record["seed"] == 3 and record["seed_source"] == "params"


def test_a_script_that_reads_the_params_file_records_it(project: Project) -> None:
    params, record, _ = _run(project, "file.py", FILE_ONLY)
    assert params == {"seed": "3", "steps": "20", "optimizer.lr": "0.1", "optimizer.momentum": "0.9",
                      "model.hidden": "16"}  # fmt: skip
    assert record["source"] == "hyperparameters.yaml"
    assert record["values"] == {"seed": 3, "steps": 20, "optimizer": {"lr": 0.1, "momentum": 0.9},
                                "model": {"hidden": 16}}  # fmt: skip
    assert record["file"]["read"] is True and "argparse" not in record


def test_file_and_argparse_together_keep_both_values_of_a_shared_name(project: Project) -> None:
    params, record, _ = _run(project, "both.py", BOTH, "--steps", "5")
    # `steps` is the file's; argparse's own value of a name the file also has goes under args.
    assert params["steps"] == "20" and params["args.steps"] == "5"
    assert params["width"] == "4" and params["optimizer.lr"] == "0.1" and params["seed"] == "3"
    assert record["source"] == "hyperparameters.yaml + argparse"
    assert record["values"]["args.steps"] == 5 and record["values"]["steps"] == 20
    assert record["argparse"] == {"steps": 5, "width": 4}


def test_a_set_override_the_script_never_read_is_said_to_have_no_effect(project: Project) -> None:
    project.write("args.py", ARGPARSE_ONLY)
    project.commit("add args.py")
    result = project.cascade("run", "--set", "optimizer.lr=0.5", "args.py", check=True)
    said = "optimizer.lr (--set or --add) has no effect: args.py never called cascade_repro.params()"
    assert said in result.stderr


def test_the_scripts_own_mlflow_params_are_kept_and_cascades_are_not_dropped(project: Project) -> None:
    params, record, stderr = _run(project, "logs.py", LOGS_ITSELF, "--seed", "42")
    assert "logged" in stderr  # the script's batch went through: it did not crash on a clash
    # The script's own values stand under their names; cascade's value of a clashing key is kept
    # beside it under cascade., and the run says so.
    assert params["seed"] == "42" and params["cascade.seed"] == "3"
    assert params["learning_rate"] == "0.5" and params["from_script"] == "yes"
    assert params["optimizer.lr"] == "0.1"
    assert "logged as cascade.seed" in stderr
    assert record["seed"] == 3 and record["argparse"] == {"seed": 42}


def test_cascade_init_writes_no_params_that_a_run_would_record(project: Project) -> None:
    fresh = Project(project.root.parent / "fresh")
    fresh.root.mkdir()
    git(fresh.root, "init", "-q")
    fresh.write("train.py", NOTHING)
    fresh.commit("initial")
    init = fresh.cascade("init", check=True)
    assert "created  hyperparameters.yaml" in init.stdout  # a commented example, nothing in force
    fresh.commit("cascade init")

    fresh.cascade("run", "train.py", check=True)
    run = fresh.only_run()
    assert dict(run.data.params) == {"seed": "0"}
    record = fresh.manifest(run.info.run_id)["params"]
    assert record["values"] == {} and record["source"] is None
    assert record["seed"] == 0 and record["seed_source"] == "default"
    shown = json.loads(fresh.cascade("show", run.info.run_id, "--json", check=True).stdout)["data"]
    assert shown["manifest"]["params"]["values"] == {}


def test_a_script_configured_by_its_globals_records_the_configuration_it_collected(
    project: Project,
) -> None:
    params, record, _ = _run(project, "globals.py", GLOBALS_ONLY, "--learning_rate=0.002", "--batch_size=4")

    assert record["source"] == "globals"
    # the names it collected in `config`, with the values the configurator gave them
    assert record["values"] == record["globals"] == {
        "batch_size": 4, "learning_rate": 0.002, "n_layer": 2, "dropout": 0.0, "init_from": "scratch",
        "compile": False, "wandb_api_key": "<redacted>",
    }  # fmt: skip
    # what the configurator made of the command line, searchable in MLflow beside the seed
    assert params["learning_rate"] == "0.002" and params["batch_size"] == "4" and params["seed"] == "3"
    assert "s3cret-key" not in json.dumps(record)

    # Two runs that differ in one global: diff names it.
    a = project.record("globals.py", "--learning_rate=0.002")
    b = project.record("globals.py", "--learning_rate=0.003")
    data = json.loads(project.cascade("diff", a, b, "--json", check=True).stdout)["data"]
    (section,) = [s for s in data["sections"] if s["name"] == "params"]
    assert {c["key"]: (c["a"], c["b"]) for c in section["changes"]} == {"learning_rate": (0.002, 0.003)}



TUTORIAL = """\
import datetime
import os
import time
import uuid

import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
model = torch.nn.Linear(4, 1)
images, labels = next(iter(loader))  # a look at the data and the model before the settings
print(model(images).shape, flush=True)
learning_rate = 0.05
num_epochs = 2
run_name = "baseline"
out_dir = f"runs/{datetime.datetime.now():%Y%m%d-%H%M%S}"  # these differ every run: not configuration
run_id = str(uuid.uuid4())
log_name = f"train-{os.getpid()}.log"
stamp = f"exp_{int(time.time())}"
source = open(__file__).read()  # text in memory: not configuration
t0 = time.perf_counter_ns()
opt = torch.optim.SGD(model.parameters(), lr=learning_rate)
for epoch in range(num_epochs):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
final_loss = loss.item()
"""


def test_a_tutorial_scripts_globals_are_read_as_its_training_began_not_at_its_first_look(
    project: Project,
) -> None:
    params, record, _ = _run(project, "tutorial.py", TUTORIAL)
    assert record["source"] == "globals"
    # set after the first batch and forward (a look), before the first backward: all there; the loop's
    # epoch as it began; the loss after it, the script's text and its clock reading never
    values = dict(record["values"])
    # A pid under 4 digits is not told apart from a number of the configuration (`resnet-152`):
    # after the machine's pids wrapped, the log name's may be one.
    if (log_name := values.pop("log_name", None)) is not None:
        assert re.fullmatch(r"train-\d{1,3}\.log", log_name), log_name
    assert values == {"learning_rate": 0.05, "num_epochs": 2, "run_name": "baseline", "epoch": 0}
    assert params["learning_rate"] == "0.05" and params["num_epochs"] == "2"


CONFIG_OBJECTS = """\
# modded-nanogpt's way: a dataclass of class attributes, instantiated once; a Kaggle-style class CFG
import os
from dataclasses import dataclass

import torch


@dataclass
class Hyperparameters:
    train_files = os.environ.get("TRAIN_FILES", "data/fineweb_train_*.bin")
    num_iterations = 3
    learning_rate = 0.02
    train_seq_len = 48 * 1024

    def describe(self):
        return "a method: not configuration"


class CFG:
    hidden = 16
    betas = (0.9, 0.95)


class Tracker:  # an object the script keeps state in, not named as a configuration
    best = 0.0


args = Hyperparameters()
tracker = Tracker()
model = torch.nn.Linear(4, 1)  # a model's attributes are not configuration
opt = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
for step in range(args.num_iterations):
    loss = model(torch.randn(CFG.hidden, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_scripts_configuration_objects_are_read_with_their_attributes(project: Project) -> None:
    """modded-nanogpt's `args = Hyperparameters()` (a dataclass whose values are class attributes)
    and a `class CFG:` of settings recorded nothing but the loop's `step`."""
    params, record, _ = _run(project, "modded.py", CONFIG_OBJECTS)
    assert record["source"] == "globals"
    assert record["values"] == {
        "step": 0, "args.train_files": "data/fineweb_train_*.bin", "args.num_iterations": 3,
        "args.learning_rate": 0.02, "args.train_seq_len": 49152, "CFG.hidden": 16, "CFG.betas": [0.9, 0.95],
    }  # fmt: skip
    assert params["args.learning_rate"] == "0.02" and params["CFG.hidden"] == "16"


def test_a_script_that_never_trains_records_its_simple_globals_as_it_ended(project: Project) -> None:
    script = "import os\n\nsplit = 'val'\nlimit = 3\nsizes = [8, 16]\nhome = os.environ\nprint('done')\n"
    params, record, _ = _run(project, "evaluate.py", script)
    assert record["source"] == "globals"
    assert record["values"] == {"split": "val", "limit": 3, "sizes": [8, 16]}
    assert params["split"] == "val" and params["limit"] == "3"
