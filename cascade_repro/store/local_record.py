"""Find a run and read its artifacts straight from a local sqlite store, without importing MLflow.

`cascade restore` needs the record before it can start anything, and importing MLflow and opening
its SQLAlchemy store costs ~1.5-2.5 s here. For the embedded default store (a sqlite file with
`file://` artifacts) the run is found with one read-only query on MLflow's own tables and its
artifacts are plain files; anything else, or any ref this path cannot resolve exactly as
`mlflow_store.resolve_run` would (ambiguous, unknown, deleted), returns None and the caller asks
MLflow, which also gives the error messages.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import sqlite3
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from cascade_repro.settings import sqlite_path

VERSION_TAG = "cascade.version"
USER_TAG = "mlflow.user"
HEARTBEAT_TAG = "cascade.heartbeat"  # when the run's cascade process last said it was alive (epoch s)
MAX_DIRECT_TAG = 5000  # tag values written without MLflow: well under any of its versions' limits


@dataclass(frozen=True)
class LocalRun:
    """A run of a local store, with the `download_artifacts` face of an MlflowClient for its files."""

    run_id: str
    version: str | None
    artifact_dir: Path

    def download_artifacts(self, run_id: str, path: str, dst_path: str) -> str:
        if run_id != self.run_id:
            raise KeyError(f"{run_id} is not the run read from the local store")
        source = (self.artifact_dir / path).resolve()
        if not source.is_relative_to(self.artifact_dir.resolve()) or not source.exists():
            raise FileNotFoundError(f"no artifact {path} in {self.artifact_dir}")
        target = Path(dst_path) / path  # where MLflow puts it: the artifact's own path under dst_path
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copyfile(source, target)
        return str(target)

    def write_text(self, path: str, text: str) -> bool:
        """A text artifact written as MLflow's `log_text` would on a `file://` store (whole or not at
        all); False where `path` would leave the run's artifacts or the file cannot be written (a full
        disk, another user's folder): MLflow then tries, and says what is wrong."""
        target = (self.artifact_dir / path).resolve()
        if not target.is_relative_to(self.artifact_dir.resolve()) or target == self.artifact_dir.resolve():
            return False
        try:
            write_aside(target, lambda aside: aside.write_text(text, encoding="utf-8"))
        except OSError:
            return False
        return True


def find(tracking_uri: str, ref: str) -> LocalRun | None:
    """The active run `ref` names (id, unique id prefix, run name or version), or None: ask MLflow."""
    db = sqlite_path(tracking_uri)
    if db is None or not db.is_file():
        return None
    from cascade_repro.store.sqlite_store import sound_without_mlflow

    if not sound_without_mlflow(db):  # half-migrated, or another MLflow's: MLflow repairs or refuses it
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5)) as connection:
            found = _resolve(connection, ref)
    except sqlite3.Error:
        return None  # another schema, a locked file: MLflow knows better
    if found is None:
        return None
    run_id, artifact_uri, version = found
    artifact_dir = local_folder(artifact_uri)
    if artifact_dir is None or not (artifact_dir / "cascade" / "run.json").is_file():
        return None
    return LocalRun(run_id, version, artifact_dir)


def local_folder(uri: str) -> Path | None:
    """The folder an artifact URI names on this machine (a `file:` URI or a plain path), else None."""
    parts = urllib.parse.urlsplit(uri)
    if not parts.scheme:  # a plain path: `#` and `?` are its own; %XX is decoded, as MLflow does
        return Path(urllib.parse.unquote(uri))
    if parts.scheme != "file" or parts.netloc:
        return None
    return Path(urllib.parse.unquote(parts.path))


def write_aside(target: Path, write: Callable[[Path], Any]) -> None:
    """A file written beside `target` and renamed onto it: whole or not at all (OSError passes)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    aside = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        write(aside)
        os.replace(aside, target)
    finally:
        with contextlib.suppress(OSError):
            aside.unlink(missing_ok=True)


def _resolve(connection: sqlite3.Connection, ref: str) -> tuple[str, str, str | None] | None:
    active = (
        "SELECT r.run_uuid, r.artifact_uri, (SELECT value FROM tags t WHERE t.run_uuid = r.run_uuid AND "
        f"t.key = '{VERSION_TAG}') FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id "
        "WHERE r.lifecycle_stage = 'active' AND e.lifecycle_stage = 'active'"
    )
    if len(ref) == 32:
        rows = connection.execute(active + " AND r.run_uuid = ?", (ref,)).fetchall()
        if len(rows) == 1:
            return rows[0]
    exact = connection.execute(
        active + " AND (r.name = ? OR EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid AND "
        f"t.key = '{VERSION_TAG}' AND t.value = ?))",
        (ref, ref),
    ).fetchall()
    if exact:
        return exact[0] if len(exact) == 1 else None
    if len(ref) >= 4 and all(c in "0123456789abcdef" for c in ref):
        prefixed = connection.execute(active + " AND r.run_uuid LIKE ?", (ref + "%",)).fetchall()
        if len(prefixed) == 1:
            return prefixed[0]
    return None


@dataclass(frozen=True)
class RunRow:
    """A run as MLflow's tables hold it (what `MlflowClient.get_run` would say, read directly)."""

    run_id: str
    name: str | None
    experiment_id: str
    status: str | None
    start_ms: int | None
    end_ms: int | None
    artifact_uri: str | None
    tags: dict[str, str]
    metrics: dict[str, float]


