"""The store seam (issue 16, item 2): MLflow is reached through `store/` only, and what it raises
comes out as cascade's errors, never as a raw MLflow traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cascade_repro.errors import RunNotFound, StoreError
from cascade_repro.store.run_store import RunStore, StoredRun, translated
from tests.sources import matching_lines

PACKAGE = Path(__file__).resolve().parents[2] / "cascade_repro"
# store/ holds the adapters; child/ hooks MLflow's own client inside the user's script.
ADAPTERS = ("store/", "child/")
BYPASSES = re.compile(
    r"^\s*(import|from) mlflow\b|MlflowClient|mlflow_store\.client\(|\.info\.run_id|\.data\.tags"
)


def test_mlflow_is_reached_only_through_the_store() -> None:
    assert matching_lines(BYPASSES, skip=ADAPTERS) == []


def test_a_store_failure_is_a_store_error_that_says_what_failed() -> None:
    class MlflowLike(Exception):
        pass

    expected = r"reading run abc: RESOURCE_DOES_NOT_EXIST: no such run"
    with pytest.raises(StoreError, match=expected), translated("reading run abc"):
        raise MlflowLike("RESOURCE_DOES_NOT_EXIST: no such run\nstack trace lines")
    with pytest.raises(RunNotFound), translated("reading run abc"):  # cascade's own pass through
        raise RunNotFound("no run 'abc' in the store")


def test_the_fast_path_reads_the_embedded_store_without_mlflow(tmp_path: Path) -> None:
    """`resolve(ref, fast=True)` of a ref the sqlite fast path cannot find falls back to MLflow, which
    says the run does not exist; a run it found reads its artifacts as files, confined to the run."""
    store = RunStore(f"sqlite:///{tmp_path / 'mlflow.db'}", "proj")
    with pytest.raises(RunNotFound, match="no run 'nothing'"):
        store.resolve("nothing", fast=True)
    from cascade_repro.store import local_record

    artifacts = tmp_path / "mlruns" / "1" / "r" / "artifacts"
    (artifacts / "cascade").mkdir(parents=True)
    (artifacts / "cascade" / "output.log").write_text("hello\n")
    (tmp_path / "secret.txt").write_text("outside")
    store._local["r"] = local_record.LocalRun("r", "v1", artifacts)
    assert store.text("r", "cascade/output.log") == "hello\n"
    with pytest.raises(StoreError, match="no artifact"):
        store.text("r", "../../../../secret.txt")
    with pytest.raises(RunNotFound, match="has no cascade record"):
        store.record("r")
    assert StoredRun("r", tags={"cascade.version": "v1"}).version == "v1"


def test_mlflow_s_head_revision_is_read_from_its_scripts_as_alembic_reads_it() -> None:
    """The table fast path trusts a store only at this head (read without importing MLflow)."""
    from cascade_repro.store import sqlite_store

    head = sqlite_store._head_from_files()
    assert head is not None and head == sqlite_store._revisions()[0]


def test_an_artifact_written_without_mlflow_is_whole_or_left_to_mlflow(tmp_path: Path) -> None:
    """`verify`'s report on the embedded store is written as a file: whole, inside the run's
    artifacts, or not at all (then MLflow tries and says what is wrong)."""
    from cascade_repro.store.local_record import LocalRun

    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    run = LocalRun("a" * 32, None, artifacts)
    assert run.write_text("cascade/verify/b.json", '{"verdict": "DIVERGED"}\n')
    assert (artifacts / "cascade" / "verify" / "b.json").read_text() == '{"verdict": "DIVERGED"}\n'
    assert not run.write_text("../outside.json", "{}") and not (tmp_path / "outside.json").exists()
    (artifacts / "blocked").write_text("a file where a folder would go")  # a real OSError
    assert not run.write_text("blocked/report.json", "{}")
    assert sorted(p.name for p in artifacts.rglob("*")) == ["b.json", "blocked", "cascade", "verify"]
