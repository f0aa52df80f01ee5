"""MLflow through `MlflowClient` with explicit run ids: open a run, write its record, find runs.

The functions the store side uses (`run_store.RunStore`, `delivery.Delivery`, the metrics writer);
nothing above `store/` calls them with a client of its own or sees an MLflow type: `RunStore` is the
interface, and it hands out `StoredRun`s, never MLflow's `Run`.
"""

from __future__ import annotations

import difflib
import json
import socket
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from cascade_repro.errors import RunNotFound, StoreError
from cascade_repro.settings import sqlite_path

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_KEY = 250  # params, tags and metrics
REFUSED_CODES = frozenset(
    {"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST",
     "INVALID_STATE", "NOT_FOUND", "MALFORMED_REQUEST", "INVALID_REQUEST"}
)  # fmt: skip


def probe_store(uri: str, timeout_s: float = 3.0) -> None:
    """Fail fast, before the script starts, when the store clearly cannot be reached.

    Deliberately does not import mlflow (1-2 s): HTTP servers get a /health request, databases a
    check that SQLAlchemy's driver is installed and a TCP connect, a sqlite file a check that its
    directory exists.
    """
    parts = urllib.parse.urlsplit(uri)
    fix = "start the tracking server, fix MLFLOW_TRACKING_URI / tracking_uri in cascade.yaml, or unset it"
    if parts.scheme in ("http", "https"):
        from urllib import error as url_error  # only remote stores pay for the HTTP stack
        from urllib import request as url_request

        url = uri.rstrip("/") + "/health"
        try:
            with url_request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - user's store
                response.read(64)
        except url_error.HTTPError:
            return  # it answered: reachable (auth or routing is MLflow's to report)
        except (url_error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise StoreError(f"MLflow tracking server {uri} is unreachable ({reason})", hint=fix) from None
    elif parts.scheme.startswith(("postgresql", "mysql", "mssql")):
        host, port = parts.hostname or "localhost", parts.port or _default_port(parts.scheme)
        _check_driver(parts.scheme, f"{parts.scheme}://{host}:{port}")
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
        except OSError as exc:
            raise StoreError(f"MLflow database {host}:{port} is unreachable ({exc})", hint=fix) from None
    elif (path := sqlite_path(uri)) is not None:
        directory = path.parent
        if not directory.is_dir():
            raise StoreError(f"the directory of the MLflow store {path} does not exist", hint=fix)
    elif not _known_scheme(parts.scheme):
        raise StoreError(
            f"the store address {uri} is not a kind of store MLflow can use (sqlite:///, file:, "
            "http(s)://, postgresql://, mysql://, mssql://, databricks)",
            hint="fix tracking_uri in cascade.yaml or MLFLOW_TRACKING_URI, or unset it for the project's "
            "own sqlite store",
        )


KNOWN_SCHEMES = ("", "file", "sqlite", "http", "https", "uc")
KNOWN_SCHEME_FAMILIES = ("postgresql", "mysql", "mssql", "databricks")


def _known_scheme(scheme: str) -> bool:
    """A tracking store MLflow has, or one a plugin registers (its `mlflow.tracking_store` entry
    points, read only for a scheme MLflow itself lacks)."""
    if scheme in KNOWN_SCHEMES or scheme.startswith(KNOWN_SCHEME_FAMILIES):
        return True
    from importlib.metadata import entry_points

    return any(point.name == scheme for point in entry_points(group="mlflow.tracking_store"))


# SQLAlchemy's dialect[+driver] → the module it imports and how to install it. Without it MLflow
# fails only when the run is opened, after the script has started.
DB_DRIVERS = {
    "postgresql": ("psycopg2", "pip install 'cascade_repro[postgres]'"),
    "postgresql+psycopg2": ("psycopg2", "pip install 'cascade_repro[postgres]'"),
    "postgresql+psycopg": ("psycopg", "pip install 'psycopg[binary]'"),
    "postgresql+pg8000": ("pg8000", "pip install pg8000"),
    "mysql": ("MySQLdb", "pip install mysqlclient"),
    "mysql+mysqldb": ("MySQLdb", "pip install mysqlclient"),
    "mysql+pymysql": ("pymysql", "pip install PyMySQL"),
    "mssql": ("pyodbc", "pip install pyodbc"),
    "mssql+pyodbc": ("pyodbc", "pip install pyodbc"),
    "mssql+pymssql": ("pymssql", "pip install pymssql"),
}


def _check_driver(scheme: str, where: str) -> None:
    import importlib.util

    module, install = DB_DRIVERS.get(scheme, (None, ""))
    if module is not None and importlib.util.find_spec(module) is None:  # finds it without importing it
        raise StoreError(
            f"the MLflow store {where} needs the database driver {module}, which is not installed",
            hint=f"{install}, or point MLFLOW_TRACKING_URI / tracking_uri in cascade.yaml at another store",
        )


def _default_port(scheme: str) -> int:
    return 5432 if scheme.startswith("postgresql") else 3306 if scheme.startswith("mysql") else 1433


def client(uri: str) -> MlflowClient:
    """A client of the store `uri`; a local sqlite store is created, or repaired, first (under a lock)."""
    import logging
    import os

    from cascade_repro.store import sqlite_store

    # cascade prints its own progress; MLflow's download bars and table-creation notes are noise.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow import MlflowClient

    if not logging.getLogger("cascade_repro").isEnabledFor(logging.DEBUG):
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)
    sqlite_store.create_if_missing(uri)
    sqlite_store.check(uri)
    return MlflowClient(tracking_uri=uri)


