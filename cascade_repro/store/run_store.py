"""The runs cascade reads and labels, behind one interface: find a run, read its record and
artifacts, tag it, list runs. Nothing above `store/` sees an MLflow type or exception.

    store = RunStore.open(settings)          # probes the store first: a clear error, never a hang
    run = store.resolve("v1.2.3")            # id, unique id prefix, run name or version
    record = store.record(run.run_id)        # the checked, typed record (`Manifest.from_dict`)

Over MLflow's client, chosen from the tracking URI (a local sqlite file, a database, a tracking
server); `resolve(ref, fast=True)` first tries the embedded store's fast path (`local_record`: one
read-only query, artifacts read as files, no MLflow import), for commands that must start quickly.
`open_run` opens the run `cascade run` records; what it then writes (params, metrics, artifacts,
the end) goes through the delivery outbox (`delivery.py`), which keeps what the store refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Iterator, Mapping

from cascade_repro.errors import CascadeError, RunNotFound, StoreError
from cascade_repro.manifest import ARTIFACT_PATH, Manifest
from cascade_repro.record_shape import MAX_DEPTH, malformed
from cascade_repro.store import local_record, mlflow_store, sqlite_writer

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from cascade_repro.settings import Settings

RECORD_ARTIFACT = ARTIFACT_PATH
VERSION_TAG = local_record.VERSION_TAG  # a run's version label (`cascade tag`, `--tag`)
USER_TAG = local_record.USER_TAG  # who started the run (MLflow's own tag; the UI shows it)
HEARTBEAT_TAG = local_record.HEARTBEAT_TAG  # when its cascade process last said it was alive


@dataclass(frozen=True)
class StoredRun:
    """A run as the store holds it, beside its record: status, times, tags, metrics' last values."""

    run_id: str
    name: str | None = None
    experiment_id: str | None = None
    status: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    artifact_uri: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def version(self) -> str | None:
        return self.tags.get(VERSION_TAG)

    @property
    def user(self) -> str | None:
        return self.tags.get(USER_TAG)

    @property
    def heartbeat_s(self) -> float | None:
        """When the run's cascade process last told the store it was alive (epoch seconds)."""
        try:
            return float(self.tags[HEARTBEAT_TAG])
        except (KeyError, ValueError):
            return None

    @classmethod
    def of_row(cls, row: local_record.RunRow) -> StoredRun:
        """From the embedded store's tables, read without MLflow."""
        return cls(
            run_id=row.run_id, name=row.name, experiment_id=row.experiment_id, status=row.status,
            start_ms=row.start_ms, end_ms=row.end_ms, artifact_uri=row.artifact_uri, tags=row.tags,
            metrics=row.metrics,
        )  # fmt: skip

    @classmethod
    def of(cls, run: Any) -> StoredRun:
        """From MLflow's `Run`."""
        info, data = run.info, run.data
        start_ms, end_ms = local_record.run_times(info.start_time, info.end_time)
        return cls(
            run_id=info.run_id, name=info.run_name, experiment_id=info.experiment_id, status=info.status,
            start_ms=start_ms, end_ms=end_ms, artifact_uri=info.artifact_uri,
            tags=dict(data.tags), metrics=dict(data.metrics),
        )  # fmt: skip


