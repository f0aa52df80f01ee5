"""The embedded sqlite store written without MLflow: the part of `MlflowClient` a run's recording uses.

Importing MLflow and opening its store costs ~2 s of CPU in the `cascade run` process, taken from the
training on a small machine. On the embedded default store (a local sqlite file at MLflow's head
revision, with the tables as this module knows them, `file://` artifacts, the experiment already
there) a new run is written into MLflow's own tables and artifact folder directly, as MLflow's
`SqlAlchemyStore` writes them: the same rows, the same checks, and the same refusals (`Refused`, with
MLflow's `error_code`, so delivery still tells "refused" from "not answering": a locked database or a
full disk raises sqlite's or the OS's own error and the write waits for `cascade sync`).

Anything else (a tracking server, a database, a new store or experiment, a run someone else opened,
another schema) gets None from `open`, and MLflow does the writing.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import os
import posixpath
import random
import re
import shutil
import sqlite3
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

from cascade_repro.store.local_record import USER_TAG, LocalStore, local_folder, write_aside
from cascade_repro.store.mlflow_store import MAX_KEY, MAX_PARAM_VALUE, MAX_TAG_VALUE

INVALID = "INVALID_PARAMETER_VALUE"
MISSING = "RESOURCE_DOES_NOT_EXIST"
RUN_NAME_TAG = "mlflow.runName"
STATUSES = frozenset({"SCHEDULED", "FAILED", "FINISHED", "RUNNING", "KILLED"})
_FLOAT_MAX = 1.7976931348623157e308
_NAME = re.compile(r"^[/\w.\- :]*$")  # MLflow's characters for param, metric and tag names (not Windows)
# The columns of each table written here, as MLflow 3.x has them; a store whose tables differ was made
# by another MLflow, which then writes it itself.
COLUMNS = {
    "experiments": {"experiment_id", "name", "artifact_location", "lifecycle_stage", "creation_time",
                    "last_update_time", "workspace"},
    "runs": {"run_uuid", "name", "source_type", "source_name", "entry_point_name", "user_id", "status",
             "start_time", "end_time", "source_version", "lifecycle_stage", "artifact_uri", "experiment_id",
             "deleted_time"},
    "tags": {"key", "value", "run_uuid"},
    "params": {"key", "value", "run_uuid"},
    "metrics": {"key", "value", "timestamp", "run_uuid", "step", "is_nan"},
    "latest_metrics": {"key", "value", "timestamp", "step", "is_nan", "run_uuid"},
}  # fmt: skip


MetricRow = tuple[str, float, int, int, int]  # (key, value, timestamp, step, is_nan), as stored


class Refused(Exception):
    """The store refused a write as invalid: what MLflow would raise, with its `error_code`."""

    def __init__(self, message: str, error_code: str = INVALID) -> None:
        super().__init__(message)
        self.error_code = error_code


class Param(NamedTuple):
    key: str
    value: str


class RunTag(NamedTuple):
    key: str
    value: str


class Metric(NamedTuple):
    key: str
    value: float
    timestamp: int
    step: int


@dataclass(frozen=True)
class Experiment:
    experiment_id: str
    name: str
    artifact_location: str


@dataclass(frozen=True)
class _RunInfo:
    run_id: str
    experiment_id: str
    run_name: str
    artifact_uri: str


@dataclass(frozen=True)
class _RunData:
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Run:
    info: _RunInfo
    data: _RunData


class SqliteWriter:
    """A new run of one experiment of the embedded store, written into MLflow's tables and files."""

    # What `mlflow_store` builds its batches from where the client is this one (no MLflow import).
    entities = SimpleNamespace(Param=Param, RunTag=RunTag, Metric=Metric)
    busy_timeout_s = 30.0  # how long a write waits for another writer (the script's own MLflow, a verify)

    def __init__(self, db: Path, experiment: Experiment) -> None:
        self.db = db
        self.experiment = experiment
        self._artifact_dirs: dict[str, Path] = {}

    @classmethod
    def open(cls, tracking_uri: str, experiment: str, environ: Mapping[str, str]) -> SqliteWriter | None:
        """The writer for a new run of `experiment`, or None: MLflow writes it (see the module's doc)."""
        tables = LocalStore.open(tracking_uri, environ)  # the embedded store, sound, at MLflow's head
        if tables is None or any(tables.columns(table) != columns for table, columns in COLUMNS.items()):
            return None
        found = tables.active_experiment(experiment)
        if found is None or local_folder(found[1]) is None:
            return None  # a new experiment, or artifacts elsewhere: MLflow creates or writes them
        return cls(tables.db, Experiment(found[0], experiment, found[1]))

    # -- the runs ---------------------------------------------------------------------------------
    def get_experiment_by_name(self, name: str) -> Experiment | None:
        return self.experiment if name == self.experiment.name else None

    def create_run(self, experiment_id: str, start_time: int | None = None,
                   tags: Mapping[str, str] | None = None, run_name: str | None = None) -> _Run:  # fmt: skip
        """A RUNNING run, as MLflow's `create_run` makes it (its name from `run_name`, the
        `mlflow.runName` tag, or made up; its user from the `mlflow.user` tag)."""
        if experiment_id != self.experiment.experiment_id:
            raise Refused(f"experiment {experiment_id} is not the one this writer was opened for")
        tags = dict(tags or {})
        named = tags.get(RUN_NAME_TAG)
        if run_name and named and run_name != named:
            raise Refused(
                "Both 'run_name' argument and 'mlflow.runName' tag are specified, but with different "
                f"values (run_name='{run_name}', mlflow.runName='{named}')."
            )
        name = run_name or named or _random_name()
        tags.setdefault(RUN_NAME_TAG, name)
        run_id = uuid.uuid4().hex
        artifact_uri = _append_path(self.experiment.artifact_location, run_id, "artifacts")
        with self._writing() as db:
            found = db.execute("SELECT lifecycle_stage FROM experiments WHERE experiment_id = ?",
                               (int(experiment_id),)).fetchone()  # fmt: skip
            if found is None or found[0] != "active":
                raise Refused(f"The experiment {experiment_id} must be in the 'active' state.")
            db.execute(
                "INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, user_id, "
                "status, start_time, end_time, deleted_time, source_version, lifecycle_stage, artifact_uri, "
                "experiment_id) VALUES (?, ?, 'UNKNOWN', '', '', ?, 'RUNNING', ?, NULL, NULL, '', 'active', "
                "?, ?)",
                (run_id, name, tags.get(USER_TAG, "unknown"), start_time, artifact_uri, int(experiment_id)),
            )
            db.executemany("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)",
                           [(key, value, run_id) for key, value in tags.items()])  # fmt: skip
        return _Run(_RunInfo(run_id, experiment_id, name, artifact_uri), _RunData(tags=tags))

    def get_run(self, run_id: str) -> _Run:
        """What the recording reads back: the run's params (and tags)."""
        with contextlib.closing(self._connect()) as db:
            row = self._active_run(db, run_id)
            params = dict(db.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run_id,)))
            tags = dict(db.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,)))
        return _Run(_RunInfo(run_id, str(row[1]), row[2] or "", row[3] or ""), _RunData(params, tags))

    def log_batch(self, run_id: str, metrics: Iterable[Any] = (), params: Iterable[Any] = (),
                  tags: Iterable[Any] = ()) -> None:  # fmt: skip
        """Params, metric points and tags in one transaction, checked as MLflow's `log_batch` checks
        them: a param may not change its value; a metric point already there is not written twice;
        each metric's latest value is the one with the highest (step, timestamp, value)."""
        metrics, params, tags = list(metrics), list(params), list(tags)
        if not (metrics or params or tags):
            return
        checked_params = [Param(_name(p.key, "param"), _cut(str(p.value), MAX_PARAM_VALUE)) for p in params]
        checked_tags = [RunTag(_name(t.key, "tag"), _cut(str(t.value), MAX_TAG_VALUE)) for t in tags]
        rows = [_metric_row(m) for m in metrics]
        _check_params(checked_params)
        with self._writing() as db:
            self._active_run(db, run_id)
            self._insert_params(db, run_id, checked_params)
            self._insert_metrics(db, run_id, rows)
            self._upsert_tags(db, run_id, checked_tags)

    def delete_tag(self, run_id: str, key: str) -> None:
        with self._writing() as db:
            self._active_run(db, run_id)
            if not db.execute("DELETE FROM tags WHERE run_uuid = ? AND key = ?", (run_id, key)).rowcount:
                raise Refused(f"No tag with name: {key} in run with id {run_id}", MISSING)

    def set_terminated(self, run_id: str, status: str | None = None, end_time: int | None = None) -> None:
        status = status or "FINISHED"
        if status not in STATUSES:
            raise Refused(f"Could not get run status corresponding to string {status}")
        with self._writing() as db:
            self._active_run(db, run_id)
            end_ms = int(time.time() * 1000) if end_time is None else end_time
            db.execute("UPDATE runs SET status = ?, end_time = ? WHERE run_uuid = ?",
                       (status, end_ms, run_id))  # fmt: skip

    # -- artifacts --------------------------------------------------------------------------------
    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        source = Path(local_path)
        target = self._artifact_path(run_id, artifact_path) / source.name
        write_aside(target, lambda aside: shutil.copyfile(source, aside))
        shutil.copystat(source, target)

    def log_artifacts(self, run_id: str, local_dir: str, artifact_path: str | None = None) -> None:
        """A folder's files under `artifact_path`, walked as MLflow walks it (a linked folder made but
        not entered, a linked file copied)."""
        into = self._artifact_path(run_id, artifact_path)
        for folder, folders, files in os.walk(local_dir):
            relative = Path(os.path.relpath(folder, local_dir))
            for name in folders:
                (into / relative / name).mkdir(exist_ok=True)
            for name in files:
                source = os.path.join(folder, name)
                write_aside(into / relative / name, functools.partial(shutil.copy2, source))

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        directory, name = posixpath.split(artifact_file)
        target = self._artifact_path(run_id, directory or None) / name
        write_aside(target, lambda aside: aside.write_text(text, encoding="utf-8"))

    def _artifact_path(self, run_id: str, artifact_path: str | None) -> Path:
        if run_id not in self._artifact_dirs:
            with contextlib.closing(self._connect()) as db:
                uri = self._active_run(db, run_id)[3] or ""
            found = local_folder(uri)
            if found is None:
                raise Refused(f"run {run_id} keeps its artifacts at {uri}, not in a local folder")
            self._artifact_dirs[run_id] = found
        root = self._artifact_dirs[run_id]
        target = (root / artifact_path) if artifact_path else root
        if not target.resolve().is_relative_to(root.resolve()):
            raise Refused(f"artifact path {artifact_path!r} leaves the run's artifacts")
        target.mkdir(parents=True, exist_ok=True)
        return target

    # -- sqlite -----------------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(str(self.db), timeout=self.busy_timeout_s, isolation_level=None)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """One transaction holding sqlite's write lock from its start (committed, or rolled back)."""
        with contextlib.closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:  # sqlite has rolled back by itself after some errors (a full disk)
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    @staticmethod
    def _active_run(db: sqlite3.Connection, run_id: str) -> tuple[Any, ...]:
        row = db.execute("SELECT lifecycle_stage, experiment_id, name, artifact_uri FROM runs WHERE "
                         "run_uuid = ?", (run_id,)).fetchone()  # fmt: skip
        if row is None:
            raise Refused(f"Run with id={run_id} not found", MISSING)
        if row[0] != "active":
            raise Refused(f"The run {run_id} must be in the 'active' state. Current state is {row[0]}.")
        return tuple(row)

    @staticmethod
    def _insert_params(db: sqlite3.Connection, run_id: str, params: list[Param]) -> None:
        if not params:
            return
        existing = dict(db.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run_id,)))
        changed = [
            {"key": p.key, "old_value": existing[p.key], "new_value": p.value}
            for p in params
            if p.key in existing and existing[p.key] != p.value
        ]
        if changed:
            raise Refused(
                f"Changing param values is not allowed. Params were already logged='{changed}' for run "
                f"ID='{run_id}'."
            )
        db.executemany("INSERT INTO params (key, value, run_uuid) VALUES (?, ?, ?)",
                       [(p.key, p.value, run_id) for p in params if p.key not in existing])  # fmt: skip

    @staticmethod
    def _insert_metrics(db: sqlite3.Connection, run_id: str, rows: list[MetricRow]) -> None:
        if not rows:
            return
        db.executemany(
            "INSERT OR IGNORE INTO metrics (key, value, timestamp, step, is_nan, run_uuid) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [(*row, run_id) for row in rows],
        )
        newest: dict[str, MetricRow] = {}  # per key, the point with the greatest (step, timestamp, value)
        for row in rows:
            held = newest.get(row[0])
            if held is None or (row[3], row[2], row[1]) > (held[3], held[2], held[1]):
                newest[row[0]] = row
        for key, row in newest.items():
            latest = db.execute("SELECT value, timestamp, step FROM latest_metrics WHERE run_uuid = ? AND "
                                "key = ?", (run_id, key)).fetchone()  # fmt: skip
            if latest is None:
                db.execute("INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
                           "VALUES (?, ?, ?, ?, ?, ?)", (*row, run_id))  # fmt: skip
            elif (row[3], row[2], row[1]) > (latest[2], latest[1], latest[0]):
                db.execute(
                    "UPDATE latest_metrics SET value = ?, timestamp = ?, step = ?, is_nan = ? "
                    "WHERE run_uuid = ? AND key = ?",
                    (row[1], row[2], row[3], row[4], run_id, key),
                )

    @staticmethod
    def _upsert_tags(db: sqlite3.Connection, run_id: str, tags: list[RunTag]) -> None:
        for tag in tags:
            if tag.key == RUN_NAME_TAG:  # the run's name is also a column of the run
                db.execute("UPDATE runs SET name = ? WHERE run_uuid = ?", (tag.value, run_id))
        db.executemany(
            "INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?) "
            "ON CONFLICT (key, run_uuid) DO UPDATE SET value = excluded.value",
            [(tag.key, tag.value, run_id) for tag in tags],
        )


