"""A new embedded store copied from the cached one is the store MLflow itself would have built."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path

import pytest

from cascade_repro.store import new_store
from cascade_repro.store.sqlite_store import _head_from_files


def _schema(db: Path) -> dict[str, list[str]]:
    """Each table's and index's definition, its lines in order: MLflow's own builds in one process
    write a table's constraints in different orders."""
    with contextlib.closing(sqlite3.connect(db)) as connection:
        rows = connection.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
    return {name: sorted(line.strip().rstrip(",") for line in sql.splitlines()) for name, sql in rows}


def _rows(db: Path, table: str) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(db)) as connection:
        return connection.execute(f'SELECT * FROM "{table}"').fetchall()


def _without_times(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return [(row[0], row[1], row[2], row[3], row[6]) for row in rows]  # creation and update times left out


@pytest.mark.parametrize("folder", ["plain", "a space", "ünï%20code", "what?#not-a-query"])
def test_a_copied_store_is_the_one_mlflow_builds(tmp_path: Path, folder: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    head = _head_from_files()
    assert head is not None
    root = tmp_path / folder
    root.mkdir()
    by_mlflow, copied = tmp_path / "by-mlflow.db", root / "copied.db"
    new_store.build_with_mlflow(by_mlflow, root / "mlruns")

    new_store.write(copied, root / "mlruns", head)
    # From here on MLflow cannot build: the store below is the cached one, copied.
    monkeypatch.setattr(new_store, "build_with_mlflow", _no_build)
    before = int(time.time() * 1000)
    new_store.write(tmp_path / "second.db", tmp_path / "elsewhere" / "mlruns", head)
    after = int(time.time() * 1000)

    cached = list((Path(os.environ["XDG_CACHE_HOME"]) / "cascade" / "stores").glob("mlflow-*.db"))
    assert [p.name for p in cached] == [f"mlflow-{_version()}-{head}.db"]
    assert _schema(copied) == _schema(by_mlflow)
    for table in ("alembic_version", "workspaces"):
        assert _rows(copied, table) == _rows(by_mlflow, table)
    assert _without_times(_rows(copied, "experiments")) == _without_times(_rows(by_mlflow, "experiments"))
    assert _rows(copied, "experiments")[0][2] == f"{root}/mlruns/0"
    (second,) = _rows(tmp_path / "second.db", "experiments")
    assert second[2] == f"{tmp_path}/elsewhere/mlruns/0"
    assert before <= second[4] == second[5] <= after  # created now, as MLflow would have


def test_a_bad_cached_store_is_built_again_and_an_unwritable_cache_is_done_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = _head_from_files()
    assert head is not None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    new_store.write(tmp_path / "first.db", tmp_path / "mlruns", head)
    (cached,) = (tmp_path / "cache" / "cascade" / "stores").glob("mlflow-*.db")
    with contextlib.closing(sqlite3.connect(cached)) as connection, connection:
        connection.execute(
            "INSERT INTO experiments (experiment_id, name, lifecycle_stage) VALUES (7, 'x', 'active')"
        )

    new_store.write(tmp_path / "second.db", tmp_path / "mlruns", head)
    assert [row[0] for row in _rows(tmp_path / "second.db", "experiments")] == [0]
    assert [row[0] for row in _rows(cached, "experiments")] == [0]  # the cache was built again

    cached.write_bytes(cached.read_bytes()[:4096])  # truncated
    new_store.write(tmp_path / "third.db", tmp_path / "mlruns", head)
    assert _rows(tmp_path / "third.db", "alembic_version") == [(head,)]
    assert _rows(cached, "alembic_version") == [(head,)]  # the cache was built again

    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    new_store.write(tmp_path / "fourth.db", tmp_path / "mlruns", head)
    assert _rows(tmp_path / "fourth.db", "alembic_version") == [(head,)]
    assert _schema(tmp_path / "fourth.db") == _schema(tmp_path / "first.db")


def _version() -> str:
    from importlib.metadata import version

    return version("mlflow")


def test_a_cache_mlflow_cannot_build_in_leaves_nothing_there_and_mlflow_builds_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache disk full, or a cache directory root made (neither can be had for real as root here):
    SQLAlchemy's own error, not an OSError, used to end `cascade run`."""
    from sqlalchemy.exc import OperationalError

    head = _head_from_files()
    assert head is not None
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    build = new_store.build_with_mlflow

    def full_cache(new: Path, artifacts: Path) -> None:
        if cache in new.parents:
            raise OperationalError("CREATE TABLE", {}, Exception("database or disk is full"))
        build(new, artifacts)

    monkeypatch.setattr(new_store, "build_with_mlflow", full_cache)
    new_store.write(tmp_path / "new.db", tmp_path / "mlruns", head)
    assert _rows(tmp_path / "new.db", "alembic_version") == [(head,)]
    assert [p.name for p in (cache / "cascade" / "stores").iterdir()] == []  # no half-built file left


def _no_build(new: Path, artifacts: Path) -> None:
    raise AssertionError(f"MLflow was asked to build {new}")


def test_a_build_of_the_cache_killed_midway_is_cleaned_up_by_the_next_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = _head_from_files()
    assert head is not None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no cached store yet
    stores = tmp_path / "cache" / "cascade" / "stores"
    stores.mkdir(parents=True)
    abandoned = stores / f"mlflow-{_version()}-{head}.db.k1ll3d.new"  # as a SIGKILLed build leaves it
    in_progress = stores / f"mlflow-{_version()}-{head}.db.bu1ld.new"  # another process's, building now
    orphan = stores / f"mlflow-{_version()}-{head}.db.0rphan.new-journal"  # killed between the unlinks
    old = (abandoned, abandoned.with_name(abandoned.name + "-journal"), orphan)
    for each in (*old, in_progress):
        each.write_bytes(b"")
    hours_ago = time.time() - 2 * new_store.ABANDONED_S
    for each in old:
        os.utime(each, (hours_ago, hours_ago))

    new_store.write(tmp_path / "mlflow.db", tmp_path / "mlruns", head)

    assert sorted(p.name for p in stores.iterdir() if p.is_file()) == sorted(
        [f"mlflow-{_version()}-{head}.db", in_progress.name]
    )
    assert _rows(tmp_path / "mlflow.db", "experiments")[0][2] == f"{tmp_path}/mlruns/0"
    # the cached store there already (a rerun right after the kill built it): cleaned up all the same
    os.utime(in_progress, (hours_ago, hours_ago))
    new_store.write(tmp_path / "second.db", tmp_path / "mlruns", head)
    assert [p.name for p in stores.iterdir() if p.is_file()] == [f"mlflow-{_version()}-{head}.db"]
