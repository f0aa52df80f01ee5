"""The direct writer of the embedded store writes what MLflow writes, and refuses what MLflow refuses.

Each scenario is played twice on one real MLflow sqlite store, once through MLflow's client and once
through `SqliteWriter`, by the same `mlflow_store` functions the recording uses; MLflow's client then
reads both runs back and must see the same run.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from cascade_repro.store import mlflow_store
from cascade_repro.store.sqlite_writer import SqliteWriter

EXPERIMENT = "proj"


@pytest.fixture
def store(tmp_path: Path) -> tuple[str, Any]:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow_store.client(uri)
    assert isinstance(client, MlflowClient)
    client.create_experiment(EXPERIMENT, artifact_location=str(tmp_path / "mlruns" / "7"))
    return uri, client


def _play(client: Any, files: Path, run_name: str | None) -> str:
    """What a recording does to its run, through the same functions."""
    tags = {"mlflow.user": "ana", "mlflow.source.name": "train.py", "cascade.dirty": "false"}
    opened = mlflow_store.open_run(client, EXPERIMENT, None, run_name, tags, 1_700_000_000_000)
    run_id = opened.run_id
    assert mlflow_store.log_params(client, run_id, {"lr": 0.1, "model.hidden": 16, "bad key!": "x"}) == []
    long = "v" * 9000
    assert mlflow_store.set_tags(client, run_id, {"cascade.long": long, "cascade.heartbeat": "1"}) == []
    renamed = {"cascade.heartbeat": "2", "mlflow.runName": "renamed"}
    assert mlflow_store.set_tags(client, run_id, renamed) == []
    points = [
        ("loss", 1.5, 10, 0), ("loss", math.nan, 11, 1), ("loss", math.inf, 12, 2),
        ("loss", -math.inf, 13, 2),
        ("loss", 1.5, 10, 0),  # a point sent twice (a retried batch) is stored once
        ("acc", 0.5, 30, 5), ("acc", 0.25, 40, 3),  # an older step later: not the latest value
        ("acc", 0.75, 30, 5), ("lr", 0.1, 5, 0),
    ]  # fmt: skip
    assert mlflow_store.log_metric_points(client, run_id, points[:4]) == 1
    assert mlflow_store.log_metric_points(client, run_id, points[4:]) == 1
    assert mlflow_store.log_metric_points(client, run_id, [("loss", 1.5, 10, 0)]) == 1
    (files / "dir" / "sub").mkdir(parents=True, exist_ok=True)
    (files / "dir" / "a.txt").write_text("a")
    (files / "dir" / "sub" / "b.txt").write_text("b")
    (files / "Dockerfile").write_text("FROM x\n")
    (files / "dir" / "link.txt").symlink_to(files / "dir" / "a.txt")  # copied as the file it names
    (files / "dir" / "linked").symlink_to(files / "dir" / "sub")  # made, not entered
    mlflow_store.log_json(client, run_id, {"run_id": "r", "n": [1, 2]}, "cascade/run.json")
    mlflow_store.log_json(client, run_id, {"run_id": "r", "n": [3]}, "cascade/run.json")  # replaced
    client.log_text(run_id, "text\n", "cascade/output.log")
    mlflow_store.log_file(client, run_id, files / "Dockerfile", "cascade")
    mlflow_store.log_dir(client, run_id, files / "dir", "cascade/untracked")
    mlflow_store.set_tags(client, run_id, {"cascade.incomplete": "x"})
    client.delete_tag(run_id, "cascade.incomplete")
    mlflow_store.finish_run(client, run_id, "FAILED", 1_700_000_009_000)
    return run_id


def _seen_by_mlflow(client: Any, run_id: str) -> dict[str, Any]:
    run = client.get_run(run_id)
    info = run.info
    history = {
        key: sorted((m.step, m.timestamp, str(m.value)) for m in client.get_metric_history(run_id, key))
        for key in run.data.metrics
    }
    root = Path(info.artifact_uri)
    files = {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}
    return {
        "info": (info.run_name, info.status, info.start_time, info.end_time, info.user_id,
                 info.lifecycle_stage, info.experiment_id, info.artifact_uri.replace(run_id, "RUN")),
        "params": dict(run.data.params),
        "tags": dict(run.data.tags),
        "metrics": {k: str(v) for k, v in run.data.metrics.items()},
        "history": history,
        "files": files,
        "folders": sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir()),
        "listed": sorted(a.path for a in client.list_artifacts(run_id, "cascade")),
    }  # fmt: skip


@pytest.mark.parametrize("run_name", ["named", None])
def test_the_direct_writer_writes_what_mlflow_writes(store: tuple[str, Any], tmp_path: Path,
                                                     run_name: str | None) -> None:  # fmt: skip
    uri, client = store
    writer = SqliteWriter.open(uri, EXPERIMENT, {})
    assert writer is not None
    first = _play(client, tmp_path / "a", run_name)
    by_mlflow = _seen_by_mlflow(client, first)
    direct = _play(writer, tmp_path / "b", run_name)
    by_writer = _seen_by_mlflow(client, direct)
    assert by_writer == by_mlflow
    assert "cascade/untracked/linked" in by_writer["folders"]
    assert by_writer["files"]["cascade/untracked/link.txt"] == "a"
    assert by_writer["info"][0] == "renamed" and by_writer["tags"]["cascade.long"] == "v" * 8000
    assert client.get_run(direct).data.metrics["loss"] < -1e308  # -inf (step 2, the later timestamp)
    assert by_writer["metrics"]["acc"] == "0.75"
    found = client.search_runs([writer.experiment.experiment_id], "tags.`mlflow.user` = 'ana' AND "
                               "attributes.status = 'FAILED' AND metrics.acc > 0.7")  # fmt: skip
    assert {r.info.run_id for r in found} == {first, direct}


def test_a_made_up_run_name_is_a_word_pair_and_a_number_as_mlflow_makes_them(store: tuple[str, Any]) -> None:
    uri, client = store
    writer = SqliteWriter.open(uri, EXPERIMENT, {})
    assert writer is not None
    run = writer.create_run(writer.experiment.experiment_id, 1, {})
    name = client.get_run(run.info.run_id).info.run_name
    assert name == run.info.run_name and client.get_run(run.info.run_id).data.tags["mlflow.runName"] == name
    adjective, noun, number = name.split("-")
    assert adjective.isalpha() and noun.isalpha() and 0 <= int(number) < 1000


def _refusal(client: Any, run_id: str, act: str) -> Exception:
    from mlflow.entities import Param

    attempts = {
        "changed param": lambda: client.log_batch(run_id, params=[_entity(client, Param, "lr", "0.2")]),
        "bad name": lambda: client.log_batch(run_id, params=[_entity(client, Param, "a//b", "1")]),
        "a key twice": lambda: client.log_batch(
            run_id, params=[_entity(client, Param, "p", "1"), _entity(client, Param, "p", "2")]
        ),
        "missing tag": lambda: client.delete_tag(run_id, "no.such.tag"),
        "missing run": lambda: client.set_terminated("0" * 32, "FINISHED", 1),
    }
    with pytest.raises(Exception) as raised:
        attempts[act]()
    return raised.value


def _entity(client: Any, mlflow_class: Any, *fields: Any) -> Any:
    own = getattr(client, "entities", None)
    return getattr(own, mlflow_class.__name__)(*fields) if own is not None else mlflow_class(*fields)


@pytest.mark.parametrize("act", ["changed param", "bad name", "a key twice", "missing tag", "missing run"])
def test_the_direct_writer_refuses_what_mlflow_refuses(store: tuple[str, Any], act: str) -> None:
    """A refusal is refused (`mlflow_store.refused`: the operation fails, it is not retried) with
    MLflow's error code, and leaves the run as it was."""
    uri, client = store
    writer = SqliteWriter.open(uri, EXPERIMENT, {})
    assert writer is not None
    codes = []
    for each in (client, writer):
        run_id = mlflow_store.open_run(each, EXPERIMENT, None, "r", {}, 1).run_id
        mlflow_store.log_params(each, run_id, {"lr": 0.1})
        error = _refusal(each, run_id, act)
        assert mlflow_store.refused(error), (each, error)
        codes.append(error.error_code)  # type: ignore[attr-defined]
        assert dict(client.get_run(run_id).data.params) == {"lr": "0.1"}
    assert codes[0] == codes[1]


