"""Against a real MLflow tracking server (`mlflow server --serve-artifacts`, on sqlite and on
PostgreSQL), and PostgreSQL as the store itself: runs and
every artifact go to the server, and a second clone in a directory of another name sees the same
runs and restores one recorded by the first, bit for bit, with the first machine's files gone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.plugin import CASCADE, Project, git

pytestmark = pytest.mark.slow


def test_runs_live_on_the_server_and_a_second_clone_restores_them(
    project: Project, tracking_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, artifacts = tracking_server
    env = {"MLFLOW_TRACKING_URI": url}
    first = project.cascade("run", "--tag", "v1", "train.py", env=env, check=True)
    assert f"{url} (experiment proj)" in first.stderr  # where to see it: the server's own UI
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=url)
    experiment = client.get_experiment_by_name("proj")
    assert experiment is not None and experiment.artifact_location.startswith("mlflow-artifacts:")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["cascade.version"] == "v1"
    stored = {Path(p).relative_to(artifacts).as_posix() for p in artifacts.rglob("*") if p.is_file()}
    assert any(p.endswith(f"{run.info.run_id}/artifacts/cascade/run.json") for p in stored), stored
    assert any(p.endswith("cascade/trace.jsonl") for p in stored)
    assert not (project.root / "mlruns").exists()  # nothing of the run stayed on this machine only

    clone = tmp_path / "machine-b"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    shutil.rmtree(project.root)  # the first machine is gone
    other = Project(clone)
    listed = json.loads(other.cascade("ls", "--json", env=env, check=True).stdout)["data"]
    assert [r["run_id"] for r in listed] == [run.info.run_id] and listed[0]["version"] == "v1"
    shown = json.loads(other.cascade("show", "v1", "--json", env=env, check=True).stdout)["data"]
    assert shown["manifest"]["git"]["commit"] == git(clone, "rev-parse", "HEAD").strip()
    restored = other.cascade("restore", "v1", "--json", env=env, timeout=600)
    assert restored.returncode == 0, restored.stderr
    verdict = json.loads(restored.stdout)["data"]["verdict"]
    assert verdict["verdict"] == "BITWISE_IDENTICAL", verdict["summary"]


@pytest.mark.requires_postgres
def test_postgresql_as_the_store_itself(project: Project, postgres_db: str) -> None:
    """MLFLOW_TRACKING_URI=postgresql+psycopg2://...: runs in the database, artifacts in mlruns/."""
    env = {"MLFLOW_TRACKING_URI": postgres_db}
    project.cascade("run", "--tag", "v1", "train.py", env=env, check=True)
    project.cascade("run", "train.py", env=env, check=True)
    listed = json.loads(project.cascade("ls", "--json", env=env, check=True).stdout)["data"]
    assert len(listed) == 2 and [r["version"] for r in listed] == [None, "v1"]
    shown = json.loads(project.cascade("show", "v1", "--json", env=env, check=True).stdout)["data"]
    assert shown["manifest"]["git"]["commit"] == git(project.root, "rev-parse", "HEAD").strip()
    verified = project.cascade("verify", "--json", "v1", listed[0]["run_id"], env=env)
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["data"]["verdict"] == "BITWISE_IDENTICAL"
    from mlflow import MlflowClient

    tags = MlflowClient(tracking_uri=postgres_db).get_run(listed[0]["run_id"]).data.tags
    assert tags["cascade.verdict"] == "BITWISE_IDENTICAL"  # recorded in the database


def test_eight_runs_at_once_from_two_clones_lose_no_point(
    project: Project, tracking_server: tuple[str, Path], tmp_path: Path
) -> None:
    """Many users: 8 `cascade run`s at the same time, 4 from each of two clones, into one server
    (the experiment created by whichever comes first): every point of every run is on the server."""
    url, _ = tracking_server
    env = {**os.environ, "MLFLOW_TRACKING_URI": url}
    clone = tmp_path / "machine-b"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    points = 1500

    def start(where: Path, name: str) -> subprocess.Popen[str]:
        argv = [*CASCADE, "run", "--name", name, "train.py", "--points", str(points)]
        return subprocess.Popen(argv, cwd=where, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip

    started = [start(where, f"{where.name}-{i}") for where in (project.root, clone) for i in range(4)]
    for process in started:
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=url)
    experiments = [e for e in client.search_experiments() if e.name == "proj"]
    assert len(experiments) == 1  # both clones' first runs raced to create it: one experiment
    runs = client.search_runs([experiments[0].experiment_id])
    assert sorted(str(r.info.run_name) for r in runs) == sorted(f"{w}-{i}" for w in ("proj", "machine-b")
                                                                for i in range(4))  # fmt: skip
    for run in runs:
        history = client.get_metric_history(run.info.run_id, "extra")
        assert sorted(m.step for m in history) == list(range(points)), run.info.run_name
        into = tmp_path / run.info.run_id
        into.mkdir()
        local = client.download_artifacts(run.info.run_id, "cascade/run.json", str(into))
        record = json.loads(Path(local).read_text())
        assert record["metrics"]["pending"] == 0 and record["metrics"]["keys"]["extra"]["count"] == points
        assert run.info.status == "FINISHED" and run.data.tags["cascade.status"] == "FINISHED"