class RunStore:
    """One project's store of runs (`tracking_uri`), with `experiment` preferred where a ref is ambiguous."""

    def __init__(self, tracking_uri: str, experiment: str | None, fast_reads: bool = False) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        # Read commands on the embedded store read MLflow's tables directly (no MLflow import).
        self._tables = local_record.LocalStore.open(tracking_uri, os.environ) if fast_reads else None
        self._client: MlflowClient | None = None
        self._local: dict[str, local_record.LocalRun] = {}  # runs found by the fast path
        self._experiment_names: dict[str, str] = {}

    @classmethod
    def open(cls, settings: Settings, fast_reads: bool = False) -> RunStore:
        """The project's store, probed (unreachable server, missing driver: a StoreError that says so).

        `fast_reads`: for commands that only read (ls, show, verify, diff): on the embedded sqlite
        store, runs are found and listed from MLflow's tables and their artifacts read as files,
        without importing MLflow (~2-3 s); anything else goes through MLflow as before."""
        mlflow_store.probe_store(settings.tracking_uri)
        return cls(settings.tracking_uri, settings.experiment, fast_reads)

    @property
    def client(self) -> MlflowClient:
        """MLflow's client, made on first use (importing MLflow costs 1.5-2.5 s)."""
        if self._client is None:
            self._client = mlflow_store.client(self.tracking_uri)
        return self._client

    # -- finding runs -------------------------------------------------------------------------
    def resolve(self, ref: str, fast: bool = False) -> StoredRun:
        """The run `ref` names: its id, a unique id prefix, its run name, or its version."""
        if fast or self._tables is not None:
            local = local_record.find(self.tracking_uri, ref)
            if local is not None:
                self._local[local.run_id] = local
                if self._tables is None:  # (the id and version are all a fast caller reads)
                    version = {VERSION_TAG: local.version} if local.version else {}
                    return StoredRun(local.run_id, tags=version)
                row = self._tables.run(local.run_id)
                if row is not None:
                    return StoredRun.of_row(row)  # (else locked past the timeout: MLflow says)
        with translated(f"finding run {ref!r}"):
            try:
                return StoredRun.of(mlflow_store.resolve_run(self.client, ref, self.experiment))
            except RunNotFound as exc:
                runs = mlflow_store.search_runs(self.client, None)
                known = [(r.info.run_id, r.info.run_name, r.data.tags.get(VERSION_TAG)) for r in runs]
                raise (unresolved(ref, known) or exc) from None

    def get(self, run_id: str) -> StoredRun:
        row = self._tables.run(run_id) if self._tables is not None else None
        if row is not None:
            return StoredRun.of_row(row)
        with translated(f"reading run {run_id}"):
            return StoredRun.of(self.client.get_run(run_id))

    def search(
        self, all_experiments: bool = False, limit: int = 1000, where: str | None = None
    ) -> list[StoredRun]:
        """Newest first, in the project's experiment (or all); `where`: an MLflow filter string."""
        experiment = None if all_experiments else self.experiment
        return [StoredRun.of(r) for r in mlflow_store.search_runs(self.client, experiment, limit, where)]

    def listed(self, all_experiments: bool = False, limit: int = 50, versions_only: bool = False,
               user: str | None = None, running: bool = False) -> list[StoredRun]:  # fmt: skip
        """`cascade ls`: newest first, in the project's experiment (or all); `versions_only`: labelled;
        `user`: started by that user (MLflow's `mlflow.user`); `running`: still RUNNING in the store."""
        status = "RUNNING" if running else None
        if self._tables is not None:
            experiment = None if all_experiments else self.experiment
            rows = self._tables.runs(experiment, limit, versions_only, user, status)
            if rows is not None:
                return [StoredRun.of_row(row) for row in rows]
        where = [f"tags.`{VERSION_TAG}` LIKE '%'"] if versions_only else []
        if user is not None:
            where.append(f"tags.`{USER_TAG}` = '{_quoted(user)}'")
        if status is not None:
            where.append(f"attributes.status = '{status}'")
        return self.search(all_experiments, limit, " AND ".join(where) or None)

    def tagged(self, experiment_id: str, key: str, value: str, limit: int = 5) -> list[str]:
        """Ids of the experiment's runs whose tag `key` is `value`, newest first."""
        if self._tables is not None and experiment_id.isdigit():
            found = self._tables.tagged(experiment_id, key, value, limit)
            if found is not None:
                return found
        escaped = value.replace("'", "\\'")
        return self.search_ids([experiment_id], f"tags.`{key}` = '{escaped}'", limit)

    def search_ids(self, experiment_ids: list[str], where: str, limit: int) -> list[str]:
        """Ids of the runs of those experiments that match an MLflow filter string, newest first."""
        with translated("searching runs"):
            found = self.client.search_runs(experiment_ids, filter_string=where, max_results=limit,
                                            order_by=["attributes.start_time DESC"])  # fmt: skip
        return [run.info.run_id for run in found]

    def experiment_name(self, experiment_id: str) -> str:
        if experiment_id not in self._experiment_names and self._tables is not None:
            name = self._tables.experiment_name(experiment_id)
            if name is not None:
                self._experiment_names[experiment_id] = name
        if experiment_id not in self._experiment_names:
            with translated(f"reading experiment {experiment_id}"):
                self._experiment_names[experiment_id] = str(self.client.get_experiment(experiment_id).name)
        return self._experiment_names[experiment_id]

    def experiment_id(self, name: str | None = None) -> str | None:
        """The id of experiment `name` (default: the project's), None when it does not exist yet."""
        if self._tables is not None:
            found_here = self._tables.experiment_id(name or self.experiment or "")
            if found_here is not None:
                return found_here
        with translated("reading experiments"):
            found = self.client.get_experiment_by_name(name or self.experiment or "")
        return found.experiment_id if found else None

    # -- reading records and artifacts --------------------------------------------------------
    def record(self, run_id: str) -> Manifest:
        """The run's record, its schema and shape checked whole (it may come from a shared server)."""
        try:
            text = self.text(run_id, RECORD_ARTIFACT)
        except StoreError:
            raise RunNotFound(
                f"run {run_id} has no cascade record ({RECORD_ARTIFACT})",
                hint="it was not made by `cascade run`, or its recording stopped before the record was "
                "written",
            ) from None
        except UnicodeDecodeError as exc:  # the record is there, and not what cascade wrote
            raise malformed(run_id, f"{RECORD_ARTIFACT} is not UTF-8 text (byte {exc.start})") from None
        try:
            data = json.loads(text)
        except RecursionError:
            raise malformed(run_id, f"{RECORD_ARTIFACT} is nested more than {MAX_DEPTH} levels") from None
        except ValueError as exc:  # truncated, or not JSON at all
            raise malformed(run_id, f"{RECORD_ARTIFACT} is not readable JSON ({exc})") from None
        if not isinstance(data, dict):
            raise malformed(run_id, f"{RECORD_ARTIFACT} is a JSON {type(data).__name__}, not an object")
        return Manifest.from_dict(data, run_id)

    def text(self, run_id: str, artifact: str) -> str:
        """An artifact's text (StoreError when the run has none by that name)."""
        local = self._local.get(run_id)
        if local is not None:
            source = (local.artifact_dir / artifact).resolve()
            if not source.is_relative_to(local.artifact_dir.resolve()) or not source.is_file():
                raise StoreError(f"run {run_id} has no artifact {artifact}")
            return source.read_text(encoding="utf-8")
        return mlflow_store.read_text_artifact(self.client, run_id, artifact)

    @contextlib.contextmanager
    def open_binary(self, run_id: str, artifact: str) -> Iterator[IO[bytes]]:
        """An artifact's bytes as a file to read a bounded piece at a time (a trace may be long, and a
        line of one unbounded); StoreError when the run has none by that name."""
        local = self._local.get(run_id)
        if local is not None:
            source = (local.artifact_dir / artifact).resolve()
            if not source.is_relative_to(local.artifact_dir.resolve()) or not source.is_file():
                raise StoreError(f"run {run_id} has no artifact {artifact}")
            with open(source, "rb") as stream:
                yield stream
            return
        with tempfile.TemporaryDirectory(prefix="cascade-") as tmp:
            try:
                path = self.client.download_artifacts(run_id, artifact, tmp)
            except Exception as exc:
                raise StoreError(f"run {run_id} has no {artifact}: {mlflow_store.first_line(exc)}") from exc
            with open(path, "rb") as stream:
                yield stream

    def download_artifacts(self, run_id: str, artifact: str, into: str) -> str:
        """An artifact (file or directory) copied under `into`, at its own path there; its local path."""
        local = self._local.get(run_id)
        if local is not None:
            return local.download_artifacts(run_id, artifact, into)
        with translated(f"downloading {artifact} of run {run_id}"):
            return str(self.client.download_artifacts(run_id, artifact, into))

    def artifact_names(self, run_id: str, directory: str) -> set[str]:
        """The paths of what the run holds directly in `directory` (files and directories)."""
        with translated(f"listing {directory} of run {run_id}"):
            return {str(info.path) for info in self.client.list_artifacts(run_id, directory)}

    # -- recording a run ---------------------------------------------------------------------
    def recording_client(self, existing_run_id: str | None = None) -> Any:
        """What a run's recording writes through: on the embedded store, for a new run of an
        experiment that exists, MLflow's tables and files directly (`sqlite_writer`: no MLflow import,
        whose ~2 s of CPU would be taken from the training); otherwise MLflow's client."""
        if existing_run_id is None:
            experiment = self.experiment or "Default"
            direct = sqlite_writer.SqliteWriter.open(self.tracking_uri, experiment, os.environ)
            if direct is not None:
                return direct
        return self.client

    def open_run(self, artifact_root: str | None, run_name: str | None, tags: Mapping[str, str],
                 start_ms: int, existing_run_id: str | None = None,
                 client: Any = None) -> mlflow_store.OpenedRun:  # fmt: skip
        """A new run of the experiment (made with `artifact_root` if it is new), or the existing one;
        written through `client` (a `recording_client`) where given, else MLflow's."""
        return mlflow_store.open_run(client or self.client, self.experiment or "Default", artifact_root,
                                     run_name, tags, start_ms, existing_run_id=existing_run_id)  # fmt: skip

    # -- labelling runs -----------------------------------------------------------------------
    def set_tags(self, run_id: str, tags: Mapping[str, Any]) -> list[str]:
        """Tags in batches; the ones the store refused (a value too long, a bad key), one line each.

        On the embedded store opened for `fast_reads`, short tags are written without MLflow (its
        import is most of what `cascade verify` or `cascade tag` would take)."""
        if self._tables is not None:
            text = {key: str(value) for key, value in tags.items() if value is not None}
            if self._tables.set_tags(run_id, text):
                return []
        return mlflow_store.set_tags(self.client, run_id, tags)

    def delete_tag(self, run_id: str, key: str) -> None:
        if self._tables is not None and self._tables.delete_tag(run_id, key):
            return  # the embedded store, as `set_tags`; MLflow says why where it was not removed
        with translated(f"removing tag {key} from run {run_id}"):
            self.client.delete_tag(run_id, key)

    def log_json(self, run_id: str, data: Any, artifact_file: str) -> None:
        local = self._local.get(run_id) if self._tables is not None else None
        if local is not None and local.write_text(artifact_file, mlflow_store.json_text(data)):
            return  # a run found by the fast path: its artifacts are files (`set_tags`)
        with translated(f"storing {artifact_file} in run {run_id}"):
            mlflow_store.log_json(self.client, run_id, data, artifact_file)

    def log_file(self, run_id: str, path: Path, artifact_dir: str) -> None:
        """A file as an artifact of the run, under `artifact_dir`."""
        with translated(f"storing {path.name} in run {run_id}"):
            mlflow_store.log_file(self.client, run_id, path, artifact_dir)

    def discard(self, run_id: str, why: str) -> None:
        """Delete the run from the store (`mlflow gc` purges it), saying why in a tag first."""
        with translated(f"deleting run {run_id}"):
            self.client.set_tag(run_id, "cascade.discarded", why)
            self.client.delete_run(run_id)


