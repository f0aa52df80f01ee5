"""One function per use case: init, run, list, show. The CLI renders what these return."""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from cascade_repro import versions
from cascade_repro.capture.git import head_commit, is_dirty
from cascade_repro.errors import (
    DataError,
    DirtyTreeRefused,
    RestoreRefused,
    RunNotFound,
    StoreError,
    UsageError,
)
from cascade_repro.manifest import ARTIFACT_PATH, Manifest
from cascade_repro.params import ResolvedParams, find_params_file, resolve_params
from cascade_repro.project import InitResult, find_repo_root, init_project
from cascade_repro.recorder import Notify, RunPlan, RunResult, own_paths, record_run
from cascade_repro.settings import Settings, load_settings
from cascade_repro.store import mlflow_store
from cascade_repro.store.dvc_store import Cache

if TYPE_CHECKING:
    from cascade_repro.checkout import Fetched
    from cascade_repro.determinism.verdict import Verdict
    from cascade_repro.restore import RestorePlan, Worktree

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
    version: str | None = None  # `--tag`: label the run once it has finished
    force_version: bool = False
    git_tag: bool = True
    restored_params: ResolvedParams | None = None  # `cascade restore`: the recorded params, as they were
    log_checkpoints: bool = False
    extra_tags: Mapping[str, str] | None = None


def run(request: RunRequest, notify: Notify = lambda message: None) -> RunResult:
    """Record one run of a script. Every check that can refuse happens before the script starts."""
    cwd = (request.cwd or Path.cwd()).resolve()
    environ = dict(os.environ if request.environ is None else request.environ)
    root = find_repo_root(cwd)
    settings = load_settings(root, environ)
    if request.experiment:
        settings = replace(settings, experiment=request.experiment)
    if request.log_checkpoints:
        settings = replace(settings, log_checkpoints=True)
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
        changed = is_dirty(root, exclude) + _dirty_data(root)
        if changed:
            shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
            raise DirtyTreeRefused(
                f"--require-clean: the working tree has uncommitted changes ({shown})",
                hint="commit or stash them, or drop --require-clean to record them as a patch",
            )
    if request.restored_params is not None:
        resolved = request.restored_params
    else:
        params_file = find_params_file(root, script, request.params_file, settings.params_file)
        resolved = resolve_params(params_file, root, request.sets, request.adds, request.seed)
    log.debug("repo root %s, HEAD %s, settings %s", root, commit[:12], _settings_source(root, environ))
    log.debug(
        "params from %s; overrides %s", resolved.source or "(no params file)", resolved.overrides or "none"
    )
    log.debug("seed %d (from %s); determinism %s", resolved.seed, resolved.seed_source,
              request.determinism or settings.determinism)  # fmt: skip
    log.debug(
        "store %s (%s), experiment %s", settings.tracking_uri, _store_source(environ), settings.experiment
    )
    mlflow_store.probe_store(settings.tracking_uri)
    if request.version is not None:
        _check_version_free(settings, root, request)
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
        extra_tags=dict(request.extra_tags or {}),
    )
    result = record_run(plan, notify)
    if request.version is None:
        return result
    if result.status != "FINISHED":
        message = f"not tagged {request.version}: the run {result.status}; `cascade tag {result.run_id[:8]} "
        return replace(result, warnings=(*result.warnings, message + f"{request.version}` tags it anyway"))
    client = mlflow_store.client(settings.tracking_uri)
    tagged = versions.tag_run(client, root, client.get_run(result.run_id), request.version,
                              force=request.force_version, git_tag=request.git_tag)  # fmt: skip
    return replace(result, version=tagged.version)


def _check_version_free(settings: Settings, root: Path, request: RunRequest) -> None:
    """`--tag`: refuse a taken version before the script runs (costs the MLflow import, ~1.5 s)."""
    assert request.version is not None
    versions.validate_version(request.version, root)
    client = mlflow_store.client(settings.tracking_uri)
    experiment = client.get_experiment_by_name(settings.experiment)
    versions.check_free(client, root, request.version, experiment.experiment_id if experiment else None,
                        None, request.force_version, request.git_tag)  # fmt: skip


