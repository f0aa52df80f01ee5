"""Recording and listing runs: init, run (with --tag), ls, tag."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from cascade_repro import __version__, distributed, run_target
from cascade_repro.api.spooled import finish_dead_runs
from cascade_repro.capture.git import is_dirty
from cascade_repro.errors import CascadeError, DirtyTreeRefused, UsageError
from cascade_repro.params import ResolvedParams, find_params_file, resolve_params
from cascade_repro.project import InitResult, find_repo_root, init_project, preview_init
from cascade_repro.run_engine import follow_rank, own_paths, record_run
from cascade_repro.run_plan import ContainerPlan, Notify, RunPlan, RunResult
from cascade_repro.settings import (
    SETTINGS_VARIABLES,
    TRACE_BUDGET_EXPECTED,
    Settings,
    load_settings,
    trace_budget,
)
from cascade_repro.store import git_repo, mlflow_store, sqlite_store
from cascade_repro.store.git_repo import head_commit

if TYPE_CHECKING:
    from cascade_repro.images.prepare import PreparedImage

log = logging.getLogger(__name__)


def init(cwd: Path | None = None) -> InitResult:
    """`cascade init`: cascade.yaml, hyperparameters.yaml, the ignores, `dvc init` and a DVC remote
    (a local directory unless one is configured), in the git repository containing `cwd`."""
    root = find_repo_root(cwd)
    settings = load_settings(root)
    return init_project(root, settings.checkpoints_dir, settings.experiment)


@dataclass(frozen=True)
class RunRequest:
    """What `cascade run` was asked to do; `run()` turns it into a plan and records the run.

    The script and its arguments (`script`, `args`; `module`, one run by its name); its hyperparameters
    (`params_file`, overrides `sets` and `adds` as KEY=VALUE, `seed`, `restored_params` when restore
    replays a record); how it runs (`determinism` mode, `trace_interval`, `cwd`, `environ`,
    `nproc_per_node` for torchrun, `nnodes`, `rdzv_endpoint` and `rdzv_id` for a job over several
    machines, and in a container: `docker`, `gpus`, `shm_size`, `image`, `no_cache`); what is recorded
    (`run_name`, `experiment`, `extra_tags`, `log_checkpoints`, `track_inputs`, `require_clean`); and
    the label given once it finished (`version`, `force_version`, `git_tag`).
    """

    script: str  # its path; with `module`: "" (found from the name), or the module's file (a restore)
    args: Sequence[str] = ()
    module: str | None = None  # `cascade run -m MODULE`: run by its name, as `python -m MODULE`
    params_file: str | None = None
    sets: Sequence[str] = ()
    adds: Sequence[str] = ()
    seed: str | None = None
    determinism: str | None = None
    run_name: str | None = None
    experiment: str | None = None
    require_clean: bool = False
    trace_interval: int | None = None
    trace_budget: float | None = None  # `--trace-budget`: share of step time for weights' fingerprints
    trace_schedule: tuple[tuple[int, int], ...] | None = None  # restore: the steps sampled, as recorded
    trace_records: tuple[tuple[int, int], ...] | None = None  # restore: the steps with a record, as recorded
    cwd: Path | None = None
    environ: Mapping[str, str] | None = None
    version: str | None = None  # `--tag`: label the run once it has finished
    force_version: bool = False
    git_tag: bool = True
    restored_params: ResolvedParams | None = None  # `cascade restore`: the recorded params, as they were
    log_checkpoints: bool = False
    extra_tags: Mapping[str, str] | None = None
    docker: bool | None = None  # `--docker`: in the project's image (None: docker.enabled in cascade.yaml)
    gpus: str | None = None  # all | none | auto | N (default: docker.gpus in cascade.yaml, else auto)
    shm_size: str | None = None
    image: PreparedImage | None = None  # restore: the image chosen (recorded or rebuilt) before the run
    no_cache: bool = False  # rebuild the image even when one with the same inputs exists
    track_inputs: bool = False  # files read that neither git nor DVC tracks go into the DVC cache
    nproc_per_node: int | None = None  # `--nproc-per-node N`: torchrun starts N ranks on this machine
    nnodes: int | None = None  # `--nnodes N`: this machine is one of N nodes (api/nodes.py)
    rdzv_endpoint: str | None = None  # with nnodes: HOST:PORT of the c10d rendezvous, the same on each node
    rdzv_id: str | None = None  # with nnodes: the job's id (default: made from the commit and command)


def note_redirected_logs(result: RunResult, cwd: Path | None = None) -> None:
    """Once `cascade run` has printed its last lines: the files its stdout and stderr go to inside the
    repository (`> run.log 2>&1`), noted again as the run's outputs as they are now. The run noted
    them before those lines went in, so the next run found them changed since: dirty, and stored
    again as untracked files (capture/earlier_outputs.py). Never fails the run."""
    if not result.run_id or result.discarded or result.rank is not None:
        return
    from cascade_repro.capture import earlier_outputs
    from cascade_repro.capture.files import redirected_outputs

    try:
        root = find_repo_root((cwd or Path.cwd()).resolve())
        logs = redirected_outputs(root)
        if logs:
            earlier_outputs.remember(root, result.run_id, logs)
    except Exception as exc:  # the next run records them as untracked files, as it would have
        log.debug("redirected logs not noted: %s", exc)


def run(request: RunRequest, notify: Notify = lambda message: None) -> RunResult:
    """Record one run of a script. Every check that can refuse happens before the script starts."""
    cwd = (request.cwd or Path.cwd()).resolve()
    environ = dict(os.environ if request.environ is None else request.environ)
    root = find_repo_root(cwd)
    settings = _settings_for(request, root, environ)
    if request.module is not None and not request.script:
        script, script_rel = _module_in_repository(request.module, root, cwd)
    else:
        script, script_rel = _script_in_repository(request.script, root, cwd)
    commit = head_commit(root)
    nodes = distributed.nodes_launch(request.nnodes, request.nproc_per_node, request.rdzv_endpoint, environ)
    if nodes is not None:  # this machine is one node of the job: its torchrun, a `cascade run` per rank
        return _run_as_node(request, nodes, settings, script_rel, commit, cwd, notify)
    exclude = own_paths(settings)
    if request.require_clean:
        _refuse_dirty(root, exclude)
    if request.track_inputs and request.restored_params is None:  # (a restore re-runs as recorded)
        _refuse_track_inputs_without_dvc(settings)
    if request.restored_params is not None:
        resolved = request.restored_params
    else:
        params_file = find_params_file(root, script, request.params_file, settings.params_file)
        resolved = resolve_params(params_file, root, request.sets, request.adds, request.seed)
    _log_start(request, settings, environ, commit, resolved)
    mlflow_store.probe_store(settings.tracking_uri)
    sqlite_store.create_if_missing(settings.tracking_uri)  # before any script: never two at once
    if request.version is not None:
        _check_version_free(settings, root, request)
    layout = distributed.launched(request.nproc_per_node, environ) or distributed.joined(environ)
    in_docker = _in_docker(request, settings, layout)
    container = _container_plan(request, settings, commit, exclude, notify) if in_docker else None
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
        invocation=_invocation(request, script_rel),
        extra_tags=dict(request.extra_tags or {}),
        container=container,
        track_inputs=request.track_inputs,
        trace_schedule=request.trace_schedule,
        trace_records=request.trace_records,
        distributed=layout,
        module=request.module,
    )
    if layout is not None and layout.rank > 0:  # the user's torchrun: rank 0's `cascade run` records
        return follow_rank(plan, layout, notify)
    if request.restored_params is None:  # a restore's worktree is not the user's project
        _advise_init_once(settings, notify)
    # Runs whose `cascade run` died are delivered meanwhile, never delaying this script's start.
    recovering = finish_dead_runs(settings, notify, background=True)
    try:
        result = record_run(plan, notify)
    finally:
        if recovering is not None:
            recovering.join()
    result = _after_usage_error(result, settings, restore=request.restored_params is not None)
    return _tagged(result, request, settings)


def _run_as_node(request: RunRequest, nodes: distributed.NodesLaunch, settings: Settings, script_rel: str,
                 commit: str, cwd: Path, notify: Notify) -> RunResult:  # fmt: skip
    """`--nnodes`: this node's part of the job; rank 0's own `cascade run` records it (api/nodes.py)."""
    from cascade_repro.api.nodes import one_seed, run_on_nodes
    from cascade_repro.manifest import Manifest

    if request.docker or (request.docker is None and settings.docker.get("enabled")):
        raise UsageError("a torchrun job (--nnodes) is not run in --docker yet",
                         hint="run it with --no-docker, or run torchrun inside your own image")  # fmt: skip
    if nodes.nnodes > 1 and request.seed == "random":  # each node would draw its own
        raise UsageError("--seed random cannot be shared by the nodes of a job: each would draw its own",
                         hint="give every node the same number: --seed N")  # fmt: skip
    uri = settings.tracking_uri
    if nodes.nnodes > 1 and (uri.startswith(("file:", "sqlite:")) or "://" not in uri):
        notify(f"the store is a file ({uri}): the other nodes' ranks are recorded only if "
               "they reach the same one (a shared filesystem); a tracking server is the usual way: "
               "MLFLOW_TRACKING_URI=http://HOST:5000")  # fmt: skip
    options = _rank_options(replace(request, seed=one_seed(request.seed)))  # one node: drawn once here
    code = run_on_nodes(nodes, _target(request, request.script), script_rel, request.args, commit, options,
                        request.rdzv_id, cwd, notify)  # fmt: skip
    status = "FINISHED" if code == 0 else "FAILED"
    manifest = Manifest.outcome_only("", settings.experiment, __version__,
                                     {"status": status, "exit_code": code})  # fmt: skip
    return RunResult("", status, code, settings.tracking_uri, settings.experiment, manifest, (),
                     nodes=nodes.nnodes)  # fmt: skip


def _settings_for(request: RunRequest, root: Path, environ: Mapping[str, str]) -> Settings:
    """The project's settings with this run's options over them."""
    settings = load_settings(root, environ)
    if request.experiment:
        settings = replace(settings, experiment=request.experiment)
    if request.log_checkpoints:
        settings = replace(settings, log_checkpoints=True)
    if request.trace_interval is not None:
        if request.trace_interval < 0:
            raise UsageError("--trace-interval must be 0 (no trace) or a positive number of steps")
        settings = replace(settings, trace_interval=request.trace_interval)
    if request.trace_budget is not None:
        refused = UsageError(f"--trace-budget must be {TRACE_BUDGET_EXPECTED}, not {request.trace_budget}")
        settings = replace(settings, trace_budget=trace_budget(request.trace_budget, lambda: refused))
    return settings


def _script_in_repository(given: str, root: Path, cwd: Path) -> tuple[Path, str]:
    """The script's path, and relative to the repository root; a typo gets the closest name."""
    script = (cwd / given).resolve()
    if not script.is_file():
        close = _closest_script(root, cwd, given)
        hint = f"did you mean {close}?" if close else f"give a path relative to {cwd}"
        raise UsageError(f"script not found: {given}", hint=hint)
    try:
        return script, script.relative_to(root).as_posix()
    except ValueError:
        raise UsageError(
            f"{given} is outside the git repository {root}",
            hint="cascade records code through git: move the script into the repository",
        ) from None


