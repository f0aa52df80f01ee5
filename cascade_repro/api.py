"""One function per use case: init, run, list, show. The CLI renders what these return."""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from cascade_repro.capture.git import head_commit, is_dirty
from cascade_repro.errors import DirtyTreeRefused, RunNotFound, StoreError, UsageError
from cascade_repro.manifest import ARTIFACT_PATH, Manifest
from cascade_repro.params import find_params_file, resolve_params
from cascade_repro.project import InitResult, find_repo_root, init_project
from cascade_repro.recorder import Notify, RunPlan, RunResult, own_paths, record_run
from cascade_repro.settings import Settings, load_settings
from cascade_repro.store import mlflow_store

if TYPE_CHECKING:
    from cascade_repro.determinism.verdict import Verdict

log = logging.getLogger(__name__)


def init(cwd: Path | None = None) -> InitResult:
    root = find_repo_root(cwd)
    settings = load_settings(root)
    return init_project(root, settings.checkpoints_dir)


@dataclass(frozen=True)
class RunRequest:
    script: str
    args: Sequence[str] = ()
    params_file: str | None = None
    sets: Sequence[str] = ()
    adds: Sequence[str] = ()
    seed: str | None = None
    determinism: str | None = None
    run_name: str | None = None
    experiment: str | None = None
    require_clean: bool = False
    trace_interval: int | None = None
    cwd: Path | None = None
    environ: Mapping[str, str] | None = None


def run(request: RunRequest, notify: Notify = lambda message: None) -> RunResult:
    """Record one run of a script. Every check that can refuse happens before the script starts."""
    cwd = (request.cwd or Path.cwd()).resolve()
    environ = dict(os.environ if request.environ is None else request.environ)
    root = find_repo_root(cwd)
    settings = load_settings(root, environ)
    if request.experiment:
        settings = replace(settings, experiment=request.experiment)
    if request.trace_interval is not None:
        if request.trace_interval < 0:
            raise UsageError("--trace-interval must be 0 (no trace) or a positive number of steps")
        settings = replace(settings, trace_interval=request.trace_interval)
    script = (cwd / request.script).resolve()
    if not script.is_file():
        raise UsageError(f"script not found: {request.script}", hint=f"give a path relative to {cwd}")
    try:
        script_rel = script.relative_to(root).as_posix()
    except ValueError:
        raise UsageError(
            f"{request.script} is outside the git repository {root}",
            hint="cascade records code through git: move the script into the repository",
        ) from None
    commit = head_commit(root)
    exclude = own_paths(settings)
    if request.require_clean:
        changed = is_dirty(root, exclude)
        if changed:
            shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
            raise DirtyTreeRefused(
                f"--require-clean: the working tree has uncommitted changes ({shown})",
                hint="commit or stash them, or drop --require-clean to record them as a patch",
            )
    params_file = find_params_file(root, script, request.params_file, settings.params_file)
    resolved = resolve_params(params_file, root, request.sets, request.adds, request.seed)
    log.debug("repo root %s, HEAD %s, settings %s", root, commit[:12], _settings_source(root, environ))
    log.debug("params from %s; overrides %s", params_file or "(no params file)", resolved.overrides or "none")
    log.debug("seed %d (from %s); determinism %s", resolved.seed, resolved.seed_source,
              request.determinism or settings.determinism)  # fmt: skip
    log.debug(
        "store %s (%s), experiment %s", settings.tracking_uri, _store_source(environ), settings.experiment
    )
    mlflow_store.probe_store(settings.tracking_uri)
    plan = RunPlan(
        settings=settings,
        script=script,
        script_rel=script_rel,
        args=tuple(request.args),
        cwd=cwd,
        commit=commit,
        params=resolved,
        determinism=request.determinism or settings.determinism,
        run_name=request.run_name,
        environ=environ,
        exclude=exclude,
        invocation=("cascade", "run", *_invocation_options(request), request.script, *request.args),
    )
    return record_run(plan, notify)


def _settings_source(root: Path, environ: Mapping[str, str]) -> str:
    overrides = sorted(k for k in environ if k.startswith("CASCADE_"))
    base = "cascade.yaml" if (root / "cascade.yaml").is_file() else "defaults (no cascade.yaml)"
    return base + (f" + {', '.join(overrides)}" if overrides else "")


def _store_source(environ: Mapping[str, str]) -> str:
    for name in ("MLFLOW_TRACKING_URI", "CASCADE_TRACKING_URI"):
        if environ.get(name):
            return f"from {name}"
    return "from cascade.yaml or MLflow's default"


def _invocation_options(request: RunRequest) -> list[str]:
    options: list[str] = []
    for flag, values in (("--set", request.sets), ("--add", request.adds)):
        for assignment in values:
            options += [flag, assignment]
    single: tuple[tuple[str, str | None], ...] = (
        ("--params", request.params_file),
        ("--seed", request.seed),
        ("--deterministic", request.determinism),
        ("--name", request.run_name),
    )
    for flag, value in single:
        if value is not None:
            options += [flag, value]
    return options


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    name: str | None
    experiment: str
    version: str | None
    status: str
    start_time: float | None
    duration_s: float | None
    commit: str | None
    dirty: bool | None
    metrics: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _context(cwd: Path | None) -> Settings:
    root = find_repo_root(cwd)
    return load_settings(root)


