"""The parent half of `cascade run`: start the child first, record everything around it, close the run.

    main thread            start child, forward signals from here ─────────────────── wait ── finish
    capture thread            git, packages, system, environment ──┐
    store thread              import mlflow, open run, run id file ┴─ params, tags, manifest v0
    metrics thread                                    events.jsonl → MLflow, ≤ 1000 points a request

Anything recorded before a crash, Ctrl-C or SIGTERM stays recorded: the manifest is written as soon
as capture is done and again with the outcome, metrics are flushed before the run is closed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cascade_repro import __version__, distributed
from cascade_repro.capture.files import redirected_outputs
from cascade_repro.child import protocol
from cascade_repro.errors import CascadeError, StoreError
from cascade_repro.redaction import redact_argv
from cascade_repro.run_output import RunOutput
from cascade_repro.run_plan import Notify, RunPlan, RunResult
from cascade_repro.settings import OWN_DIR, Settings, sqlite_path
from cascade_repro.store import spool
from cascade_repro.supervisor import Child, RunningChild

if TYPE_CHECKING:
    from cascade_repro.distributed import Distributed
    from cascade_repro.run_store_side import Recording, Worker

log = logging.getLogger(__name__)

PARENT_NICENESS = 10


def record_run(plan: RunPlan, notify: Notify) -> RunResult:
    start_ms = int(time.time() * 1000)
    # The run directory is the run's spool: locked while this process lives, with a heartbeat, so
    # that if it dies the next cascade command finishes the run (recovery.py).
    run_dir, lock = spool.make_run_dir(plan.settings.runs_dir)
    heartbeat = spool.Heartbeat(run_dir).start()
    try:
        return _record(plan, notify, run_dir, start_ms)
    finally:
        heartbeat.stop()
        spool.release(lock)


def _record(plan: RunPlan, notify: Notify, run_dir: Path, start_ms: int) -> RunResult:
    try:  # (room for the directory alone: said as a directory that could not be made, nothing left)
        protocol.write_json_atomic(run_dir / protocol.PARAMS_FILE, plan.params.values)
        output = RunOutput(run_dir / protocol.OUTPUT_LOG, run_dir)
    except OSError as exc:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise spool.cannot_make(run_dir.parent, exc, what="prepare") from exc
    env = child_environment(plan, run_dir)
    notify = output.wrap(notify)
    try:
        child = _start_child(plan, env, run_dir, output, notify)
    except BaseException:
        output.close()
        shutil.rmtree(run_dir, ignore_errors=True)  # nothing ran, nothing recorded: leave nothing behind
        raise
    if plan.container is None:  # pid reuse is told apart by the start time /proc gives
        # (a disk filled since the directory was made: parent.json keeps naming this process alone)
        with contextlib.suppress(OSError):
            spool.write_owner(run_dir, child.pid)
    try:
        recording, store = _start_recording(plan, notify, child, env, run_dir, start_ms)
    except BaseException:
        child.terminate()  # a failure (or Ctrl-C) before the wait: leave no script or container running
        child.wait()
        child.restore_signals()
        raise

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


def follow_rank(plan: RunPlan, layout: Distributed, notify: Notify) -> RunResult:
    """Rank K > 0 of the user's torchrun job: run the script, writing in ranks/K/ of the job directory,
    and say there how it ended; rank 0's `cascade run` puts its trace and outcome into the one run."""
    from cascade_repro.manifest import Manifest

    started_ms = int(time.time() * 1000)
    follower = distributed.RankFollower(layout, plan.settings.root)
    job_dir = follower.prepare()
    env = {**child_environment(plan, job_dir), protocol.ENV_PARENT_PID: str(os.getpid())}
    log.debug("rank %d of %d: files in %s", layout.rank, layout.world_size, follower.own)
    output = RunOutput(follower.own / protocol.OUTPUT_LOG, follower.own, progress=False)
    child = Child([sys.executable, "-m", "cascade_repro.child.bootstrap", *plan.target, *plan.args],
                  env, plan.cwd, output, output.wrap(notify))  # fmt: skip
    try:
        ended = child.wait()
    finally:
        child.restore_signals()
    follower.ended(ended.exit_code)
    run_id_file = job_dir / protocol.RUN_ID_FILE
    run_id = run_id_file.read_text(encoding="utf-8").strip() if run_id_file.exists() else ""
    warnings: tuple[str, ...] = ()
    if layout.leads_another_node:  # rank 0's files are on another machine: meet it in the store
        try:
            run_id = _deliver_node(plan, layout, job_dir, output.wrap(notify), started_ms) or run_id
        except CascadeError as exc:
            warnings = (f"this node's ranks are not recorded: {exc} (their files stay in {job_dir})",)
    status = "FINISHED" if ended.exit_code == 0 else "FAILED"
    outcome = {"status": status, "exit_code": ended.exit_code}
    manifest = Manifest.outcome_only(run_id, plan.settings.experiment, __version__, outcome)
    return RunResult(run_id, status, ended.exit_code, plan.settings.tracking_uri, plan.settings.experiment,
                     manifest, warnings, rank=layout.rank)  # fmt: skip