def _name(key: Any, what: str) -> str:
    """A param, tag or metric name as MLflow accepts it, or Refused with MLflow's reason."""
    if key is None:
        raise Refused(f"Missing value for required parameter '{what} key'.")
    key = str(key)
    if not _NAME.match(key):
        raise Refused(
            f"Invalid value {key!r} for {what} name: names may only contain alphanumerics, underscores (_), "
            "dashes (-), periods (.), spaces ( ), colon(:) and slashes (/)."
        )
    normal = posixpath.normpath(key)
    if normal != key or normal == "." or normal.startswith(("..", "/")):
        raise Refused(f"Invalid value {key!r} for {what} name: it would resolve to {normal!r} as a file name")
    if len(key) > MAX_KEY:
        raise Refused(f"{what} name exceeds the maximum length of {MAX_KEY}")
    return key


def _cut(value: str, limit: int) -> str:
    """A value cut to MLflow's limit, as MLflow does by default (MLFLOW_TRUNCATE_LONG_VALUES)."""
    if len(value) <= limit:
        return value
    if os.environ.get("MLFLOW_TRUNCATE_LONG_VALUES", "true").lower() in ("false", "0"):
        raise Refused(f"value exceeds the maximum length of {limit}")
    return value[:limit]


def _metric_row(metric: Any) -> MetricRow:
    """(key, value, timestamp, step, is_nan) as MLflow stores a point: NaN as 0 with is_nan, ±inf as
    the largest finite double."""
    key, value, timestamp, step = _name(metric.key, "metric"), metric.value, metric.timestamp, metric.step
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        raise Refused(f"Invalid value {value!r} for metric {key!r}: please specify a valid double")
    if not isinstance(timestamp, numbers.Number) or timestamp < 0:  # type: ignore[operator]
        raise Refused(f"Invalid timestamp {timestamp!r} for metric {key!r}: a nonnegative long")
    if not isinstance(step, numbers.Number):
        raise Refused(f"Invalid step {step!r} for metric {key!r}: a valid long")
    number = float(value)  # type: ignore[arg-type]
    if math.isnan(number):
        return key, 0.0, int(timestamp), int(step), 1  # type: ignore[call-overload]
    if math.isinf(number):
        number = _FLOAT_MAX if number > 0 else -_FLOAT_MAX
    return key, number, int(timestamp), int(step), 0  # type: ignore[call-overload]