def test_a_deleted_run_is_refused_and_a_locked_store_is_not_answering(store: tuple[str, Any]) -> None:
    uri, client = store
    writer = SqliteWriter.open(uri, EXPERIMENT, {})
    assert writer is not None
    run_id = writer.create_run(writer.experiment.experiment_id, 1, {}).info.run_id
    client.delete_run(run_id)
    (refusal,) = mlflow_store.set_tags(writer, run_id, {"a": "b"})  # refused: said, not retried
    assert "must be in the 'active' state" in refusal
    client.restore_run(run_id)
    writer.busy_timeout_s = 0.2
    with sqlite3.connect(writer.db) as holder:
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(sqlite3.OperationalError) as locked:
            mlflow_store.set_tags(writer, run_id, {"a": "b"})
        holder.rollback()
    assert not mlflow_store.refused(locked.value)  # pending for `cascade sync`, not lost
    mlflow_store.set_tags(writer, run_id, {"a": "b"})
    assert client.get_run(run_id).data.tags["a"] == "b"


def test_anything_but_a_known_embedded_store_and_experiment_goes_to_mlflow(
    store: tuple[str, Any], tmp_path: Path
) -> None:
    uri, client = store
    assert SqliteWriter.open(uri, EXPERIMENT, {}) is not None
    assert SqliteWriter.open(uri, "new experiment", {}) is None  # MLflow creates it
    assert SqliteWriter.open(uri, EXPERIMENT, {"MLFLOW_WORKSPACE": "team"}) is None
    assert SqliteWriter.open("http://127.0.0.1:5000", EXPERIMENT, {}) is None
    assert SqliteWriter.open(f"sqlite:///{tmp_path / 'none.db'}", EXPERIMENT, {}) is None
    remote = client.create_experiment("remote", artifact_location="s3://bucket/prefix")
    assert SqliteWriter.open(uri, "remote", {}) is None
    client.delete_experiment(remote)
    gone = client.get_experiment_by_name(EXPERIMENT).experiment_id
    client.delete_experiment(gone)
    assert SqliteWriter.open(uri, EXPERIMENT, {}) is None  # MLflow says it is deleted
    client.restore_experiment(gone)
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        db.execute("ALTER TABLE runs ADD COLUMN added_by_a_newer_mlflow TEXT")
    assert SqliteWriter.open(uri, EXPERIMENT, {}) is None  # tables it does not know: MLflow writes


@pytest.mark.parametrize("location", ["/tmp/proj#1/mlruns/0", "/tmp/what?/mlruns/0", "/tmp/a%41b/mlruns/0",
                                      "file:///tmp/my%20dir/mlruns/1", "/tmp/plain/mlruns/2/"])  # fmt: skip
def test_artifact_locations_are_joined_and_read_as_mlflow_does(location: str) -> None:
    """A repository path holding `#` or `?` lost everything after it (read as a URL fragment or query):
    the run's artifact URI named a sibling folder outside the project, and its files went there."""
    from mlflow.utils.uri import append_to_uri_path

    from cascade_repro.store.local_record import local_folder
    from cascade_repro.store.sqlite_writer import _append_path

    joined = _append_path(location, "0123abcd", "artifacts")
    assert joined == append_to_uri_path(location, "0123abcd", "artifacts")
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    assert local_folder(joined) == Path(LocalArtifactRepository(joined).artifact_dir)