@dataclass(frozen=True)
class OpenedRun:
    """The MLflow run a `cascade run` records into: its id, experiment and artifact URI."""

    run_id: str
    experiment_id: str
    experiment: str
    artifact_uri: str
    attached: bool  # an existing run (MLFLOW_RUN_ID set by `mlflow run` or the user)


def open_run(
    mlflow: MlflowClient,
    experiment: str,
    artifact_root: str | None,
    run_name: str | None,
    tags: Mapping[str, str],
    start_ms: int,
    existing_run_id: str | None = None,
) -> OpenedRun:
    """A new run of `experiment` (created with `artifact_root` if missing), or the run a launcher made."""
    try:
        if existing_run_id:
            run = mlflow.get_run(existing_run_id)
            set_tags(mlflow, run.info.run_id, tags)
            name = mlflow.get_experiment(run.info.experiment_id).name
            return OpenedRun(run.info.run_id, run.info.experiment_id, name, run.info.artifact_uri, True)
        experiment_id = _experiment_id(mlflow, experiment, artifact_root)
        run = mlflow.create_run(experiment_id, start_time=start_ms, tags=dict(tags), run_name=run_name)
        return OpenedRun(run.info.run_id, experiment_id, experiment, run.info.artifact_uri, False)
    except Exception as exc:  # MLflow raises many types (MlflowException, SQLAlchemy, requests)
        raise StoreError(
            f"cannot open a run in the MLflow store: {first_line(exc)}",
            hint="check MLFLOW_TRACKING_URI / tracking_uri in cascade.yaml and that the store is writable",
        ) from exc


def _experiment_id(mlflow: MlflowClient, name: str, artifact_root: str | None) -> str:
    """The experiment's id, created if missing (`artifact_root` None: the server's own root); two
    first runs may create it at once."""
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    from mlflow.exceptions import MlflowException

    try:
        return mlflow.create_experiment(name, artifact_location=artifact_root)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        found = mlflow.get_experiment_by_name(name)  # another process created it since the lookup
        if found is None:
            raise
        return str(found.experiment_id)


def _entities(mlflow: Any) -> Any:
    """The entity classes `mlflow`'s `log_batch` takes: MLflow's own, or those of a client that brings
    its own (`sqlite_writer.SqliteWriter`, which writes without importing MLflow)."""
    own = getattr(mlflow, "entities", None)
    if own is not None:
        return own
    from mlflow import entities

    return entities