def _quoted(value: str) -> str:
    """A value for an MLflow filter string's single quotes (which has no escape for them)."""
    if "'" in value:
        raise CascadeError(f"cannot search for {value!r}: MLflow's filter strings cannot hold a quote")
    return value


MIN_PREFIX = 4  # the shortest run id prefix a ref may be (mlflow_store.resolve_run, local_record)


def unresolved(ref: str, runs: list[tuple[str, str | None, str | None]]) -> RunNotFound | None:
    """Why `ref` names no single run of `runs` (id, name, version), with the fix: a prefix too short,
    a name several runs share (their ids named), a close match that is itself unique; None: as before."""
    ids = [run_id for run_id, _, _ in runs]
    named = [run_id for run_id, name, version in runs if ref in (name, version)]
    if len(named) > 1:
        shown = ", ".join(run_id[:12] for run_id in named[:5]) + (" …" if len(named) > 5 else "")
        return RunNotFound(f"{len(named)} runs are named {ref!r}: {shown}",
                           hint=f"use one of their run ids instead, e.g. {named[0][:12]}")  # fmt: skip
    lowered = ref.lower()
    starting = [run_id for run_id in ids if run_id.startswith(lowered)] if lowered else []
    if starting and not named and len(ref) < MIN_PREFIX:
        which = (
            f"e.g. {starting[0][:8]}"
            if len(starting) == 1
            else f"{len(starting)} run ids start with it: " + ", ".join(run_id[:8] for run_id in starting[:5])
        )
        return RunNotFound(
            f"run id prefix {ref!r} is too short: use at least {MIN_PREFIX} characters",
            hint=f"type {MIN_PREFIX} or more characters of the run id ({which})",
        )
    if named or starting:
        return None  # (found, or a prefix several runs share: MLflow's message lists them)
    import difflib

    labels: dict[str, list[str]] = {}
    for run_id, name, version in runs:
        for label in {name, version} - {None}:
            labels.setdefault(str(label), []).append(run_id)
    close = difflib.get_close_matches(ref, [*labels, *ids], n=3, cutoff=0.4)
    if not close:
        return RunNotFound(f"no run {ref!r} in the store", hint="list runs with `cascade ls`")
    unique = [label for label in close if len(labels.get(label, ())) <= 1]
    said = f"did you mean {' or '.join(unique)}?" if unique else ""
    for label in close:  # a name several runs share names none of them: their ids do
        shared = labels.get(label, [])
        if len(shared) > 1:
            said += (f" {len(shared)} runs are named {label}: use one of their ids, "
                     f"{', '.join(run_id[:12] for run_id in shared[:5])}")  # fmt: skip
    return RunNotFound(f"no run {ref!r} in the store", hint=said.strip())


@contextlib.contextmanager
def translated(doing: str) -> Iterator[None]:
    """MLflow's exceptions (and a driver's, a server's) as cascade's StoreError, saying what failed."""
    try:
        yield
    except CascadeError:
        raise
    except Exception as exc:
        raise StoreError(
            f"{doing}: {mlflow_store.first_line(exc)}", hint="check the tracking URI and the store"
        ) from exc
