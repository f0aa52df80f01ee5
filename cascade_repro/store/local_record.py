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
import shutil
import sqlite3
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from cascade_repro.settings import sqlite_path

VERSION_TAG = "cascade.version"


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


def find(tracking_uri: str, ref: str) -> LocalRun | None:
    """The active run `ref` names (id, unique id prefix, run name or version), or None: ask MLflow."""
    db = sqlite_path(tracking_uri)
    if db is None or not db.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5)) as connection:
            found = _resolve(connection, ref)
    except sqlite3.Error:
        return None  # another schema, a locked file: MLflow knows better
    if found is None:
        return None
    run_id, artifact_uri, version = found
    parts = urllib.parse.urlsplit(artifact_uri)
    if parts.scheme not in ("", "file") or parts.netloc:
        return None
    artifact_dir = Path(urllib.parse.unquote(parts.path))
    if not (artifact_dir / "cascade" / "run.json").is_file():
        return None
    return LocalRun(run_id, version, artifact_dir)


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
