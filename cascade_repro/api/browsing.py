"""Looking at the store: `cascade ls` (runs and what is still pending delivery), `cascade tag`, and
`cascade ui` (the stock MLflow UI on the same store)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from cascade_repro import versions
from cascade_repro.api.loading import load_project
from cascade_repro.errors import UsageError
from cascade_repro.settings import Settings
from cascade_repro.store import spool
from cascade_repro.store.metrics_writer import HEARTBEAT_S
from cascade_repro.store.run_store import RunStore, StoredRun

if TYPE_CHECKING:
    from cascade_repro.store.ui_server import UiOutcome, UiServer

# Three heartbeats missed: a RUNNING run is stale (its process died, or cannot reach the store).
STALE_AFTER_S = 3 * HEARTBEAT_S


@dataclass(frozen=True)
class RunSummary:
    """One line of `cascade ls`: a run as the store knows it (its record is not read)."""

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
    pending: bool = False  # its record is not all in the store yet (status PENDING-SYNC): `cascade sync`
    spool: str | None = None  # the run directory holding what is pending
    user: str | None = None  # who started it (MLflow's mlflow.user)
    heartbeat: float | None = None  # when its cascade process last told the store it was alive
    stale: bool = False  # RUNNING in the store, but no heartbeat for STALE_AFTER_S: its process is gone

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def list_runs(cwd: Path | None = None, all_experiments: bool = False, limit: int = 50,
              versions_only: bool = False, user: str | None = None,
              running: bool = False) -> list[RunSummary]:  # fmt: skip
    """`cascade ls`: the project's runs, newest first (`versions_only`: the labelled ones; `user`:
    one user's; `running`: those RUNNING in the store, each marked stale when its heartbeat stopped)."""
    settings = load_project(cwd)
    store = RunStore.open(settings, fast_reads=True)
    summaries = []
    now = time.time()
    for run in store.listed(all_experiments, limit, versions_only, user, running):
        end, start = run.end_ms, run.start_ms
        summaries.append(
            RunSummary(
                run_id=run.run_id,
                name=run.name,
                experiment=store.experiment_name(str(run.experiment_id)),
                version=run.version,
                status=str(run.status),
                start_time=start / 1000 if start else None,
                duration_s=(end - start) / 1000 if end and start else  # (RUNNING: so far)
                (round(now - start / 1000, 1) if start and run.status == "RUNNING" else None),
                commit=run.tags.get("mlflow.source.git.commit"),
                dirty={"true": True, "false": False}.get(run.tags.get("cascade.dirty", "")),
                metrics=_key_metrics(run.metrics, settings.key_metrics),
                user=run.user,
                heartbeat=run.heartbeat_s,
                stale=_stale(run, now),
            )
        )
    filtered = user is not None or running  # a spooled run the store has never seen matches neither
    return _with_pending(summaries, settings, all_experiments, only_listed=filtered)


def _stale(run: StoredRun, now: float) -> bool:
    """RUNNING in the store with no heartbeat (or, from a cascade without one, no start) for
    STALE_AFTER_S: the process that records it is gone, and nothing finished the run."""
    if run.status != "RUNNING":
        return False
    last = run.heartbeat_s or (run.start_ms / 1000 if run.start_ms else None)
    return last is not None and now - last > STALE_AFTER_S


def _with_pending(summaries: list[RunSummary], settings: Settings, all_experiments: bool,
                  only_listed: bool = False) -> list[RunSummary]:  # fmt: skip
    """Runs whose record is still (partly) in the spool show as PENDING-SYNC; spooled runs the store
    has never seen are listed too (unless `only_listed`)."""
    from cascade_repro.recovery import PENDING_SYNC

    entries = spool.scan_all(settings.paths.spool_dirs())
    spooled = {entry.run_id or entry.path.name: entry for entry in entries}
    if not spooled:
        return summaries
    listed = []
    for summary in summaries:
        entry = spooled.pop(summary.run_id, None)
        if entry is not None:
            summary = replace(summary, status=PENDING_SYNC, pending=True, spool=str(entry.path))
        listed.append(summary)
    for entry in spooled.values() if not only_listed else ():
        plan = spool.read_json(entry.path / spool.PLAN_FILE)
        experiment = str(plan.get("experiment") or settings.experiment)
        if not all_experiments and experiment != settings.experiment:
            continue
        start = plan.get("start_ms")
        listed.append(RunSummary(
            run_id=entry.run_id or "", name=plan.get("run_name"), experiment=experiment, version=None,
            status=PENDING_SYNC, start_time=start / 1000 if start else None, duration_s=None,
            commit=(plan.get("tags") or {}).get("mlflow.source.git.commit"), dirty=None, metrics={},
            pending=True, spool=str(entry.path),
        ))  # fmt: skip
    return listed


def _key_metrics(metrics: Mapping[str, float], configured: Sequence[str]) -> dict[str, float]:
    if configured:
        return {k: metrics[k] for k in configured if k in metrics}
    own = sorted(k for k in metrics if not k.startswith("cascade."))
    return {k: metrics[k] for k in own[:3]}


def tag(ref: str, version: str, force: bool = False, git_tag: bool = True,
        cwd: Path | None = None) -> versions.TagResult:  # fmt: skip
    """Label a recorded run with a version (MLflow tag and annotated git tag)."""
    settings = load_project(cwd)
    store = RunStore.open(settings, fast_reads=True)  # the embedded store: its tables, no MLflow import
    return versions.tag_run(store, settings.root, store.resolve(ref), version, force=force, git_tag=git_tag)


def ui(host: str = "127.0.0.1", port: int = 5000, cwd: Path | None = None,
       started: Callable[[UiServer], None] = lambda server: None) -> UiOutcome:  # fmt: skip
    """The MLflow UI on this project's store, served until the user stops it (Ctrl-C, SIGTERM) or
    the server exits; `started` is told once it answers."""
    from cascade_repro.store import ui_server

    settings = load_project(cwd)
    if not settings.tracking_uri.startswith(("sqlite:", "file:", "postgresql", "mysql", "mssql")):
        raise UsageError(
            f"the store {settings.tracking_uri} is a tracking server already: open it in a browser",
            hint="cascade ui serves a local store (sqlite or a database URI)",
        )
    artifact_root = settings.artifact_root
    assert artifact_root is not None  # a local store (a server was refused above)
    server = ui_server.start(settings.tracking_uri, artifact_root, host, port, settings.paths.ui_log)
    return ui_server.serve(server, started)