def _dirty_data(root: Path) -> list[str]:
    from cascade_repro.capture.data import dirty_data  # imports dvc: only for --require-clean

    return [f"{path} (DVC)" for path in dirty_data(root)]


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
        ("--tag", request.version),
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


def list_runs(cwd: Path | None = None, all_experiments: bool = False, limit: int = 50,
              versions_only: bool = False) -> list[RunSummary]:  # fmt: skip
    settings = _context(cwd)
    mlflow_store.probe_store(settings.tracking_uri)
    client = mlflow_store.client(settings.tracking_uri)
    only = f"tags.`{versions.VERSION_TAG}` LIKE '%'" if versions_only else None
    runs = mlflow_store.search_runs(client, None if all_experiments else settings.experiment, limit, only)
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
    settings = _context(cwd)
    mlflow_store.probe_store(settings.tracking_uri)
    client = mlflow_store.client(settings.tracking_uri)
    runs = [mlflow_store.resolve_run(client, ref, settings.experiment) for ref in (ref_a, ref_b)]
    earlier, later = sorted(runs, key=lambda r: r.info.start_time or 0)
    manifests = [_manifest_data(client, r.info.run_id) for r in runs]
    return _judge(client, manifests[0], manifests[1], rtol, atol,
                  record_on=later.info.run_id if record else None, against=earlier.info.run_id)  # fmt: skip


def _judge(client: Any, manifest_a: dict[str, Any], manifest_b: dict[str, Any], rtol: float, atol: float,
           record_on: str | None, against: str, steps: int | None = None) -> Verdict:  # fmt: skip
    from cascade_repro.determinism.verdict import judge  # not on `cascade run`'s start path

    traces = [_trace(client, str(m["run_id"]), m) for m in (manifest_a, manifest_b)]
    verdict = judge(manifest_a, manifest_b, traces[0], traces[1], rtol=rtol, atol=atol, steps=steps)
    if record_on is not None:
        mlflow_store.set_tags(
            client, record_on, {"cascade.verdict": verdict.verdict, "cascade.verified_against": against}
        )
        mlflow_store.log_json(client, record_on, verdict.to_dict(), f"cascade/verify/{against}.json")
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


def tag(ref: str, version: str, force: bool = False, git_tag: bool = True,
        cwd: Path | None = None) -> versions.TagResult:  # fmt: skip
    """Label a recorded run with a version (MLflow tag and annotated git tag)."""
    settings = _context(cwd)
    mlflow_store.probe_store(settings.tracking_uri)
    client = mlflow_store.client(settings.tracking_uri)
    found = mlflow_store.resolve_run(client, ref, settings.experiment)
    return versions.tag_run(client, settings.root, found, version, force=force, git_tag=git_tag)


@dataclass(frozen=True)
class RestoreResult:
    plan: RestorePlan
    worktree: Worktree
    run: RunResult | None  # None with --no-run
    verdict: Verdict | None

    @property
    def reproduced(self) -> bool:
        return self.verdict is not None and self.verdict.reproduced


