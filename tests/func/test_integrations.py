"""cascade inside the tools it sits beside: `mlflow run` (an existing run) and `dvc repro`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugin import Project

pytestmark = pytest.mark.slow


def test_records_into_a_run_opened_by_someone_else(project: Project) -> None:
    """`mlflow run` opens a run and sets MLFLOW_RUN_ID; cascade fills that run instead of another."""
    client = project.client()
    experiment_id = client.create_experiment("outer", artifact_location=(project.root / "mlruns").as_uri())
    outer = client.create_run(experiment_id, run_name="opened-by-mlflow-run")
    client.log_param(outer.info.run_id, "seed", "99")  # clashes with the params file's seed: 3

    result = project.cascade("run", "train.py", env={"MLFLOW_RUN_ID": outer.info.run_id}, check=True)

    run = project.only_run()
    assert run.info.run_id == outer.info.run_id and run.info.run_name == "opened-by-mlflow-run"
    assert run.info.status == "FINISHED"
    assert run.data.params["seed"] == "99"  # MLflow never changes a logged param...
    assert run.data.params["cascade.seed"] == "3"  # ...so ours is kept beside it, and we say so
    assert "param seed=3 logged as cascade.seed: the run already has seed=99" in result.stderr
    manifest = project.manifest(run.info.run_id)
    assert manifest["experiment"] == "outer" and manifest["params"]["seed"] == 3
    assert run.data.params["optimizer.lr"] == "0.1"
    assert run.data.metrics["loss"] > 0


def test_dvc_repro_runs_a_stage_through_cascade(project: Project) -> None:
    project.cascade("init", check=True)
    project.write(
        "dvc.yaml",
        "stages:\n  train:\n    cmd: cascade run train.py\n    deps: [train.py]\n"
        "    params:\n      - hyperparameters.yaml:\n",
    )
    project.commit("dvc stage")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=project.root, env=env, check=True,
                   capture_output=True)  # fmt: skip

    run = project.only_run()
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.source.name"] == "train.py"
    lock = (project.root / "dvc.lock").read_text()
    assert "cmd: cascade run train.py" in lock
    seen = json.loads((project.root / "out/seen.json").read_text())
    assert seen["params"]["seed"] == 3
