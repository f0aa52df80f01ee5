"""restore's fast path: a run found in the sqlite store without MLflow is the run MLflow resolves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade_repro.store import local_record, mlflow_store
from tests.plugin import Project

pytestmark = pytest.mark.slow


def test_local_store_resolves_as_mlflow_does_or_defers(project: Project) -> None:
    first = project.record("--tag", "v1", "--name", "alpha", "train.py")
    second = project.record("--name", "beta", "train.py")
    third = project.record("--name", "beta", "train.py")
    client = project.client()
    uri = project.tracking_uri
    for ref in ("v1", "alpha", first, first[:8], second[:6], third):
        found = local_record.find(uri, ref)
        assert found is not None, ref
        assert found.run_id == mlflow_store.resolve_run(client, ref, None).info.run_id
    assert local_record.find(uri, "v1").version == "v1"  # type: ignore[union-attr]
    record = json.loads((local_record.find(uri, "v1").artifact_dir / "cascade" / "run.json").read_text())  # type: ignore[union-attr]
    assert record["run_id"] == first
    # What it cannot answer exactly (unknown, ambiguous, deleted, another store) goes to MLflow.
    assert local_record.find(uri, "v2") is None
    assert local_record.find(uri, "beta") is None  # two runs have that name: MLflow's error names both
    client.delete_run(second)
    assert local_record.find(uri, second) is None
    assert local_record.find("http://127.0.0.1:5000", "v1") is None
    into = project.root.parent / "copied"
    into.mkdir()
    found = local_record.find(uri, first)
    assert found is not None
    copied = found.download_artifacts(first, "cascade/run.json", str(into))
    assert Path(copied) == into / "cascade" / "run.json"  # as MLflow: the artifact's path is kept
    assert json.loads(Path(copied).read_text())["run_id"] == first
    with pytest.raises(FileNotFoundError):
        found.download_artifacts(first, "../../mlflow.db", str(into))