def log_params(
    mlflow: MlflowClient, run_id: str, flat: Mapping[str, Any], existing: Mapping[str, str] | None = None
) -> list[str]:
    """Log flattened params in batches of 100; returns warnings (truncated keys or values, params
    kept under another name, params the store refused).

    MLflow refuses to change a logged param, and the run may have some already: the script's own
    `mlflow.log_params` (or a framework's), or whoever opened it (`mlflow run`). Theirs stay under
    their names; ours of a key they logged with another value goes under `cascade.<key>`, and the
    warning says so (`existing`: the run's params, read from the store when not given).
    A batch the store refuses is sent again one param at a time, so one bad param costs only itself;
    a store that does not answer raises (the caller keeps the params for later).
    """
    Param = _entities(mlflow).Param

    if existing is None:
        existing = dict(mlflow.get_run(run_id).data.params)
    warnings = []
    kept: list[str] = []  # ours beside theirs, said in one warning
    items = []
    for key, value in flat.items():
        full = value if isinstance(value, str) else json.dumps(value, default=str)
        text = full if len(full) <= MAX_PARAM_VALUE else full[: MAX_PARAM_VALUE - 3] + "..."
        name = _valid_key(key)
        if name in existing and existing[name] not in (text, str(value)):
            renamed = _valid_key(f"cascade.{key}")
            held = existing[name][:80]
            kept.append(f"param {key}={text[:80]} logged as {renamed}: the run already has {key}={held}")
            key, name = f"cascade.{key}", renamed
        if name in existing:
            continue  # the same value, or a cascade.<key> already there (a retried delivery)
        if len(key) > MAX_KEY:
            warnings.append(
                f"param key {key[:60]}... is longer than MLflow's {MAX_KEY} characters: stored as {name}"
            )
        if text != full:
            warnings.append(f"param {key} truncated to MLflow's {MAX_PARAM_VALUE} characters")
        items.append(Param(name, text))
    if kept:
        shown = "; ".join(kept[:5]) + (f"; and {len(kept) - 5} more" if len(kept) > 5 else "")
        warnings.append(f"{shown} (from the script, or whoever opened the run)")
    for batch in _chunks(items, MAX_PER_BATCH):
        warnings += _each_on_refusal(batch, lambda part: mlflow.log_batch(run_id, params=part), "param")
    return warnings


def set_tags(mlflow: MlflowClient, run_id: str, tags: Mapping[str, Any]) -> list[str]:
    """Set tags in batches of 100 (keys and values cut to MLflow's limits); returns warnings for tags
    the store refused (a batch refused is sent again one tag at a time)."""
    RunTag = _entities(mlflow).RunTag
    items = [RunTag(_limited(k), str(v)[:MAX_TAG_VALUE]) for k, v in tags.items() if v is not None]
    warnings = []
    for batch in _chunks(items, MAX_PER_BATCH):
        warnings += _each_on_refusal(batch, lambda part: mlflow.log_batch(run_id, tags=part), "tag")
    return warnings


def _each_on_refusal(batch: list[Any], send: Any, what: str) -> list[str]:
    try:
        send(batch)
        return []
    except Exception as exc:
        if not refused(exc) or len(batch) == 1:
            if refused(exc):
                return [f"the store refused {what} {batch[0].key[:80]!r}: {first_line(exc)}"]
            raise
    warnings = []
    for item in batch:
        try:
            send([item])
        except Exception as exc:
            if not refused(exc):
                raise
            warnings.append(f"the store refused {what} {item.key[:80]!r}: {first_line(exc)}")
    return warnings


def refused(exc: BaseException) -> bool:
    """Whether the store refused a request as invalid (as opposed to not answering: no connection,
    a timeout, a 5xx, a full or locked database; those may pass later)."""
    return str(getattr(exc, "error_code", "")) in REFUSED_CODES


def log_metric_points(
    mlflow: MlflowClient, run_id: str, points: Iterable[tuple[str, float, int, int]]
) -> int:
    """(key, value, timestamp_ms, step) points in batches of ≤ 1000; returns the request count."""
    Metric = _entities(mlflow).Metric
    requests = 0
    metrics = [Metric(_valid_key(k), v, ts, step) for k, v, ts, step in points]
    for batch in _chunks(metrics, MAX_METRICS_PER_BATCH):
        mlflow.log_batch(run_id, metrics=batch)
        requests += 1
    return requests


def log_json(mlflow: MlflowClient, run_id: str, data: Any, artifact_file: str) -> None:
    """`data` as a JSON artifact of the run."""
    mlflow.log_text(run_id, json_text(data), artifact_file)


def json_text(data: Any) -> str:
    """How a JSON artifact's text is written."""
    return json.dumps(data, indent=2, sort_keys=True, default=str)


def log_file(mlflow: MlflowClient, run_id: str, path: Path, artifact_dir: str) -> None:
    """A file as an artifact of the run, under `artifact_dir`."""
    mlflow.log_artifact(run_id, str(path), artifact_dir)


def log_dir(mlflow: MlflowClient, run_id: str, path: Path, artifact_dir: str) -> None:
    """A directory's files as artifacts of the run, under `artifact_dir`."""
    mlflow.log_artifacts(run_id, str(path), artifact_dir)