def _invocation(request: RunRequest, script_rel: str) -> tuple[str, ...]:
    """The `cascade run` command as typed (the script relative to the repository root)."""
    return ("cascade", "run", *_invocation_options(request), *_target(request, script_rel), *request.args)


def _target(request: RunRequest, script: str) -> list[str]:
    """The script (as given) or `-m MODULE`, for a command line."""
    return run_target.words(script, request.module)


LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")


def _module_in_repository(name: str, root: Path, cwd: Path) -> tuple[Path, str]:
    """`-m NAME`: the module's file as `python -m` finds it from `cwd`, and relative to the repository
    root; a name that is none, is not found, or is found outside the repository is refused."""
    if name in LAUNCHERS:  # (torchrun's module: a launcher, not the training)
        raise UsageError(f"-m {name} is torchrun, not a training module: cascade starts torchrun itself",
                         hint="cascade run --nproc-per-node N train.py (or -m mypkg.train), or your "
                         "torchrun around it: torchrun --nproc-per-node N --no-python cascade run "
                         "train.py")  # fmt: skip
    if not run_target.is_module_name(name):
        raise UsageError(f"-m {name}: not a module name", hint="give a dotted module name, as to `python -m` "
                         "(`cascade run -m mypkg.train`)")  # fmt: skip
    try:
        found = run_target.module_file(name, cwd)
    except run_target.NotRunnable as exc:
        if not exc.missing:
            raise UsageError(f"-m {name}: {exc}", hint="give the module that trains, as to `python -m` "
                             "(`cascade run -m mypkg.train`)") from None  # fmt: skip
        raise UsageError(f"-m {name}: {exc} (looked in {cwd}, as `python -m` does, then in the path of "
                         f"{sys.executable})",
                         hint="run it from the directory that holds its package, or install your project "
                         "into this environment (`pip install -e .`)") from None  # fmt: skip
    try:
        return found, found.relative_to(root).as_posix()
    except ValueError:
        raise UsageError(
            f"-m {name} runs {found}, outside the git repository {root}",
            hint="cascade records code through git: run a module of the repository (an installed "
            "library's is not recorded code)",
        ) from None