def _deliver_node(plan: RunPlan, layout: Distributed, job_dir: Path, notify: Notify,
                  started_ms: int) -> str | None:  # fmt: skip
    from cascade_repro.node_exchange import deliver_node
    from cascade_repro.store.run_store import RunStore

    return deliver_node(layout, RunStore.open(plan.settings), job_dir, notify, started_ms)


def _start_recording(plan: RunPlan, notify: Notify, child: RunningChild, env: dict[str, str], run_dir: Path,
                     start_ms: int) -> tuple[Recording, Worker]:  # fmt: skip
    """Capture, the checkpoint keeper and the store side, started while the child runs. Their modules
    are imported only now, while the script imports its own: it starts sooner. (A Ctrl-C meanwhile is
    the script's: the child forwards signals from its start.)"""
    _yield_cpu_to_the_child()
    from cascade_repro.capture.snapshot import capture_snapshot
    from cascade_repro.run_store_side import UNTRACKED_DIR, Recording, Worker
    from cascade_repro.store.checkpoint_keeper import CheckpointKeeper
    from cascade_repro.store.dvc_store import Cache

    log.debug("child pid %d: %s %s (cwd %s)", child.pid, plan.shown, " ".join(redact_argv(plan.args)),
              plan.cwd)  # fmt: skip
    log.debug("child environment adds %s", {k: env[k] for k in sorted(set(env) - set(plan.environ))})
    settings = plan.settings
    capture = Worker(
        "cascade-capture",
        lambda: _in_image(
            plan,
            capture_snapshot(
                settings.root,
                (*plan.exclude, *redirected_outputs(settings.root)),  # `> run.log`: an output
                settings.untracked_max_bytes,
                env,
                settings.env_allow_prefixes,
                python_here=plan.container is None,
                keep=run_dir / UNTRACKED_DIR,
            ),
        ),  # fmt: skip
    )
    capture.start()
    root = plan.settings.root
    keeper = CheckpointKeeper(
        root, run_dir / protocol.CHECKPOINTS_FILE, Cache(root) if Cache.exists_for(root) else None, log.debug,
        hardlink=plan.settings.checkpoint_link == "hardlink",
    ).start()
    recording = Recording(plan, run_dir, start_ms, child, capture, notify, keeper)
    store = Worker("cascade-store", recording.open)
    store.start()
    return recording, store


def _start_child(plan: RunPlan, env: dict[str, str], run_dir: Path, output: RunOutput,
                 notify: Notify) -> RunningChild:  # fmt: skip
    bootstrap = ["-m", "cascade_repro.child.bootstrap", *plan.target, *plan.args]
    layout = plan.distributed
    if layout is not None and layout.launcher == distributed.LAUNCHED:  # torchrun starts the ranks
        bootstrap = ["-m", "cascade_repro.child.launch_ranks", str(layout.nproc_per_node), *plan.target,
                     *plan.args]  # fmt: skip
    if plan.container is None:
        env = {**env, protocol.ENV_PARENT_PID: str(os.getpid())}  # the child stops if we die
        return Child([sys.executable, *bootstrap], env, plan.cwd, output, notify)
    from cascade_repro.images import engine
    from cascade_repro.images.container import (
        ContainerChild,
        ContainerSpec,
        container_environment,
        mount_points,
    )

    image = plan.container.prepared.image
    env = {**env, "CASCADE_IMAGE": image.tag, "CASCADE_IMAGE_ID": image.image_id}
    spec = ContainerSpec(
        image=image.image_id,
        command=["python", *bootstrap],
        environment=container_environment(env),
        working_dir=str(plan.cwd),
        mounts=mount_points(
            [
                plan.settings.root,
                run_dir,
                _checkpoints_dir(plan.settings),
                *_store_paths(plan.settings.tracking_uri),
            ]
        ),  # fmt: skip
        gpus=plan.container.gpus,
        shm_size=plan.container.shm_size,
        network=plan.container.network,
        labels={"cascade.run_dir": str(run_dir)},
    )
    return ContainerChild(plan.container.client or engine.connect(), spec, output, notify)


