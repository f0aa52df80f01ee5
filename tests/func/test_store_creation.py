"""The store is created once, under a lock, before any script: concurrent first runs, half-migrated
stores (repaired, or named with the fix), and database drivers checked before the script starts."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.plugin import CASCADE, Project

# An MLflow 1.x revision; the migration after it (39d1c3be5f05) rebuilds latest_metrics through
# `_alembic_tmp_latest_metrics`, the table that concurrent first runs left behind.
MIDWAY = "a8c4a736bde6"


def _store_state(db: Path) -> tuple[list[str], str]:
    with sqlite3.connect(db) as connection:
        names = [r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        (revision,) = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    return [n for n in names if n.startswith("_alembic_tmp_")], revision


def _head() -> str:
    from mlflow.store.db.utils import _get_latest_schema_revision

    return str(_get_latest_schema_revision())


def _half_migrated(db: Path, with_record: bool) -> None:
    """A store as a migration interrupted after copying latest_metrics leaves it."""
    from alembic import command
    from mlflow.store.db.utils import _get_alembic_config, create_sqlalchemy_engine
    from mlflow.store.tracking.dbmodels.initial_models import Base

    engine = create_sqlalchemy_engine(f"sqlite:///{db}")
    Base.metadata.create_all(engine)
    config = _get_alembic_config(str(engine.url))
    with engine.begin() as connection, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # old migrations' deprecation notes
        config.attributes["connection"] = connection
        command.upgrade(config, MIDWAY)
    engine.dispose()
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE _alembic_tmp_latest_metrics AS SELECT * FROM latest_metrics")
        if with_record:
            connection.execute(
                "INSERT INTO experiments (experiment_id, name, artifact_location, lifecycle_stage) "
                "VALUES (1, 'kept', '/nowhere', 'active')"
            )


def _mlflow_alone_fails_on(db: Path, tmp_path: Path) -> None:
    """The state is really broken: MLflow by itself fails on (a copy of) it, as the issue saw."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    copy = tmp_path / "copy.db"
    shutil.copyfile(db, copy)
    with pytest.raises(Exception, match="_alembic_tmp_latest_metrics already exists"):
        SqlAlchemyStore(f"sqlite:///{copy}", str(tmp_path / "mlruns"))


@pytest.mark.slow
def test_concurrent_first_runs_on_a_new_store_are_all_recorded(project: Project) -> None:
    count = 8
    processes = [
        subprocess.Popen(
            [*CASCADE, "run", "train.py"],
            cwd=project.root,
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(count)
    ]
    outputs = [p.communicate(timeout=500) for p in processes]
    assert [p.returncode for p in processes] == [0] * count, [err for _, err in outputs]
    runs = project.runs()
    assert len(runs) == count
    client = project.client()
    for run in runs:
        assert run.info.status == "FINISHED"
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss"))
        assert steps == list(range(20))
    assert _store_state(project.root / "mlflow.db") == ([], _head())
    assert not list((project.root / ".cascade").glob("mlflow.db.*.new"))  # nothing left from building it
    assert project.cascade("ls").returncode == 0


@pytest.mark.slow
def test_half_migrated_store_holding_no_record_is_rebuilt(project: Project, tmp_path: Path) -> None:
    db = project.root / "mlflow.db"
    _half_migrated(db, with_record=False)
    _mlflow_alone_fails_on(db, tmp_path)
    result = project.cascade("run", "train.py")
    assert result.returncode == 0, result.stderr
    assert "half-migrated and holds no run: building it anew" in result.stderr
    assert project.only_run().info.status == "FINISHED"
    assert _store_state(db) == ([], _head())


@pytest.mark.slow
def test_half_migrated_store_with_records_is_migrated_in_place(project: Project, tmp_path: Path) -> None:
    db = project.root / "mlflow.db"
    _half_migrated(db, with_record=True)
    _mlflow_alone_fails_on(db, tmp_path)
    result = project.cascade("ls")
    assert result.returncode == 0, result.stderr
    assert f"at revision {MIDWAY} with _alembic_tmp_latest_metrics: migrating it" in result.stderr
    assert _store_state(db) == ([], _head())
    assert project.client().get_experiment_by_name("kept") is not None  # what it held is still there
    assert not (project.root / ".cascade" / "mlflow.db.before-repair").exists()
    project.record("train.py")


def test_half_migrated_store_that_cannot_be_repaired_names_the_fix(project: Project) -> None:
    db = project.root / "mlflow.db"
    _half_migrated(db, with_record=True)
    with sqlite3.connect(db) as connection:  # interrupted between dropping the table and renaming its copy
        connection.execute("DROP TABLE latest_metrics")
    before = db.read_bytes()
    result = project.cascade("ls")
    assert result.returncode == 1
    assert "_alembic_tmp_latest_metrics replaced a table that no longer exists" in result.stderr
    assert f"`mlflow db upgrade sqlite:///{db}`" in result.stderr
    assert "Traceback" not in result.stderr
    assert db.read_bytes() == before  # left as it was


def test_store_from_a_newer_mlflow_is_refused_with_the_fix(project: Project) -> None:
    project.cascade("ls", check=True)  # creates the store
    db = project.root / "mlflow.db"
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    result = project.cascade("ls")
    assert result.returncode == 1
    assert "schema revision ffffffffffff" in result.stderr and "a newer MLflow made it" in result.stderr
    assert "pip install -U mlflow" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("uri", "module", "install"),
    [
        ("postgresql://user:s3cret@127.0.0.1:9/db", "psycopg2", "pip install 'cascade_repro[postgres]'"),
        ("postgresql+psycopg2://127.0.0.1:9/db", "psycopg2", "pip install 'cascade_repro[postgres]'"),
        ("mysql://user:s3cret@127.0.0.1:9/db", "MySQLdb", "pip install mysqlclient"),
    ],
)
def test_database_store_without_its_driver_fails_before_the_script(
    project: Project, uri: str, module: str, install: str
) -> None:
    # The driver hidden from this `cascade run` alone where it is installed (the suite installs psycopg2
    # for the PostgreSQL tests): `find_spec` answers None for a module set to None in sys.modules.
    hidden = f"import sys; sys.modules[{module!r}] = None; from cascade_repro.cli import main; main()"
    result = subprocess.run([sys.executable, "-c", hidden, "run", "train.py"], cwd=project.root,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "MLFLOW_TRACKING_URI": uri})  # fmt: skip
    assert result.returncode == 1
    assert f"needs the database driver {module}, which is not installed" in result.stderr
    assert install in result.stderr
    assert "s3cret" not in result.stderr and "Traceback" not in result.stderr
    assert not (project.root / "out").exists()  # the script never started
    assert not list((project.root / ".cascade").glob("runs/*"))  # no run directory left behind
