"""A new embedded sqlite store at MLflow's head revision: built by MLflow once per machine, then copied.

Building a store with MLflow means importing it (~3 s) and running its ~70 migrations (~2 s), all
before the first run's script may start. What that builds is the same for every project but for
one row: experiment 0's artifact location, the `mlruns/0` beside the database (`mlflow ui` puts the
default experiment's artifacts there). So the first build is kept in the user's cache, keyed by
MLflow's version and head revision, and each new store is a copy of it with that row written as
MLflow writes it. A copy that does not check out (a cache truncated or written by hand) is
replaced by a new build; where the cache cannot be written, MLflow builds the store itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Any

from cascade_repro.settings import sqlite_uri

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT_ID = 0


def user_cache_dir() -> Path:
    """cascade's files in the user's cache (XDG_CACHE_HOME, else ~/.cache): rebuilt when missing."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cascade"


def write(new: Path, artifacts: Path, head: str | None) -> None:
    """A new store at `new` whose default experiment keeps its artifacts under `artifacts`.

    `head` is MLflow's head revision as its migration files say (None: unknown, so no copy is
    trusted). `new` is a path of the caller's own, renamed into place once written.
    """
    # MLflow writes an absolute POSIX path as it is; anything else is left to MLflow to spell.
    copyable = head is not None and os.name == "posix" and artifacts.is_absolute()
    for _attempt in range(2 if copyable else 0):  # the cached store, then once more if it is bad
        template = _template(head or "")
        if template is None:
            break
        if _copy(template, new, artifacts, head or ""):
            return
        log.warning("the cached empty MLflow store %s does not check out: building it again", template)
        _discard(template)
    build_with_mlflow(new, artifacts)


def build_with_mlflow(new: Path, artifacts: Path) -> None:
    """What MLflow itself does on a new store: tables, migrations and experiment 0."""
    mlflow_db_utils()
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # alembic's notes on unnamed constraints, for MLflow's developers
        store = SqlAlchemyStore(sqlite_uri(new), str(artifacts))
    store.engine.dispose()


def mlflow_db_utils() -> Any:
    from mlflow.store.db import utils  # importing mlflow sets its loggers' levels: quieten them after

    if not logging.getLogger("cascade_repro").isEnabledFor(logging.DEBUG):
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # "Creating initial tables..." is noise
        logging.getLogger("alembic").setLevel(logging.WARNING)
    return utils


def _template(head: str) -> Path | None:
    """The cached empty store for this MLflow, built now if missing; None where it cannot be had."""
    try:
        from importlib.metadata import version

        mlflow_version = version("mlflow")
    except Exception:  # no distribution metadata: nothing to key the cache by
        return None
    template = user_cache_dir() / "stores" / f"mlflow-{mlflow_version}-{head}.db"
    if template.is_file():
        return template
    building = template.with_name(f"{template.name}.{os.getpid()}.new")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        _discard(building)
        build_with_mlflow(building, template.parent / "mlruns")
        os.replace(building, template)  # whole or absent, whoever else builds it at the same time
    except OSError as exc:
        log.debug("no cached empty store (%s): MLflow builds this one", exc)
        return None
    finally:
        _discard(building)
    return template


def _copy(template: Path, new: Path, artifacts: Path, head: str) -> bool:
    """`template` copied to `new` with experiment 0 set for `artifacts`; False (nothing left at `new`)
    where the copy is not an empty store at `head`."""
    try:
        shutil.copyfile(template, new)
        with contextlib.closing(sqlite3.connect(new, timeout=30)) as connection:
            if not _empty_at(connection, head):
                _discard(new)
                return False
            now = int(time.time() * 1000)
            with connection:
                connection.execute(
                    "UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ?"
                    " WHERE experiment_id = ?",
                    (f"{artifacts}/{DEFAULT_EXPERIMENT_ID}", now, now, DEFAULT_EXPERIMENT_ID),
                )  # fmt: skip
    except (OSError, sqlite3.Error) as exc:
        log.debug("copying the empty store %s failed: %s", template, exc)
        _discard(new)
        return False
    return True


def _empty_at(connection: sqlite3.Connection, head: str) -> bool:
    """An intact store at revision `head` holding experiment 0 alone and no run."""
    if connection.execute("PRAGMA quick_check").fetchone() != ("ok",):
        return False
    revisions = connection.execute("SELECT version_num FROM alembic_version").fetchall()
    experiments = connection.execute("SELECT experiment_id FROM experiments").fetchall()
    runs = connection.execute("SELECT count(*) FROM runs").fetchone()
    return revisions == [(head,)] and experiments == [(DEFAULT_EXPERIMENT_ID,)] and runs == (0,)


def _discard(path: Path) -> None:
    for each in (path, path.with_name(path.name + "-journal")):
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            each.unlink()