def _in_image(plan: RunPlan, captured: dict[str, Any]) -> dict[str, Any]:
    """A run in a container records the image's Python and packages, not this machine's, and the
    image as its container (not the container cascade itself may run in)."""
    if plan.container is None:
        return captured
    from cascade_repro.images import engine

    image = plan.container.prepared.image
    record = plan.container.record()
    try:
        client = plan.container.client or engine.connect()
        captured["python"] = engine.probe_python(client, image.image_id, image_cache_dir())
    except Exception as exc:  # the rest of the record matters more than the package list
        log.warning("the image's packages are not recorded: %s", exc)
        captured["python"] = {"unavailable": f"reading the image's packages failed: {exc}"}
    captured["system"]["container"] = record
    return captured


def image_cache_dir() -> Path:
    """Per-image facts (Python, packages) read once per image ID."""
    from cascade_repro.store.new_store import user_cache_dir

    return user_cache_dir() / "images"


def _store_paths(uri: str) -> list[Path]:
    """A local MLflow store must be reachable from inside the container at the same path."""
    import urllib.parse

    db = sqlite_path(uri)
    if db is not None:
        return [db.parent]
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme == "file":
        return [Path(urllib.parse.unquote(parts.path))]
    return []


def _checkpoints_dir(settings: Settings) -> Path:
    """Where the script's checkpoints go; one outside the repository is made now, so it can be mounted."""
    path = settings.root / settings.checkpoints_dir
    if not path.resolve().is_relative_to(settings.root.resolve()):
        path.mkdir(parents=True, exist_ok=True)
    return path


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
    env[protocol.ENV_TRACE_BUDGET] = repr(plan.settings.trace_budget)
    if plan.trace_schedule is not None:
        env[protocol.ENV_TRACE_SCHEDULE] = json.dumps(plan.trace_schedule)
    if plan.trace_records is not None:
        env[protocol.ENV_TRACE_RECORDS] = json.dumps(plan.trace_records)
    env[protocol.ENV_TRACE_GRADS] = {True: "1", False: "0", None: "auto"}[plan.settings.trace_grads]
    env[protocol.ENV_CHECKPOINTS_DIR] = str(plan.settings.root / plan.settings.checkpoints_dir)
    env[protocol.ENV_ROOT] = str(plan.settings.root)  # files opened under it are noted
    env[protocol.ENV_CHECKPOINT_POLICY] = json.dumps(dict(plan.settings.checkpoint_policy))
    env["PYTHONHASHSEED"] = str(plan.params.seed % 4294967296)
    env["MLFLOW_TRACKING_URI"] = plan.settings.tracking_uri
    env.setdefault("MLFLOW_EXPERIMENT_NAME", plan.settings.experiment)
    env.setdefault("PYTHONUNBUFFERED", "1")  # output reaches the terminal and log as it is printed
    layout = plan.distributed
    if layout is not None and layout.launcher == distributed.LAUNCHED and layout.nproc_per_node > 1:
        # torchrun's own default for several processes a node, set here so the record holds it
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def own_paths(settings: Settings) -> tuple[str, ...]:
    """Root-relative paths of cascade's own files and of what runs write (the checkpoints directory,
    DVC's cache): never part of the user's dirty state, whether or not `cascade init` ignored them."""
    paths = [OWN_DIR, "mlruns", "mlartifacts", ".dvc/cache", ".dvc/tmp"]
    db = sqlite_path(settings.tracking_uri)
    if db is not None:
        try:
            rel = db.relative_to(settings.root).as_posix()
            paths += [rel, f"{rel}-journal", f"{rel}-wal", f"{rel}-shm"]
        except ValueError:
            pass
    stores = [u for u in (settings.tracking_uri, settings.artifact_root) if u and u.startswith("file://")]
    for where in (settings.checkpoints_dir, *(urllib.parse.unquote(u[len("file://") :]) for u in stores)):
        rel = os.path.relpath(os.path.normpath(settings.root / where), settings.root)
        if rel != "." and not rel.startswith(".."):  # never the whole tree, never outside it
            paths.append(Path(rel).as_posix())
    return tuple(dict.fromkeys(paths))