def restore(
    ref: str,
    cwd: Path | None = None,
    workdir: Path | None = None,
    steps: int | None = None,
    execute: bool = True,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    notify: Notify = lambda message: None,
    show_plan: Callable[[RestorePlan], None] = lambda plan: None,
) -> RestoreResult:
    """Rebuild a recorded run in an isolated worktree, re-run it, and judge the new trace against it."""
    from cascade_repro import checkout as checking
    from cascade_repro import restore as restoring

    settings = _context(cwd)
    root = settings.root
    mlflow_store.probe_store(settings.tracking_uri)
    client = mlflow_store.client(settings.tracking_uri)
    found = mlflow_store.resolve_run(client, ref, settings.experiment)
    run_id = found.info.run_id
    manifest = _manifest_data(client, run_id)
    version = found.data.tags.get(versions.VERSION_TAG)
    if steps is not None and steps < 1:
        raise UsageError("--steps must be a positive number of optimizer steps")
    if steps is not None and not (manifest.get("trace") or {}).get("steps"):
        raise UsageError(f"run {run_id[:12]} has no step trace, so --steps has nothing to compare")
    label = (version or run_id[:12]).replace("/", "_")
    workdir = (workdir or root / ".cascade" / "restore" / label).absolute()
    plan = restoring.plan_restore(manifest, version, workdir, steps, os.environ, settings.env_allow_prefixes,
                                  _this_machine(os.environ, settings))  # fmt: skip
    show_plan(plan)
    if plan.unavailable:
        raise RestoreRefused(
            f"the record names untracked files it did not keep: {', '.join(plan.unavailable[:5])}",
            hint="they were larger than untracked_max_bytes; track such files with `dvc add` next time",
        )
    wanted = _restore_objects(plan, manifest, execute)
    cache = _dvc_cache(root) if wanted or Cache.exists_for(root) else None
    try:
        fetched = (
            [checking.fetch(cache, path, md5, settings.dvc_remote) for path, md5 in wanted] if cache else []
        )
        tree = restoring.materialize(plan, root, client, notify)
        if cache is not None and Cache.exists_for(tree.path) and not tree.reused:
            cache.share_with(tree.path)  # the re-run's checkpoints go to this cache and remote
        for item in fetched:  # verified before the worktree was made; copied in now
            checking.deliver(item, tree.path / item.path, force=False)
    finally:
        if cache is not None:
            cache.close()
    if fetched:
        notify(f"restored {len(fetched)} DVC object(s) into the worktree, md5-verified")
    if not execute:
        return RestoreResult(plan, tree, None, None)
    request = RunRequest(
        script=str(tree.path / plan.script),
        args=plan.argv,
        cwd=tree.path / plan.cwd,
        determinism=plan.determinism,
        run_name=f"restore-{label}",
        experiment=plan.experiment,
        trace_interval=plan.trace_interval,
        environ=_restore_environ(plan, settings),
        restored_params=_recorded_params(manifest),
        extra_tags={
            "cascade.restored_from": run_id,
            **({"cascade.restored_version": version} if version else {}),
        },
    )
    notify(f"re-running {' '.join((plan.script, *plan.argv))} in {tree.path}")
    result = run(request, notify)
    restoring.write_marker(tree.path, plan)  # the re-run's own outputs belong to the state reuse expects
    verdict = _judge(client, manifest, result.manifest.to_dict(), rtol, atol, record_on=result.run_id,
                     against=run_id, steps=steps)  # fmt: skip
    return RestoreResult(plan, tree, result, verdict)


def _restore_objects(plan: RestorePlan, manifest: Mapping[str, Any], execute: bool) -> list[tuple[str, str]]:
    """The data the run read; with --no-run also its kept checkpoints (a re-run starts without them,
    as the original did)."""
    from cascade_repro import checkout as checking

    wanted = checking.data_objects(plan.data)
    if not execute:
        wanted += [
            (str(c["path"]), str(c["md5"]))
            for c in manifest.get("checkpoints") or []
            if c.get("status") == "kept" and c.get("md5") and not os.path.isabs(str(c["path"]))
        ]
    return wanted


def _recorded_params(manifest: Mapping[str, Any]) -> ResolvedParams:
    params = manifest.get("params") or {}
    return ResolvedParams(
        values=dict(params.get("values") or {}),
        source=params.get("source"),
        overrides=dict(params.get("overrides") or {}),
        seed=int(params.get("seed", 0)),
        seed_source="restored",
    )


def _restore_environ(plan: RestorePlan, settings: Settings) -> dict[str, str]:
    """This machine's environment with the record's allow-listed variables, writing to this store."""
    from cascade_repro.child import protocol

    environ = dict(os.environ)
    for name, value in plan.environment.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        environ.pop(name, None)  # the re-run is a new run of the recorded experiment
    environ["MLFLOW_TRACKING_URI"] = settings.tracking_uri
    if plan.steps is not None:
        environ[protocol.ENV_STOP_AFTER] = str(plan.steps)
    return environ


def _this_machine(environ: Mapping[str, str], settings: Settings) -> dict[str, Any]:
    """A partial record of this machine, made without importing torch (restore's plan compares it)."""
    import platform

    from cascade_repro.capture.environment import capture_environment
    from cascade_repro.capture.system import capture_system

    hardware = capture_system(environ)
    hardware.pop("container", None)
    return {
        "torch": {"version": _installed("torch")},
        "python": {"version": platform.python_version()},
        "hardware": hardware,
        "environment": capture_environment(environ, settings.env_allow_prefixes),
    }


