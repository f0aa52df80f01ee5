"""The embedded sqlite store: created, migrated and repaired once, under a file lock.

MLflow creates and migrates a sqlite store in whichever process opens it first, with no lock
between processes, so runs started together on a new project raced through its ~70 migrations:
runs lost, and the file left half-migrated (`_alembic_tmp_*` tables, a revision behind the code)
so that every later command failed. Here, before MLflow opens the file:

- a missing store is built aside and renamed into place under an exclusive lock, so a store file
  that exists is complete and the common case costs one stat (`create_if_missing`);
- an existing store is read once (its revision and table names) and, if it is not at MLflow's head
  or holds a leftover temporary table, repaired under the same lock: rebuilt when it holds no
  record, otherwise migrated with MLflow's own `mlflow db upgrade` code from a backup copy. What
  cannot be repaired is a StoreError that names the fix (`check`).

The lock and the files built aside live in `.cascade/` beside the database, which every process
using that database agrees on. Without fcntl (Windows) there is no lock, as before.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from cascade_repro.errors import StoreError
from cascade_repro.settings import OWN_DIR, sqlite_path, sqlite_uri
from cascade_repro.store import new_store
from cascade_repro.store.mlflow_store import first_line
from cascade_repro.store.new_store import TMP_PREFIX

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 300.0


def create_if_missing(uri: str) -> bool:
    """Build the sqlite store `uri` at MLflow's head revision unless it exists; True if it was built.

    Called before the script starts, so neither cascade nor the script's own MLflow calls ever
    migrate a new store concurrently. A store that exists costs one stat.
    """
    db = sqlite_path(uri)
    if db is None or _exists(db):
        return False
    with _locked(db):
        if _exists(db):
            return False  # another process built it while this one waited
        _build(db)
    return True


def check(uri: str) -> None:
    """Make sure MLflow can open the sqlite store `uri`: repair it under the lock if half-migrated.

    Costs one read-only query and reading MLflow's head revision from its migration files (~20 ms);
    alembic is imported only where the store is not at that head.
    """
    db = sqlite_path(uri)
    if db is None or not _exists(db):
        return
    state = _read(db)
    if state is None:
        return  # not readable as sqlite here (locked, not a database): MLflow says what is wrong
    quick = _head_from_files()  # the common case, sound, without importing alembic (~1 s of CPU)
    if quick is not None and state.sound(quick):
        return
    head, known = _revisions()
    if state.sound(head):
        return
    with _locked(db):
        state = _read(db)
        if state is None or state.sound(head):
            return  # another process repaired it while this one waited
        _repair(db, state, head, known)


@dataclass(frozen=True)
class _State:
    tables: frozenset[str]
    revision: str | None

    @property
    def leftovers(self) -> list[str]:
        return sorted(t for t in self.tables if t.startswith(TMP_PREFIX))

    def sound(self, head: str) -> bool:
        return self.revision == head and not self.leftovers


def sound_without_mlflow(db: Path) -> bool:
    """Whether the store is at the installed MLflow's head revision with no migration left over, told
    without importing MLflow (its migration files are read): the condition for reading the store's
    tables directly (`local_record`). Anything else goes through MLflow, which repairs or refuses it."""
    state = _read(db)
    head = _head_from_files()
    return state is not None and head is not None and state.sound(head)


@functools.cache  # the installed MLflow does not change under a running command
def _head_from_files() -> str | None:
    """MLflow's head schema revision from its migration scripts' `revision`/`down_revision` lines."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("mlflow")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    versions = Path(list(spec.submodule_search_locations)[0]) / "store" / "db_migrations" / "versions"
    revisions: set[str] = set()
    parents: set[str] = set()
    for script in versions.glob("*.py"):
        text = script.read_text(encoding="utf-8", errors="replace")
        found = re.search(r"^revision\s*=\s*[\"']([0-9a-f]+)[\"']", text, re.M)
        down = re.search(r"^down_revision\s*=\s*(.+)$", text, re.M)
        if found:
            revisions.add(found.group(1))
        if down:
            parents.update(re.findall(r"[\"']([0-9a-f]+)[\"']", down.group(1)))
    heads = revisions - parents
    return next(iter(heads)) if len(heads) == 1 else None


def _exists(db: Path) -> bool:
    try:
        return db.stat().st_size > 0  # sqlite creates an empty file before it writes a schema
    except FileNotFoundError:
        return False


def _read(db: Path) -> _State | None:
    try:
        with contextlib.closing(_connect_ro(db)) as connection:
            tables = frozenset(
                r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            )
            revision = None
            if "alembic_version" in tables:
                row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
                revision = row[0] if row else None
    except sqlite3.Error:
        return None
    return _State(tables, revision)