_RUN_COLUMNS = "r.run_uuid, r.name, r.experiment_id, r.status, r.start_time, r.end_time, r.artifact_uri"
_ACTIVE = (
    "FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id "
    "WHERE r.lifecycle_stage = 'active' AND e.lifecycle_stage = 'active'"
)


class LocalStore:
    """The embedded store's own tables, read-only: what `cascade ls` and `show` list, without MLflow.

    Only for a local sqlite file in MLflow's default workspace; None from `open` (or from a query
    that fails: another schema, a locked file) sends the caller to MLflow, which also gives the errors.
    """

    def __init__(self, db: Path) -> None:
        self.db = db

    @classmethod
    def open(cls, tracking_uri: str, environ: Mapping[str, str]) -> LocalStore | None:
        db = sqlite_path(tracking_uri)
        if db is None or not db.is_file() or environ.get("MLFLOW_WORKSPACE"):
            return None
        from cascade_repro.store.sqlite_store import sound_without_mlflow

        return cls(db) if sound_without_mlflow(db) else None  # else MLflow repairs or refuses it

    def _query(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]] | None:
        try:
            with contextlib.closing(
                sqlite3.connect(f"{self.db.as_uri()}?mode=ro", uri=True, timeout=5)
            ) as db:
                return db.execute(sql, args).fetchall()
        except sqlite3.Error:
            return None

    def runs(self, experiment: str | None, limit: int, versions_only: bool = False, user: str | None = None,
             status: str | None = None) -> list[RunRow] | None:  # fmt: skip
        """Active runs, newest first (then by id, as MLflow orders them): of `experiment`, or of all;
        only labelled ones, one user's (`mlflow.user`), or those in one status, where asked."""
        sql, args = f"SELECT {_RUN_COLUMNS} {_ACTIVE}", []
        if experiment is not None:
            sql += " AND e.name = ?"
            args.append(experiment)
        if versions_only:
            sql += " AND EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = ?)"
            args.append(VERSION_TAG)
        if user is not None:
            sql += " AND EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = ? AND "
            sql += "t.value = ?)"
            args += [USER_TAG, user]
        if status is not None:
            sql += " AND r.status = ?"
            args.append(status)
        sql += " ORDER BY r.start_time IS NULL, r.start_time DESC, r.run_uuid LIMIT ?"
        rows = self._query(sql, (*args, limit))
        return None if rows is None else self._with_tags_and_metrics(rows)

    def run(self, run_id: str) -> RunRow | None:
        rows = self._query(f"SELECT {_RUN_COLUMNS} {_ACTIVE} AND r.run_uuid = ?", (run_id,))
        found = self._with_tags_and_metrics(rows) if rows else None
        return found[0] if found else None

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> bool:
        """Tags written straight into MLflow's `tags` table, in one transaction, as MLflow's own
        `set_tag` writes any key but its `mlflow.*` ones; False (nothing written: ask MLflow) for
        those keys, values over MAX_DIRECT_TAG, a run that is not active, or any sqlite error."""
        if any(key.startswith("mlflow.") or len(key) > 250 or len(value) > MAX_DIRECT_TAG
               for key, value in tags.items()):  # fmt: skip
            return False

        def write(db: sqlite3.Connection) -> bool:
            db.executemany(
                "INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?) "
                "ON CONFLICT (key, run_uuid) DO UPDATE SET value = excluded.value",
                [(key, value, run_id) for key, value in tags.items()],
            )
            return True

        return self._on_active_run(run_id, write)

    def delete_tag(self, run_id: str, key: str) -> bool:
        """A tag removed from MLflow's `tags` table, as MLflow's `delete_tag` does; False (nothing
        written: ask MLflow, which says why) for an `mlflow.*` key, a run that is not active, a tag
        the run does not have, or any sqlite error."""
        if key.startswith("mlflow."):
            return False
        return self._on_active_run(run_id, lambda db: db.execute(
            "DELETE FROM tags WHERE run_uuid = ? AND key = ?", (run_id, key)).rowcount == 1)  # fmt: skip

    def _on_active_run(self, run_id: str, write: Callable[[sqlite3.Connection], bool]) -> bool:
        """`write` in one transaction, if the run is active; False when it is not, when `write`
        says so (nothing is then committed), or on any sqlite error."""
        try:
            with contextlib.closing(sqlite3.connect(str(self.db), timeout=30)) as db, db:
                if not db.execute(f"SELECT 1 {_ACTIVE} AND r.run_uuid = ?", (run_id,)).fetchone():
                    return False
                if not write(db):
                    db.rollback()
                    return False
            return True
        except sqlite3.Error:
            return False

    def experiment_id(self, name: str) -> str | None:
        """The id of the experiment `name` in MLflow's default workspace, deleted or not (as MLflow's
        `get_experiment_by_name`), or None when it does not exist (or the query failed)."""
        rows = self._query("SELECT experiment_id FROM experiments WHERE name = ? AND workspace = 'default'",
                           (name,))  # fmt: skip
        return str(rows[0][0]) if rows else None

    def active_experiment(self, name: str) -> tuple[str, str] | None:
        """(id, artifact location) of the active experiment `name` in MLflow's default workspace."""
        rows = self._query("SELECT experiment_id, artifact_location FROM experiments WHERE name = ? AND "
                           "workspace = 'default' AND lifecycle_stage = 'active'", (name,))  # fmt: skip
        return (str(rows[0][0]), str(rows[0][1] or "")) if rows else None

    def columns(self, table: str) -> set[str] | None:
        """The columns of one of MLflow's tables (None when it cannot be read)."""
        rows = self._query(f'PRAGMA table_info("{table}")', ())
        return None if rows is None else {str(row[1]) for row in rows}

    def tagged(self, experiment_id: str, key: str, value: str, limit: int) -> list[str] | None:
        """Ids of the experiment's active runs whose tag `key` is `value`, newest first, as MLflow's
        `search_runs` orders them; None when the query failed."""
        rows = self._query(
            f"SELECT r.run_uuid {_ACTIVE} AND r.experiment_id = ? AND EXISTS (SELECT 1 FROM tags t WHERE "
            "t.run_uuid = r.run_uuid AND t.key = ? AND t.value = ?) "
            "ORDER BY r.start_time IS NULL, r.start_time DESC, r.run_uuid LIMIT ?",
            (int(experiment_id), key, value, limit),
        )
        return None if rows is None else [str(row[0]) for row in rows]

    def experiment_name(self, experiment_id: str) -> str | None:
        rows = self._query("SELECT name FROM experiments WHERE experiment_id = ?", (experiment_id,))
        return str(rows[0][0]) if rows else None

    def _with_tags_and_metrics(self, rows: list[tuple[Any, ...]]) -> list[RunRow] | None:
        ids = [str(row[0]) for row in rows]
        tags: dict[str, dict[str, str]] = {run_id: {} for run_id in ids}
        metrics: dict[str, dict[str, float]] = {run_id: {} for run_id in ids}
        for start in range(0, len(ids), 500):  # SQLite's limit on bound parameters
            chunk = ids[start : start + 500]
            marks = ", ".join("?" * len(chunk))
            found_tags = self._query(f"SELECT run_uuid, key, value FROM tags WHERE run_uuid IN ({marks})",
                                     tuple(chunk))  # fmt: skip
            found_metrics = self._query(
                f"SELECT run_uuid, key, value, is_nan FROM latest_metrics WHERE run_uuid IN ({marks})",
                tuple(chunk),
            )
            if found_tags is None or found_metrics is None:
                return None
            for run_id, key, value in found_tags:
                tags[run_id][key] = value
            for run_id, key, value, is_nan in found_metrics:
                number = math.nan if is_nan else _number(value)
                if number is not None:  # unreadable: left out, the run and its other metrics still listed
                    metrics[run_id][key] = number
        runs = []
        for r in rows:
            start_ms, end_ms = run_times(r[4], r[5])
            runs.append(RunRow(str(r[0]), r[1], str(r[2]), r[3], start_ms, end_ms, r[6], tags[str(r[0])],
                               metrics[str(r[0])]))  # fmt: skip
        return runs


# Epoch milliseconds a run's times can take: from 1970 to the last instant `datetime` can show (9999).
MAX_EPOCH_MS = 253_402_300_799_999


def run_times(start: Any, end: Any) -> tuple[int | None, int | None]:
    """A run's (start, end) epoch ms as a store holds them (sqlite is typeless; a server is
    untrusted): each None where it is no time at all, and the end None where it is before the start,
    so one bad row shows as unknown times instead of failing, or distorting, the whole listing."""
    start_ms, end_ms = _epoch_ms(start), _epoch_ms(end)
    if start_ms is not None and end_ms is not None and end_ms < start_ms:
        return start_ms, None
    return start_ms, end_ms


def _epoch_ms(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EPOCH_MS:
        return None
    return value


def _number(value: Any) -> float | None:
    """A metric's value as sqlite holds it (any type): a float, or None where it is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