def _installed(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version(name)
    except PackageNotFoundError:
        return None


@dataclass(frozen=True)
class CheckoutResult:
    run_id: str
    items: tuple[Fetched, ...]


def checkout(ref: str, checkpoint: str | None = None, data: bool = False, to: Path | None = None,
             force: bool = False, cwd: Path | None = None) -> CheckoutResult:  # fmt: skip
    """Fetch a run's checkpoint and/or data from the DVC cache or remote, md5-verified, into place."""
    from cascade_repro import checkout as checking

    if checkpoint is None and not data:
        checkpoint = "best"
    settings = _context(cwd)
    root = settings.root
    run_id, manifest = _record_of(settings, ref)
    cache = _dvc_cache(root)
    wanted: list[tuple[str, str]] = []
    if checkpoint is not None:
        chosen = checking.select_checkpoint(manifest.get("checkpoints") or [], checkpoint)
        wanted.append((str(chosen["path"]), str(chosen["md5"])))
    if data:
        objects = checking.data_objects(manifest.get("data") or [])
        if not objects:
            raise DataError(f"run {run_id[:12]} recorded no DVC-tracked data it could restore")
        wanted += objects
    items = []
    try:
        for path, md5 in wanted:
            fetched = checking.fetch(cache, path, md5, settings.dvc_remote)
            destination = (to / Path(path).name) if to is not None else root / path
            items.append(checking.deliver(fetched, destination, force))
    finally:
        cache.close()
    return CheckoutResult(run_id, tuple(items))


def checkpoint_path(ref: str, which: str = "best", cwd: Path | None = None) -> Path:
    """The verified DVC cache object of a run's checkpoint (read-only; for `load_checkpoint`)."""
    from cascade_repro import checkout as checking

    settings = _context(cwd)
    _, manifest = _record_of(settings, ref)
    chosen = checking.select_checkpoint(manifest.get("checkpoints") or [], which)
    cache = _dvc_cache(settings.root)
    try:
        return checking.fetch(cache, str(chosen["path"]), str(chosen["md5"]), settings.dvc_remote).object_path
    finally:
        cache.close()


@dataclass(frozen=True)
class PushSummary:
    run_id: str
    remote: str | None
    pushed: int
    failed: tuple[str, ...]


def push(ref: str, cwd: Path | None = None) -> PushSummary:
    """Push a run's kept checkpoints and the data it read to the DVC remote (retry after a failure)."""
    from cascade_repro import checkout as checking

    settings = _context(cwd)
    run_id, manifest = _record_of(settings, ref)
    md5s = [
        str(c["md5"]) for c in manifest.get("checkpoints") or [] if c.get("status") == "kept" and c.get("md5")
    ]
    md5s += [md5 for _, md5 in checking.data_objects(manifest.get("data") or [])]
    if not md5s:
        raise DataError(f"run {run_id[:12]} has no checkpoints or data in the DVC cache to push")
    cache = _dvc_cache(settings.root)
    try:
        missing = [m for m in md5s if not cache.object_path(m).exists()]
        if missing:
            raise DataError(
                f"{len(missing)} object(s) of run {run_id[:12]} are not in this DVC cache: {missing[0]}, ...",
                hint="push from the machine where the run was recorded",
            )
        result = cache.push(md5s, settings.dvc_remote)
    finally:
        cache.close()
    if result.error:
        raise DataError(f"push to the DVC remote failed: {result.error}",
                        hint="configure a reachable remote: `dvc remote list`, `cascade init`")  # fmt: skip
    return PushSummary(run_id, result.remote, result.pushed, result.failed)


def _record_of(settings: Settings, ref: str) -> tuple[str, dict[str, Any]]:
    mlflow_store.probe_store(settings.tracking_uri)
    client = mlflow_store.client(settings.tracking_uri)
    found = mlflow_store.resolve_run(client, ref, settings.experiment)
    return found.info.run_id, _manifest_data(client, found.info.run_id)


def _dvc_cache(root: Path) -> Cache:
    if not Cache.exists_for(root):
        raise DataError(f"{root} is not a DVC repository", hint="run `cascade init` (it runs `dvc init`)")
    return Cache(root)