def list_runs(cwd: Path | None = None, all_experiments: bool = False, limit: int = 50) -> list[RunSummary]:
    settings = _context(cwd)
    mlflow_store.probe_store(settings.tracking_uri)
    client = mlflow_store.client(settings.tracking_uri)
    runs = mlflow_store.search_runs(client, None if all_experiments else settings.experiment, limit)
    names: dict[str, str] = {}
    summaries = []
    for run in runs:
        info, data = run.info, run.data
        if info.experiment_id not in names:
            names[info.experiment_id] = client.get_experiment(info.experiment_id).name
        end = info.end_time
        summaries.append(
            RunSummary(
                run_id=info.run_id,
                name=info.run_name,
                experiment=names[info.experiment_id],
                version=data.tags.get("cascade.version"),
                status=info.status,
                start_time=info.start_time / 1000 if info.start_time else None,
                duration_s=(end - info.start_time) / 1000 if end and info.start_time else None,
                commit=data.tags.get("mlflow.source.git.commit"),
                dirty={"true": True, "false": False}.get(data.tags.get("cascade.dirty", "")),
                metrics=_key_metrics(data.metrics, settings.key_metrics),
            )
        )
    return summaries


def _key_metrics(metrics: Mapping[str, float], configured: Sequence[str]) -> dict[str, float]:
    if configured:
        return {k: metrics[k] for k in configured if k in metrics}
    own = sorted(k for k in metrics if not k.startswith("cascade."))
    return {k: metrics[k] for k in own[:3]}


@dataclass(frozen=True)
class RunRecord:
    """`cascade show`: the manifest plus what MLflow knows beyond it."""

    manifest: Manifest
    status: str
    metrics: dict[str, float]
    tags: dict[str, str]
    artifact_uri: str
    trace: TraceSummary | None = None


@dataclass(frozen=True)
class TraceSummary:
    """`cascade show --trace`: what the step trace holds, and the loss curve's extremes."""

    steps: int
    first_step: int | None
    last_step: int | None
    algorithm: str | None
    interval: int | None
    loss_first: float | None
    loss_last: float | None
    loss_min: tuple[int, float] | None  # (step, value)
    loss_max: tuple[int, float] | None
    nonfinite_losses: int


def show_run(ref: str, cwd: Path | None = None, trace: bool = False) -> RunRecord:
    settings = _context(cwd)
    mlflow_store.probe_store(settings.tracking_uri)
    client = mlflow_store.client(settings.tracking_uri)
    run = mlflow_store.resolve_run(client, ref, settings.experiment)
    data = _manifest_data(client, run.info.run_id)
    manifest = Manifest.from_dict(data)
    summary = (
        _summarize_trace(_trace(client, run.info.run_id, data), data.get("trace") or {}) if trace else None
    )
    return RunRecord(
        manifest, run.info.status, dict(run.data.metrics), dict(run.data.tags), run.info.artifact_uri, summary
    )


def _summarize_trace(records: list[dict[str, Any]], header: Mapping[str, Any]) -> TraceSummary:
    losses = [(int(r["step"]), float(r["loss"]["value"])) for r in records if r.get("loss")]
    finite = [(step, value) for step, value in losses if math.isfinite(value)]
    return TraceSummary(
        steps=len(records),
        first_step=records[0]["step"] if records else None,
        last_step=records[-1]["step"] if records else None,
        algorithm=header.get("algorithm"),
        interval=header.get("interval"),
        loss_first=losses[0][1] if losses else None,
        loss_last=losses[-1][1] if losses else None,
        loss_min=min(finite, key=lambda item: item[1]) if finite else None,
        loss_max=max(finite, key=lambda item: item[1]) if finite else None,
        nonfinite_losses=len(losses) - len(finite),
    )


def verify(
    ref_a: str,
    ref_b: str,
    cwd: Path | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    record: bool = True,
) -> Verdict:
    """Compare two recorded runs step by step; record the verdict on the later one."""
    from cascade_repro.determinism.verdict import judge  # not on `cascade run`'s start path

    settings = _context(cwd)
    mlflow_store.probe_store(settings.tracking_uri)
    client = mlflow_store.client(settings.tracking_uri)
    runs = [mlflow_store.resolve_run(client, ref, settings.experiment) for ref in (ref_a, ref_b)]
    manifests = [_manifest_data(client, r.info.run_id) for r in runs]
    traces = [_trace(client, r.info.run_id, m) for r, m in zip(runs, manifests, strict=True)]
    verdict = judge(manifests[0], manifests[1], traces[0], traces[1], rtol=rtol, atol=atol)
    if record:
        earlier, later = sorted(runs, key=lambda r: r.info.start_time or 0)
        mlflow_store.set_tags(
            client,
            later.info.run_id,
            {"cascade.verdict": verdict.verdict, "cascade.verified_against": earlier.info.run_id},
        )
        mlflow_store.log_json(
            client, later.info.run_id, verdict.to_dict(), f"cascade/verify/{earlier.info.run_id}.json"
        )
    return verdict


def _manifest_data(client: Any, run_id: str) -> dict[str, Any]:
    try:
        data = mlflow_store.read_json_artifact(client, run_id, ARTIFACT_PATH)
    except StoreError:
        raise RunNotFound(
            f"run {run_id} has no cascade record ({ARTIFACT_PATH})",
            hint="it was not made by `cascade run`, or its recording stopped before the record was written",
        ) from None
    return dict(data)


def _trace(client: Any, run_id: str, manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    section = manifest.get("trace") or {}
    if not section.get("artifact"):
        return []
    text = mlflow_store.read_text_artifact(client, run_id, section["artifact"])
    records = []
    for line in text.splitlines():
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError:
                break  # a run killed mid-write: its trace ends at the last whole record
    return records