def _refuse_dirty(root: Path, exclude: tuple[str, ...]) -> None:
    changed = is_dirty(root, exclude) + _dirty_data(root)
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise DirtyTreeRefused(
            f"--require-clean: the working tree has uncommitted changes ({shown})",
            hint="commit or stash them, or drop --require-clean to record them as a patch",
        )


def _log_start(request: RunRequest, settings: Settings, environ: Mapping[str, str], commit: str,
               resolved: ResolvedParams) -> None:  # fmt: skip
    """`-v`: where each decision came from."""
    root = settings.root
    log.debug("repo root %s, HEAD %s, settings %s", root, commit[:12], _settings_source(root, environ))
    log.debug(
        "params from %s; overrides %s", resolved.source or "(no params file)", resolved.overrides or "none"
    )
    log.debug("seed %d (from %s); determinism %s", resolved.seed, resolved.seed_source,
              request.determinism or settings.determinism)  # fmt: skip
    log.debug(
        "store %s (%s), experiment %s", settings.tracking_uri, _store_source(environ), settings.experiment
    )


def _refuse_track_inputs_without_dvc(settings: Settings) -> None:
    """`--track-inputs` where there is no DVC cache to keep the inputs in: refused before the script
    runs (it was said only after the whole run, which then lacked what the user asked for)."""
    from cascade_repro.store.dvc_store import Cache

    if not Cache.exists_for(settings.root):
        raise UsageError(
            "--track-inputs keeps the files a run reads in the DVC cache; this project has no DVC repository",
            hint="run `cascade init` (it runs `dvc init`) first, or run without --track-inputs",
        )


