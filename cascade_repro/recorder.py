"""The parent half of `cascade run`: start the child first, record everything around it, close the run.

    main thread            start child ──────────────────────────── wait (forward signals) ── finish
    capture thread            git, packages, system, environment ──┐
    store thread              import mlflow, open run, run id file ┴─ params, tags, manifest v0
    metrics thread                                    events.jsonl → MLflow, ≤ 1000 points a request

Anything recorded before a crash, Ctrl-C or SIGTERM stays recorded: the manifest is written as soon
as capture is done and again with the outcome, metrics are flushed before the run is closed.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import resource
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from cascade_repro import __version__
from cascade_repro.capture.environment import environment_read
from cascade_repro.capture.git import GitState
from cascade_repro.capture.snapshot import capture_snapshot, empty_snapshot
from cascade_repro.child import protocol
from cascade_repro.errors import CascadeError, StoreError
from cascade_repro.manifest import ARTIFACT_PATH, Manifest, data_objects
from cascade_repro.params import ResolvedParams, flatten
from cascade_repro.settings import Settings
from cascade_repro.store import mlflow_store
from cascade_repro.store.checkpoint_keeper import CheckpointKeeper, CheckpointsRecorded, finish_checkpoints
from cascade_repro.store.dvc_store import Cache
from cascade_repro.store.metrics_writer import MetricsWriter
from cascade_repro.supervisor import Child, ChildExit

log = logging.getLogger(__name__)

Notify = Callable[[str], None]
PARENT_NICENESS = 10


@dataclass(frozen=True)
class RunPlan:
    """Everything decided before the child starts (cheap checks only; see api.run)."""

    settings: Settings
    script: Path  # absolute
    script_rel: str  # relative to the repo root
    args: tuple[str, ...]
    cwd: Path
    commit: str
    params: ResolvedParams
    determinism: str
    run_name: str | None
    environ: Mapping[str, str]
    exclude: tuple[str, ...]  # cascade's own files, never recorded as user state
    invocation: tuple[str, ...] = field(default_factory=tuple)
    extra_tags: Mapping[str, str] = field(default_factory=dict)  # e.g. cascade.restored_from


@dataclass(frozen=True)
class RunResult:
    run_id: str
    status: str
    exit_code: int
    tracking_uri: str
    experiment: str
    manifest: Manifest
    warnings: tuple[str, ...]
    version: str | None = None


class _Worker(threading.Thread):
    """A thread that keeps its result or exception for the joiner."""

    def __init__(self, name: str, target: Callable[[], Any]) -> None:
        super().__init__(name=name, daemon=True)
        self._fn = target
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # handed to the joiner
            self.error = exc

    def value(self) -> Any:
        self.join()
        if self.error is not None:
            raise self.error
        return self.result


def record_run(plan: RunPlan, notify: Notify) -> RunResult:
    settings = plan.settings
    start_ms = int(time.time() * 1000)
    run_dir = _make_run_dir(settings.runs_dir)
    protocol.write_json_atomic(run_dir / protocol.PARAMS_FILE, plan.params.values)
    env = child_environment(plan, run_dir)

    child = Child(
        [sys.executable, "-m", "cascade_repro.child.bootstrap", str(plan.script), *plan.args],
        env,
        plan.cwd,
        run_dir / protocol.OUTPUT_LOG,
    )
    _yield_cpu_to_the_child()
    log.debug("child pid %d: %s %s (cwd %s)", child.pid, plan.script_rel, " ".join(plan.args), plan.cwd)
    log.debug("child environment adds %s", {k: env[k] for k in sorted(set(env) - set(plan.environ))})
    settings = plan.settings
    capture = _Worker(
        "cascade-capture",
        lambda: capture_snapshot(
            settings.root, plan.exclude, settings.untracked_max_bytes, env, settings.env_allow_prefixes
        ),  # fmt: skip
    )
    capture.start()
    root = plan.settings.root
    keeper = CheckpointKeeper(
        root, run_dir / protocol.CHECKPOINTS_FILE, Cache(root) if Cache.exists_for(root) else None, log.debug
    ).start()
    recording = _Recording(plan, run_dir, start_ms, child, capture, notify, keeper)
    store = _Worker("cascade-store", recording.open)
    store.start()

    ended = child.wait()
    try:
        store.value()
    except BaseException as exc:
        if recording.opened is None or recording.writer is None:
            shutil.rmtree(run_dir, ignore_errors=True)  # nothing recorded: leave nothing behind
            child.restore_signals()
            if isinstance(exc, CascadeError):
                raise
            raise StoreError(f"cannot record the run: {exc}", hint="run with -v for the traceback") from exc
        # The run exists: close it with everything we have rather than leave it RUNNING.
        recording.warnings.append(f"the record is incomplete: {type(exc).__name__}: {exc}")
    try:
        return recording.finish(ended)
    finally:
        child.restore_signals()


def _yield_cpu_to_the_child() -> None:
    """Lower this (parent) process's priority once the child runs at the user's priority.

    The parent's work (importing MLflow, writing batches) is bookkeeping: on a machine whose cores
    the training already fills, it should take idle time, not the script's. It still gets a core
    at full speed while the script imports its libraries (single-threaded).
    """
    try:
        os.nice(PARENT_NICENESS)
    except OSError:
        pass


def child_environment(plan: RunPlan, run_dir: Path) -> dict[str, str]:
    env = dict(plan.environ)
    env[protocol.ENV_RUN_DIR] = str(run_dir)
    env[protocol.ENV_SEED] = str(plan.params.seed)
    env[protocol.ENV_DETERMINISM] = plan.determinism
    env[protocol.ENV_TRACE_INTERVAL] = str(plan.settings.trace_interval)
    env[protocol.ENV_TRACE_GRADS] = "1" if plan.settings.trace_grads else "0"
    env[protocol.ENV_CHECKPOINTS_DIR] = str(plan.settings.root / plan.settings.checkpoints_dir)
    env[protocol.ENV_CHECKPOINT_POLICY] = json.dumps(dict(plan.settings.checkpoint_policy))
    env["PYTHONHASHSEED"] = str(plan.params.seed % 4294967296)
    env["MLFLOW_TRACKING_URI"] = plan.settings.tracking_uri
    env.setdefault("MLFLOW_EXPERIMENT_NAME", plan.settings.experiment)
    env.setdefault("PYTHONUNBUFFERED", "1")  # output reaches the terminal and log as it is printed
    return env


def own_paths(settings: Settings) -> tuple[str, ...]:
    """Root-relative paths of cascade's own files: never part of the user's dirty state."""
    paths = [".cascade", "mlruns", "mlartifacts"]
    uri = settings.tracking_uri
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        try:
            rel = db.relative_to(settings.root).as_posix()
            paths += [rel, f"{rel}-journal", f"{rel}-wal", f"{rel}-shm"]
        except ValueError:
            pass
    return tuple(paths)


def _make_run_dir(base: Path) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = base / f"{stamp}-{os.getpid()}"
    run_dir.mkdir()
    return run_dir


class _Recording:
    """The store side of one run: opened in a thread while the child runs, finished after it."""

    def __init__(self, plan: RunPlan, run_dir: Path, start_ms: int, child: Child, capture: _Worker,
                 notify: Notify, keeper: CheckpointKeeper) -> None:  # fmt: skip
        self.plan = plan
        self.run_dir = run_dir
        self.start_ms = start_ms
        self.child = child
        self.capture = capture
        self.notify = notify
        self.keeper = keeper
        self.mlflow: Any = None
        self.opened: mlflow_store.OpenedRun | None = None
        self.writer: MetricsWriter | None = None
        self.warnings: list[str] = []
        self.peak_rss_mb = 0.0

    # -- while the child runs -------------------------------------------------------------
    def open(self) -> None:
        plan = self.plan
        try:
            self.mlflow = mlflow_store.client(plan.settings.tracking_uri)
            self.opened = mlflow_store.open_run(
                self.mlflow,
                plan.settings.experiment,
                plan.settings.artifact_root,
                plan.run_name,
                self._start_tags(),
                self.start_ms,
                existing_run_id=plan.environ.get("MLFLOW_RUN_ID") or None,
            )
        except BaseException:
            self.child.terminate()
            raise
        run_id = self.opened.run_id
        (self.run_dir / protocol.RUN_ID_FILE).write_text(run_id, encoding="utf-8")
        self.writer = MetricsWriter(
            self.mlflow,
            run_id,
            self.run_dir / protocol.EVENTS_FILE,
            flush_s=plan.settings.metrics_flush_s,
            sample=self._sample_memory,
        ).start()
        self.notify(f"run {run_id} · experiment {self.opened.experiment} · {plan.settings.tracking_uri}")
        captured = self.capture.value()
        git: GitState = captured["git"]
        self.warnings += mlflow_store.log_params(
            self.mlflow, run_id, self._flat_params(), existing=self.opened.existing_params
        )
        mlflow_store.set_tags(
            self.mlflow,
            run_id,
            {"cascade.dirty": str(git.dirty).lower(), "mlflow.source.git.repoURL": git.remotes.get("origin")},
        )
        self._log_dirty_state(git)
        early = self._manifest(captured, facts={})  # kept if the parent dies before finish()
        mlflow_store.log_json(self.mlflow, run_id, early.to_dict(), ARTIFACT_PATH)

    # -- after the child ended --------------------------------------------------------------
    def finish(self, ended: ChildExit) -> RunResult:
        assert self.opened is not None and self.writer is not None
        run_id = self.opened.run_id
        end_ms = int(time.time() * 1000)
        facts = _read_json(self.run_dir / protocol.FACTS_FILE)
        status = _status(ended)
        resources = self._resources(facts)
        self.writer.add(resources)
        self.writer.stop()
        if self.writer.errors:
            self.warnings.extend(self.writer.errors[:3])
        outcome = {
            "status": status,
            "exit_code": ended.exit_code,
            "signal": ended.signal_received or ended.killed_by_signal,
            "start_time": self.start_ms / 1000,
            "end_time": end_ms / 1000,
            "duration_s": round((end_ms - self.start_ms) / 1000, 3),
            "error": facts.get("exception"),
        }
        try:
            captured = self.capture.value()
        except Exception as exc:  # the run still gets closed with its outcome
            self.warnings.append(f"capture failed: {exc}")
            captured = empty_snapshot()
        read = [md5 for _, md5 in data_objects(captured.get("data") or [])]
        try:
            settings = self.plan.settings
            checkpoints = finish_checkpoints(self.keeper, self.mlflow, run_id, settings.dvc_remote,
                                             settings.log_checkpoints, self.notify, read)  # fmt: skip
        except Exception as exc:  # the run is still closed with its outcome and what the keeper saw
            self.warnings.append(f"checkpoints not fully recorded: {type(exc).__name__}: {exc}")
            checkpoints = CheckpointsRecorded([e.to_dict() for e in self.keeper.entries], [], {})
        finally:
            if self.keeper.cache is not None:
                self.keeper.cache.close()
        self.warnings.extend(checkpoints.warnings)
        manifest = self._manifest(captured, facts).with_outcome(
            outcome,
            metrics={**self.writer.summary_dict(), "resources": resources},
            checkpoints=checkpoints.entries,
        )
        mlflow_store.log_json(self.mlflow, run_id, manifest.to_dict(), ARTIFACT_PATH)
        for name in (protocol.OUTPUT_LOG, protocol.TRACE_FILE):
            if (self.run_dir / name).exists():
                mlflow_store.log_file(self.mlflow, run_id, self.run_dir / name, "cascade")
        mlflow_store.set_tags(self.mlflow, run_id, {**self._end_tags(manifest), **checkpoints.tags})
        mlflow_store.finish_run(self.mlflow, run_id, status, end_ms)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        return RunResult(
            run_id, status, ended.exit_code, self.plan.settings.tracking_uri, self.opened.experiment,
            manifest, tuple(self.warnings),
        )  # fmt: skip

    # -- pieces -------------------------------------------------------------------------------
    def _flat_params(self) -> dict[str, Any]:
        flat = flatten(self.plan.params.values)
        flat.setdefault("seed", self.plan.params.seed)
        return flat

    def _start_tags(self) -> dict[str, str]:
        plan = self.plan
        tags = {
            "mlflow.source.git.commit": plan.commit,
            "mlflow.source.name": plan.script_rel,
            "mlflow.source.type": "LOCAL",
            "mlflow.user": _user(),
            "cascade.tool_version": __version__,
            "cascade.seed": str(plan.params.seed),
            "cascade.determinism": plan.determinism,
            "cascade.argv": json.dumps(list(plan.args)),
            "mlflow.note.content": _note(plan),
        }
        if plan.run_name:
            tags["mlflow.runName"] = plan.run_name
        return {**tags, **plan.extra_tags}

    def _end_tags(self, manifest: Manifest) -> dict[str, str | None]:
        torch = manifest.torch
        gpus = torch.get("gpus") or manifest.hardware.get("gpus") or []
        return {
            "cascade.torch": torch.get("version"),
            "cascade.cuda": torch.get("cuda") or "none",
            "cascade.cpu_capability": torch.get("cpu_capability"),
            "cascade.gpu": ", ".join(g["name"] for g in gpus) if isinstance(gpus, list) and gpus else "none",
            "cascade.python": manifest.python.get("version"),
            "cascade.status": manifest.outcome["status"] if manifest.outcome else None,
        }

    def _log_dirty_state(self, git: GitState) -> None:
        assert self.opened is not None
        run_id = self.opened.run_id
        if git.patch:
            patch = self.run_dir / "git.patch"
            patch.write_bytes(git.patch)
            mlflow_store.log_file(self.mlflow, run_id, patch, "cascade")
        stored = [u for u in git.untracked if u.stored and u.symlink_target is None]
        if stored:
            staging = self.run_dir / "untracked"
            for item in stored:
                target = staging / item.path
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.plan.settings.root / item.path, target)
            mlflow_store.log_dir(self.mlflow, run_id, staging, "cascade/untracked")
        refused = [u.path for u in git.untracked if not u.stored]
        if refused:
            self.warnings.append(
                f"untracked files too large to keep ({', '.join(refused[:5])}): `dvc add` them or "
                "raise untracked_max_bytes in cascade.yaml"
            )

    def _manifest(self, captured: dict[str, Any], facts: dict[str, Any]) -> Manifest:
        plan = self.plan
        assert self.opened is not None
        system = dict(captured["system"])
        container = system.pop("container")
        torch = facts.get("torch") or {"version": _installed_version("torch"), "probed": False}
        determinism = facts.get("determinism") or {"mode": plan.determinism}
        return Manifest(
            run_id=self.opened.run_id,
            experiment=self.opened.experiment,
            cascade_version=__version__,
            command={
                "script": plan.script_rel,
                "argv": list(plan.args),
                "cwd": _relative(plan.cwd, plan.settings.root),
                "interpreter": sys.executable,
                "invocation": list(plan.invocation),
                "run_name": plan.run_name,
            },
            params={
                "values": plan.params.values,
                "source": plan.params.source,
                "overrides": plan.params.overrides,
                "seed": plan.params.seed,
                "seed_source": plan.params.seed_source,
            },
            determinism=determinism,
            git=captured["git"].to_dict(),
            python=captured["python"],
            torch=torch,
            hardware=system,
            environment=captured["environment"],
            container=container,
            data=captured.get("data") or [],
            environment_read=environment_read(
                facts.get("environment_read") or {}, plan.settings.env_allow_prefixes
            ),
            trace=_trace_section(self.run_dir / protocol.TRACE_FILE, facts.get("trace")),
            outcome={"status": "RUNNING", "start_time": self.start_ms / 1000},
        )

    def _sample_memory(self) -> dict[str, float]:
        rss = _vm_hwm_mb(self.child.pid)
        self.peak_rss_mb = max(self.peak_rss_mb, rss)
        return {"cascade.peak_rss_mb": self.peak_rss_mb} if rss else {}

    def _resources(self, facts: dict[str, Any]) -> dict[str, float]:
        rusage = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # kB on Linux
        values = {"cascade.peak_rss_mb": round(max(self.peak_rss_mb, rusage), 1)}
        for key, value in (facts.get("gpu_memory") or {}).items():
            values[f"cascade.{key}"] = round(float(value), 1)
        return values


def _trace_section(path: Path, header: dict[str, Any] | None) -> dict[str, Any] | None:
    if header is None or not path.exists():
        return None
    with open(path, "rb") as handle:
        steps = sum(1 for line in handle if line.strip())
    return {
        "artifact": f"cascade/{protocol.TRACE_FILE}",
        "format": "cascade.trace/1",
        "steps": steps,
        **header,
    }


def _status(ended: ChildExit) -> str:
    if ended.exit_code == 0 and ended.signal_received is None:
        return "FINISHED"
    if (
        ended.signal_received is not None
        or ended.killed_by_signal is not None
        or ended.exit_code in (130, 143)
    ):
        return "KILLED"
    return "FAILED"


def _vm_hwm_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return 0.0
    return 0.0


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _installed_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _relative(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root).as_posix() or "."
    except ValueError:
        return str(path)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _note(plan: RunPlan) -> str:
    args = " ".join(plan.args)
    return (
        f"`cascade run {plan.script_rel} {args}`".replace(" `", "`")
        + f"\n\nseed {plan.params.seed}, determinism {plan.determinism}, commit {plan.commit[:12]}. "
        "The full record is the artifact cascade/run.json."
    )
