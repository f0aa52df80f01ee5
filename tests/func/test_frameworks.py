"""Unmodified framework scripts (issue 14, items 4 and 5): Lightning's MLFlowLogger and the Hugging
Face Trainer's MLflowCallback log into the cascade run, with nothing dropped and no second run;
Lightning's checkpoints are the run's, best as ModelCheckpoint says; the Lightning run verifies and
restores bit for bit. Real frameworks, tiny models, synthetic data."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugin import SCRIPTS, Project

lightning = pytest.importorskip("lightning", reason="lightning is a test extra (pip install -e '.[dev]')")
transformers = pytest.importorskip("transformers", reason="transformers is a test extra")

FRAMEWORKS = SCRIPTS / "frameworks"


def _runs_everywhere(project: Project) -> list[dict]:
    listed = project.cascade("ls", "--all", "--json", check=True)
    return json.loads(listed.stdout)["data"]


def test_lightning_mlflow_logger_lands_in_the_cascade_run_and_restores(project: Project) -> None:
    project.write("train_lightning.py", (FRAMEWORKS / "train_lightning.py").read_text())
    project.cascade("init", check=True)  # a DVC cache for the checkpoints
    project.commit("a Lightning script, cascade init")
    first = project.record("train_lightning.py", "--epochs", "4")
    runs = _runs_everywhere(project)
    assert [run["run_id"] for run in runs] == [first]  # no run of its own in experiment "lightning"
    run = project.client().get_run(first)
    assert run.data.params["hidden"] == "16" and run.data.params["lr"] == "0.05"  # save_hyperparameters
    assert "lightning MLFlowLogger" in run.data.tags["cascade.framework_logger"]
    history = project.client().get_metric_history(first, "val_loss")
    assert len(history) == 4  # one validation per epoch, as Lightning logged it
    # ModelCheckpoint's .ckpt files (written through fsspec, not torch.save(obj, path)) are the
    # run's checkpoints: the top 3 it kept are in the DVC cache, the one it removed is pruned.
    shown = json.loads(project.cascade("show", first, "--json", check=True).stdout)["data"]
    checkpoints = {Path(c["path"]).name: c for c in shown["manifest"]["checkpoints"]}
    on_disk = {p.name for p in (project.root / "checkpoints" / "lightning").glob("*.ckpt")}
    assert {n for n, c in checkpoints.items() if c["status"] == "kept"} == on_disk and len(on_disk) == 3
    assert [c["status"] for c in checkpoints.values()].count("pruned") == 1
    assert all(c["md5"] and c["monitor"] == "val_loss" for c in checkpoints.values() if c["status"] == "kept")
    output = next((project.root / "mlruns").rglob(f"{first}/artifacts/cascade/output.log")).read_text()
    best = Path(re.search(r"^best (.+)$", output, re.M).group(1)).name  # ModelCheckpoint.best_model_path
    taken = project.cascade("checkout", first, "--checkpoint", "best", "--to", str(project.root / "out"))
    assert taken.returncode == 0 and f"checkpoints/lightning/{best}" in taken.stderr, taken.stderr
    written = (project.root / "checkpoints" / "lightning" / best).read_bytes()
    assert (project.root / "out" / best).read_bytes() == written
    second = project.record("train_lightning.py", "--epochs", "4")
    verdict = project.cascade("verify", first, second)
    assert verdict.returncode == 0 and verdict.stdout.startswith("BITWISE_IDENTICAL"), verdict.stdout
    project.cascade("tag", first, "v1.0.0", check=True)
    restored = project.cascade("restore", "v1.0.0")
    assert restored.returncode == 0 and "BITWISE_IDENTICAL" in restored.stdout, restored.stderr
    worktree = project.root / ".cascade" / "restore" / "v1.0.0"
    assert not (worktree / "mlflow.db").exists() and not (worktree / "mlruns").exists()
    assert len(_runs_everywhere(project)) == 3  # the two runs and the restored one; nothing else


def test_hf_trainer_params_and_evaluate_land_in_the_cascade_run(project: Project) -> None:
    project.write("train_hf.py", (FRAMEWORKS / "train_hf.py").read_text())
    project.cascade("init", check=True)  # a DVC cache for the checkpoints
    project.commit("an HF Trainer script, cascade init")
    run_id = project.record("train_hf.py")
    assert [run["run_id"] for run in _runs_everywhere(project)] == [run_id]  # evaluate() opened no run
    run = project.client().get_run(run_id)
    # What MLflowCallback logs: the model config and TrainingArguments, less values over 250 chars.
    expected = json.loads(subprocess.run(
        [sys.executable, "-c", "import json, train_hf; print(json.dumps({k: str(v) for k, v in {"
         "**train_hf.tiny_gpt2().config.to_dict(), **train_hf.training_arguments().to_dict()}.items()}))"],
        cwd=project.root, capture_output=True, text=True, check=True,
    ).stdout.splitlines()[-1])  # fmt: skip
    expected = {k: v for k, v in expected.items() if len(v) <= 250}
    params = run.data.params
    missing = {k: v for k, v in expected.items() if params.get(k) != v and params.get(f"script/{k}") != v}
    assert not missing, f"{len(missing)} of {len(expected)} params dropped: {sorted(missing)[:10]}"
    # The framework logged first: its seed is `seed`; cascade's own (3, from hyperparameters.yaml)
    # is beside it, logged at the end.
    assert params["seed"] == "42" and params["cascade.seed"] == "3"
    evals = project.client().get_metric_history(run_id, "eval_loss")
    assert len(evals) == 4  # at steps 10, 20 and 30, and the evaluate() after train()
    # Each checkpoint-N/ directory is one checkpoint (a DVC directory object), not its files one by
    # one; the one save_total_limit=2 rotated away is pruned; best is HF's best_model_checkpoint.
    shown = json.loads(project.cascade("show", run_id, "--json", check=True).stdout)["data"]
    checkpoints = {c["path"]: c for c in shown["manifest"]["checkpoints"]}
    assert set(checkpoints) == {f"checkpoints/hf/checkpoint-{step}" for step in (10, 20, 30)}
    on_disk = {f"checkpoints/hf/{p.name}" for p in (project.root / "checkpoints" / "hf").iterdir()}
    assert {p for p, c in checkpoints.items() if c["status"] == "kept"} == on_disk and len(on_disk) == 2
    assert all(c["md5"].endswith(".dir") and c["files"] >= 5 for p, c in checkpoints.items() if p in on_disk)
    # (as DVC has it configured: `dvc remote list` wraps a long path at the terminal's width)
    name = _dvc_config(project, "core.remote")
    remote = Path(_dvc_config(project, f"remote.{name}.url"))
    for path in on_disk:  # the listing and every file it names are on the DVC remote
        listing = remote / "files" / "md5" / checkpoints[path]["md5"][:2] / checkpoints[path]["md5"][2:]
        members = json.loads(listing.read_text())
        assert len(members) == checkpoints[path]["files"]
        assert all((remote / "files" / "md5" / m["md5"][:2] / m["md5"][2:]).is_file() for m in members)
    output = next((project.root / "mlruns").rglob(f"{run_id}/artifacts/cascade/output.log")).read_text()
    best = Path(re.search(r"^best (.+)$", output, re.M).group(1)).name  # state.best_model_checkpoint
    taken = project.cascade("checkout", run_id, "--checkpoint", "best", "--to", str(project.root / "out"))
    assert taken.returncode == 0 and f"checkpoints/hf/{best}" in taken.stderr, taken.stderr
    written = project.root / "checkpoints" / "hf" / best
    for name in ("model.safetensors", "trainer_state.json", "optimizer.pt"):
        assert (project.root / "out" / best / name).read_bytes() == (written / name).read_bytes()


RELOGS = """\
import mlflow

mlflow.log_params({"lr": 0.1, "width": 8})
mlflow.log_params({"lr": 0.2, "depth": 3})  # MLflow alone refuses this whole batch: lr is logged
"""


def test_a_param_logged_again_with_another_value_loses_nothing_of_its_batch(project: Project) -> None:
    project.write("relogs.py", RELOGS)
    project.commit("a script logging params twice")
    run_id = project.record("relogs.py")
    run = project.client().get_run(run_id)
    assert {k: run.data.params.get(k) for k in ("lr", "width", "depth", "script/lr")} == {
        "lr": "0.1", "width": "8", "depth": "3", "script/lr": "0.2"}
    assert run.data.tags["cascade.renamed_params"] == "lr: run 0.1, script 0.2 (as script/lr)"


def _dvc_config(project: Project, key: str) -> str:
    return subprocess.run([sys.executable, "-m", "dvc", "config", key], cwd=project.root,
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