def _in_docker(request: RunRequest, settings: Settings, layout: distributed.Distributed | None) -> bool:
    """Whether the script runs in the project's image (--docker, or docker.enabled in cascade.yaml)."""
    in_docker = bool(settings.docker.get("enabled")) if request.docker is None else request.docker
    if in_docker and layout is not None:
        raise UsageError(
            "a torchrun job (--nproc-per-node, or RANK/WORLD_SIZE set) is not run in --docker yet",
            hint="run it without --docker, or run torchrun inside your own image",
        )
    if not in_docker and (request.gpus or request.shm_size or request.no_cache):
        raise UsageError("--gpus, --shm-size and --rebuild go with --docker", hint="add --docker")
    return in_docker


def _tagged(result: RunResult, request: RunRequest, settings: Settings) -> RunResult:
    """`--tag`: the version given to a run that finished with its record complete (else a warning)."""
    if request.version is None or result.discarded:
        return result
    if result.status != "FINISHED":
        message = f"not tagged {request.version}: the run {result.status}; `cascade tag {result.run_id[:8]} "
        return replace(result, warnings=(*result.warnings, message + f"{request.version}` tags it anyway"))
    if result.incomplete:
        later = f"`cascade sync`, then `cascade tag {result.run_id[:8]} {request.version}`"
        message = f"not tagged {request.version}: the record is incomplete; {later}"
        return replace(result, warnings=(*result.warnings, message))
    from cascade_repro import versions
    from cascade_repro.store.run_store import RunStore

    store = RunStore.open(settings, fast_reads=True)  # the embedded store: tagged without MLflow
    tagged = versions.tag_run(store, settings.root, store.resolve(result.run_id), request.version,
                              force=request.force_version, git_tag=request.git_tag)  # fmt: skip
    return replace(result, version=tagged.version)


