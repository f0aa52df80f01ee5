"""A new embedded sqlite store at MLflow's head revision: built by MLflow once per machine, then copied.

Building a store with MLflow means importing it (~3 s) and running its ~70 migrations (~2 s), all
before the first run's script may start. What that builds is the same for every project but for
one row: experiment 0's artifact location, the `mlruns/0` beside the database (`mlflow ui` puts the
default experiment's artifacts there). So the first build is kept in the user's cache, keyed by
MLflow's version and head revision, and each new store is a copy of it with that row written as
MLflow writes it. A cached store that does not check out (truncated, or holding a row MLflow
does not write into a new store) is built again; where the cache cannot be written or the copy
fails, MLflow builds the store itself, as before.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import shutil
import sqlite3
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from cascade_repro.settings import sqlite_uri

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT_ID = 0
ABANDONED_S = 3600.0  # a temporary cache file unchanged this long: its build was killed
TMP_PREFIX = "_alembic_tmp_"  # alembic's copy of a table while a batch migration rebuilds it
# Rows MLflow writes into a new store itself; any other row is something a user recorded.
_OWN_ROWS = {"experiments": " WHERE experiment_id != 0", "workspaces": " WHERE name != 'default'"}


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
        copied = _copy(template, new, artifacts, head or "")
        if copied is _Copy.DONE:
            return
        if copied is _Copy.FAILED:  # here, not in the cached store: MLflow builds this one
            break
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
    _discard_abandoned(template.parent)  # once per new project store: one listing
    if template.is_file():
        return template
    building: Path | None = None
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=f"{template.name}.", suffix=".new", dir=template.parent)
        os.close(handle)  # a name of this process's own, on the cache's disk: writable, or OSError now
        building = Path(name)
        build_with_mlflow(building, template.parent / "mlruns")
        os.replace(building, template)  # whole or absent, whoever else builds it at the same time
    except Exception as exc:  # a cache full, not ours to write, or a path MLflow cannot spell
        log.debug("no cached empty store (%s): MLflow builds this one where it goes", exc)
        return None
    finally:
        if building is not None:
            _discard(building)
    return template


class _Copy(enum.Enum):
    DONE = "done"
    BAD = "the cached store is not an empty store at the head revision"
    FAILED = "writing the copy failed (its disk, its path)"


def _copy(template: Path, new: Path, artifacts: Path, head: str) -> _Copy:
    """`template` copied to `new` with experiment 0 set for `artifacts`; where not DONE, nothing is
    left at `new`."""
    try:
        shutil.copyfile(template, new)
    except OSError as exc:
        log.debug("copying the empty store %s failed: %s", template, exc)
        _discard(new)
        return _Copy.FAILED
    try:
        opened = sqlite3.connect(new, timeout=30)
    except sqlite3.Error as exc:
        log.debug("opening the new store %s failed: %s", new, exc)
        _discard(new)
        return _Copy.FAILED
    with contextlib.closing(opened) as connection:
        try:
            empty = _empty_at(connection, head)
        except sqlite3.Error:  # not a database, or not MLflow's tables
            empty = False
        if not empty:
            _discard(new)
            return _Copy.BAD
        now = int(time.time() * 1000)
        try:
            with connection:
                connection.execute(
                    "UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ?"
                    " WHERE experiment_id = ?",
                    (f"{artifacts}/{DEFAULT_EXPERIMENT_ID}", now, now, DEFAULT_EXPERIMENT_ID),
                )  # fmt: skip
        except (sqlite3.Error, ValueError) as exc:  # the disk of `new`; a path sqlite cannot take as text
            log.debug("writing the new store %s failed: %s", new, exc)
            empty = False
    if not empty:
        _discard(new)
        return _Copy.FAILED
    return _Copy.DONE


def _empty_at(connection: sqlite3.Connection, head: str) -> bool:
    """An intact store at revision `head` holding only the rows MLflow writes into a new one:
    its revision, experiment 0 and (in MLflow versions that have workspaces) the default workspace."""
    if connection.execute("PRAGMA quick_check").fetchone() != ("ok",):
        return False
    listed = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    tables = frozenset(row[0] for row in listed)
    if not {"alembic_version", "experiments", "runs"} <= tables:
        return False

    def rows(query: str) -> list[Any]:
        return connection.execute(query).fetchall()

    return (
        rows("SELECT version_num FROM alembic_version") == [(head,)]
        and rows("SELECT experiment_id FROM experiments") == [(DEFAULT_EXPERIMENT_ID,)]
        and ("workspaces" not in tables or rows("SELECT name FROM workspaces") == [("default",)])
        and not holds_records(connection, tables)
    )


def holds_records(connection: sqlite3.Connection, tables: frozenset[str]) -> bool:
    """Whether any table (or a leftover copy of one) has a row that MLflow did not write itself."""
    for table in sorted(tables - {"alembic_version"}):
        where = _OWN_ROWS.get(table.removeprefix(TMP_PREFIX), "")
        try:
            found = connection.execute(f'SELECT 1 FROM "{table}"{where} LIMIT 1').fetchone()
        except sqlite3.Error:  # not the columns expected mid-migration: assume it holds something
            return True
        if found:
            return True
    return False


def _discard_abandoned(folder: Path) -> None:
    """Builds of the cache killed midway (their temporary files, and a journal whose file is gone: a
    kill between the two unlinks), left for ABANDONED_S: a build in progress writes its file every
    moment and takes seconds."""
    cutoff = time.time() - ABANDONED_S
    with contextlib.suppress(OSError):  # no cache yet, or one this process may not read
        for each in folder.glob("mlflow-*.db.*.new*"):
            with contextlib.suppress(OSError):  # gone already: its build ended
                if each.stat().st_mtime < cutoff:
                    _discard(each)


def _discard(path: Path) -> None:
    for each in (path, path.with_name(path.name + "-journal")):
        with contextlib.suppress(OSError):  # gone already, or a cache this process may not change
            each.unlink()