def finish_run(mlflow: MlflowClient, run_id: str, status: str, end_ms: int) -> None:
    """Close the run with its status and end time."""
    mlflow.set_terminated(run_id, status=status, end_time=end_ms)


def read_json_artifact(mlflow: MlflowClient, run_id: str, artifact_file: str) -> Any:
    """An artifact of the run, parsed as JSON."""
    return json.loads(read_text_artifact(mlflow, run_id, artifact_file))


def read_text_artifact(mlflow: MlflowClient, run_id: str, artifact_file: str) -> str:
    """An artifact of the run as text (StoreError when it has none by that name)."""
    with tempfile.TemporaryDirectory(prefix="cascade-") as tmp:
        try:
            local = mlflow.download_artifacts(run_id, artifact_file, tmp)
        except Exception as exc:
            raise StoreError(f"run {run_id} has no {artifact_file}: {first_line(exc)}") from exc
        return Path(local).read_text(encoding="utf-8")


def search_runs(mlflow: MlflowClient, experiment: str | None, max_results: int = 1000,
                filter_string: str | None = None) -> list[Run]:  # fmt: skip
    """Runs of `experiment` (or of all), newest first, that match an MLflow filter string."""
    try:
        if experiment is None:
            ids = [e.experiment_id for e in mlflow.search_experiments()]
        else:
            found = mlflow.get_experiment_by_name(experiment)
            ids = [found.experiment_id] if found else []
        if not ids:
            return []
        return list(
            mlflow.search_runs(
                ids, filter_string or "", max_results=max_results, order_by=["attributes.start_time DESC"]
            )
        )
    except Exception as exc:
        raise StoreError(f"cannot list runs: {first_line(exc)}", hint="check the tracking URI") from exc


def resolve_run(mlflow: MlflowClient, ref: str, experiment: str | None) -> Run:
    """A run from its id, a unique id prefix, its run name, or its version tag."""
    from mlflow.exceptions import MlflowException

    if len(ref) == 32:
        try:
            return mlflow.get_run(ref)
        except MlflowException:
            pass
    runs = search_runs(mlflow, None)
    exact = [r for r in runs if ref in (r.info.run_name, r.data.tags.get("cascade.version"))]
    prefixed = [r for r in runs if r.info.run_id.startswith(ref)] if len(ref) >= 4 else []
    for matches in (exact, prefixed):
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            preferred = [
                r for r in matches if experiment is None or _experiment_name(mlflow, r) == experiment
            ]
            if len(preferred) == 1:
                return preferred[0]
            ids = ", ".join(r.info.run_id[:12] for r in matches[:5])
            raise RunNotFound(f"{ref!r} matches several runs: {ids}", hint="use more of the run id")
    names = {r.info.run_id: r.info.run_id for r in runs}
    names.update({r.info.run_name: r.info.run_id for r in runs if r.info.run_name})
    names.update(
        {r.data.tags["cascade.version"]: r.info.run_id for r in runs if "cascade.version" in r.data.tags}
    )
    close = difflib.get_close_matches(ref, list(names), n=3, cutoff=0.4)
    hint = f"did you mean {', '.join(close)}?" if close else "list runs with `cascade ls`"
    raise RunNotFound(f"no run {ref!r} in the store", hint=hint)


def _experiment_name(mlflow: MlflowClient, run: Run) -> str:
    return str(mlflow.get_experiment(run.info.experiment_id).name)


def _valid_key(key: str) -> str:
    # MLflow allows alphanumerics, underscores, dashes, periods, spaces, slashes and colons, in a
    # name that is a normalized relative path ("a//b", "/a", "../a" are refused), of ≤ 250 characters.
    import posixpath

    name = "".join(c if c.isalnum() or c in "_-. /:" else "_" for c in key) or "_"
    if posixpath.normpath(name) != name or name.startswith(("/", "..")) or name == ".":
        name = name.replace("/", "_").replace("..", "__")
        name = "_" if name == "." else name
    return _limited(name)


def _limited(key: str) -> str:
    """A key cut to MLflow's 250 characters, kept distinct from other cut keys by a hash of it."""
    if len(key) <= MAX_KEY:
        return key
    import hashlib

    return key[: MAX_KEY - 10] + "-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def first_line(exc: BaseException) -> str:
    """An exception's first line, for a message (MLflow's can carry whole stack traces)."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