def _advise_init_once(settings: Settings, notify: Notify) -> None:
    """The first run in a project without `cascade init` says what init would add, once."""
    marker = settings.paths.init_advised
    if marker.exists():
        return
    preview = preview_init(settings.root, settings.checkpoints_dir)
    if preview.is_empty:
        return
    adds = []
    if preview.ignore_entries:
        adds.append(f"add to .gitignore: {' '.join(preview.ignore_entries)}")
    if preview.files:
        adds.append(f"write {', '.join(preview.files)}")
    if preview.dvc_init:
        adds.append("run `dvc init` (checkpoints then go to the DVC cache)")
    notify("no `cascade init` in this project (said once): git lists cascade's files as untracked; runs "
           "leave them and earlier runs' outputs out of their dirty state all the same")  # fmt: skip
    notify(f"`cascade init` would {'; '.join(adds)}")
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("`cascade init` was suggested once; delete this file to see it again\n")
    except OSError:
        pass


def _after_usage_error(result: RunResult, settings: Settings, restore: bool) -> RunResult:
    """A script whose argparse refused its arguments (exit 2) before it took a step, logged a
    metric or saved a checkpoint did nothing worth a record: its run is deleted from the store (the
    MLflow UI and `cascade ls` do not show it; `mlflow gc` purges it). A restore's re-run is kept."""
    error = result.manifest.outcome.get("error")
    usage = error.get("usage_error") if isinstance(error, dict) and result.exit_code == 2 else None
    if not isinstance(usage, str):
        return result
    result = replace(result, usage_error=usage)
    manifest = result.manifest
    worked = (
        (manifest.trace or {}).get("steps")
        or any(not key.startswith("cascade.") for key in (manifest.metrics.get("keys") or {}))
        or manifest.checkpoints
    )
    if worked or restore or result.incomplete or result.spool:
        return result
    try:
        why = f"argparse usage error before the first step: {usage}"
        from cascade_repro.store.run_store import RunStore

        RunStore(settings.tracking_uri, settings.experiment).discard(result.run_id, why)
    except Exception as exc:  # the FAILED run stays, as it would have without this
        message = f"the run of a script that stopped in argument parsing is kept: deleting it failed: {exc}"
        return replace(result, warnings=(*result.warnings, message))
    return replace(result, discarded=True)


def _container_plan(request: RunRequest, settings: Settings, commit: str, exclude: tuple[str, ...],
                    notify: Notify) -> ContainerPlan:  # fmt: skip
    """`--docker`: the image (reused when its inputs are unchanged, else built) and the GPUs to give it."""
    from cascade_repro.capture.packages import capture_packages
    from cascade_repro.capture.system import capture_gpus
    from cascade_repro.images import context, engine, prepare

    raw = dict(settings.docker)
    if request.image is not None:  # restore chose the image: the build's paths (maybe relative) are moot
        raw = {k: v for k, v in raw.items() if k not in ("wheelhouse", "ca_bundle", "offline")}
    docker = context.docker_settings(raw, settings.root)
    host_gpus = capture_gpus()
    host_count = len(host_gpus) if isinstance(host_gpus, list) else 0
    gpus = prepare.choose_gpus((request.gpus or docker.gpus).lower(), host_count)
    client = engine.connect()
    prepared = request.image or prepare.prepare_image(
        client, settings.root, docker, settings.experiment, commit, bool(is_dirty(settings.root, exclude)),
        capture_packages(), settings.paths.builds, notify, no_cache=request.no_cache,
        exclude=exclude,
    )  # fmt: skip
    for warning in prepared.warnings:
        notify(f"warning: {warning}")
    image = prepared.image
    how = f"built in {image.build_s:.0f} s" if image.built else "reused (same inputs)"
    if prepared.reused_by_id:
        how = "the recorded image, present here"
    notify(f"image {image.tag} ({image.image_id[7:19]}): {how}")
    return ContainerPlan(prepared, gpus, request.shm_size or docker.shm_size, docker.network, client)