def _check_params(params: list[Param]) -> None:
    """MLflow's client sends any number of points, params and tags, in batches it makes itself; what
    it refuses is one key given twice."""
    keys = [p.key for p in params]
    duplicated = sorted({key for key in keys if keys.count(key) > 1})
    if duplicated:
        raise Refused(f"Duplicate parameter keys have been submitted: {duplicated}.")


def _append_path(location: str, *parts: str) -> str:
    """`location` (a plain path or a `file:` URI) with `parts` appended to its path, as MLflow does."""
    split = urllib.parse.urlsplit(location)
    if not split.scheme:  # a plain path, joined as text (`#` or `?` in it is no fragment or query)
        return posixpath.join(location.rstrip("/") or "/", *parts)
    path = posixpath.join(split.path.rstrip("/") or "/", *parts)
    return urllib.parse.urlunsplit(split._replace(path=path))


_ADJECTIVES = (
    "able", "bold", "brave", "bright", "calm", "clever", "crisp", "eager", "fair", "fast", "gentle", "glad",
    "grand", "keen", "kind", "lucid", "merry", "nimble", "proud", "quick", "quiet", "rare", "sharp", "shy",
    "steady", "sunny", "swift", "tidy", "vivid", "warm", "wise", "young",
)  # fmt: skip
_NOUNS = (
    "ant", "bass", "bear", "bee", "cat", "colt", "crane", "deer", "dove", "eel", "elk", "finch", "fox",
    "frog", "goat", "hare", "hawk", "lark", "lynx", "mole", "moth", "newt", "owl", "ram", "seal", "slug",
    "swan", "toad", "vole", "wasp", "wolf", "wren",
)  # fmt: skip


def _random_name() -> str:
    """A run name like MLflow's own when none is given ("adjective-noun-123")."""
    return f"{random.choice(_ADJECTIVES)}-{random.choice(_NOUNS)}-{random.randrange(1000)}"