def _connect_ro(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True, timeout=30)


def _repair(db: Path, state: _State, head: str, known: frozenset[str]) -> None:
    uri = sqlite_uri(db)
    if state.revision is not None and state.revision not in known:
        import mlflow

        raise StoreError(
            f"the MLflow store {db} is at schema revision {state.revision}, which MLflow "
            f"{mlflow.__version__} does not know: a newer MLflow made it",
            hint="upgrade MLflow here (pip install -U mlflow), or point MLFLOW_TRACKING_URI at another store",
        )
    if not _holds_records(db, state.tables):
        log.warning("the MLflow store %s was left half-migrated and holds no run: building it anew", db)
        _build(db)
        return
    orphans = [t for t in state.leftovers if t[len(TMP_PREFIX) :] not in state.tables]
    if orphans:
        raise StoreError(
            f"the MLflow store {db} was left half-migrated: {', '.join(orphans)} replaced a table that "
            "no longer exists, so cascade cannot repair it safely",
            hint=f"restore a backup of {db}, or rename the table back with sqlite3 and run "
            f"`mlflow db upgrade {uri}`",
        )
    backup = _work_dir(db) / f"{db.name}.before-repair"
    with contextlib.closing(_connect_ro(db)) as source, contextlib.closing(sqlite3.connect(backup)) as copy:
        source.backup(copy)
    log.warning(
        "the MLflow store %s is at revision %s with %s: migrating it to %s (a copy is at %s)",
        db, state.revision, ", ".join(state.leftovers) or "no leftover table", head, backup,
    )  # fmt: skip
    utils = new_store.mlflow_db_utils()
    engine = utils.create_sqlalchemy_engine(uri)
    try:
        with engine.begin() as connection:
            for table in state.leftovers:  # a partial copy: the table it was copied from is intact
                connection.exec_driver_sql(f'DROP TABLE "{table}"')
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            utils._initialize_tables(engine)  # what MLflow runs on a new store: create_all, then upgrade
    except Exception as exc:
        raise StoreError(
            f"the MLflow store {db} was left half-migrated and the repair failed: {first_line(exc)}",
            hint=f"the store as it was is at {backup}: copy it back, fix the schema with sqlite3 and run "
            f"`mlflow db upgrade {uri}`, or move {db.name} aside to start a new store",
        ) from exc
    finally:
        engine.dispose()
    backup.unlink()


def _holds_records(db: Path, tables: frozenset[str]) -> bool:
    with contextlib.closing(_connect_ro(db)) as connection:
        return new_store.holds_records(connection, tables)


def _build(db: Path) -> None:
    """A new store at MLflow's head revision, built aside and renamed over `db`."""
    new = _work_dir(db) / f"{db.name}.{os.getpid()}.new"
    _remove(new, new.with_name(new.name + "-journal"))
    try:
        # Experiment 0's artifacts go where `mlflow ui` beside the database puts them, whatever
        # this process's working directory.
        new_store.write(new, db.parent.absolute() / "mlruns", _head_from_files())
        # A journal left by a crashed writer of the old file would be replayed into the new one.
        _remove(*(db.with_name(db.name + suffix) for suffix in ("-journal", "-wal", "-shm")))
        os.replace(new, db)
    finally:
        _remove(new, new.with_name(new.name + "-journal"))


def _revisions() -> tuple[str, frozenset[str]]:
    """MLflow's head schema revision and every revision it knows."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(new_store.mlflow_db_utils()._get_alembic_config(""))
    return script.get_current_head() or "", frozenset(r.revision for r in script.walk_revisions())


@contextlib.contextmanager
def _locked(db: Path) -> Iterator[None]:
    """An exclusive lock on `.cascade/<db>.lock` beside the database, released when the block ends."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform
        yield
        return
    lock = _work_dir(db) / f"{db.name}.lock"
    with open(lock, "a+") as handle:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StoreError(
                        f"another process has held {lock} for {LOCK_TIMEOUT_S:.0f} s while creating or "
                        f"repairing the MLflow store {db}",
                        hint="wait for it to finish, or stop it if it hangs (a process holding the lock "
                        f"shows in `fuser {lock}`)",
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _work_dir(db: Path) -> Path:
    path = db.parent / OWN_DIR
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"cannot create or repair the MLflow store {db}: {exc}",
            hint=f"make {db.parent} writable, or point MLFLOW_TRACKING_URI / tracking_uri elsewhere",
        ) from None
    return path


def _remove(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