def _check_version_free(settings: Settings, root: Path, request: RunRequest) -> None:
    """`--tag`: refuse a taken version before the script runs (read from the embedded store's tables
    where it can be, otherwise through MLflow)."""
    assert request.version is not None
    from cascade_repro import versions
    from cascade_repro.store.run_store import RunStore

    versions.validate_version(request.version, root)
    store = RunStore.open(settings, fast_reads=True)
    versions.check_free(store, root, request.version, store.experiment_id(),
                        None, request.force_version, request.git_tag)  # fmt: skip


def _closest_script(root: Path, cwd: Path, wanted: str) -> str | None:
    """The repository's Python file (tracked or untracked, not ignored) closest to `wanted`, as a path
    relative to `cwd`, the way it was typed."""
    import difflib

    try:
        names = git_repo.visible_files(root, "*.py")
    except CascadeError:
        return None
    candidates = sorted({os.path.relpath(root / name, cwd) for name in names})
    close = difflib.get_close_matches(wanted, candidates, n=1, cutoff=0.75)
    if not close:  # the right name in another directory: `train.py` for examples/train.py
        by_name: dict[str, str] = {}
        for candidate in sorted(candidates, key=len):
            by_name.setdefault(Path(candidate).name, candidate)
        close = [by_name[n] for n in difflib.get_close_matches(Path(wanted).name, list(by_name), 1, 0.75)]
    return close[0] if close else None


def _dirty_data(root: Path) -> list[str]:
    from cascade_repro.capture.data import dirty_data  # imports dvc: only for --require-clean

    return [f"{path} (DVC)" for path in dirty_data(root)]


def _settings_source(root: Path, environ: Mapping[str, str]) -> str:
    overrides = [name for name in SETTINGS_VARIABLES if environ.get(name)]
    base = "cascade.yaml" if (root / "cascade.yaml").is_file() else "defaults (no cascade.yaml)"
    return base + (f" + {', '.join(overrides)}" if overrides else "")


def _store_source(environ: Mapping[str, str]) -> str:
    for name in ("MLFLOW_TRACKING_URI", "CASCADE_TRACKING_URI"):
        if environ.get(name):
            return f"from {name}"
    return "from cascade.yaml or MLflow's default"


def _rank_options(request: RunRequest) -> list[str]:
    """What each rank's own `cascade run` is given by `cascade run --nnodes`: every option but the layout."""
    options = _invocation_options(replace(request, nproc_per_node=None))
    given = (("--experiment", request.experiment), ("--trace-interval", request.trace_interval),
             ("--trace-budget", request.trace_budget))  # fmt: skip
    for flag, value in given:
        if value is not None:
            options += [flag, str(value)]
    flags = (("--require-clean", request.require_clean), ("--force-tag", request.force_version),
             ("--no-git-tag", not request.git_tag),
             ("--log-checkpoints", request.log_checkpoints))  # fmt: skip
    return options + [flag for flag, given in flags if given]


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
        ("--gpus", request.gpus),
        ("--shm-size", request.shm_size),
    )
    if request.docker:
        options.append("--docker")
    if request.track_inputs:
        options.append("--track-inputs")
    if request.nproc_per_node is not None:
        options += ["--nproc-per-node", str(request.nproc_per_node)]
    for flag, value in single:
        if value is not None:
            options += [flag, value]
    return options
