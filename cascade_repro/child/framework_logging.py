"""Frameworks that log to MLflow themselves land in the cascade run, whole.

Installed by the child's import hooks, only when the script imports MLflow or Lightning:

- `mlflow.end_run()` (the Hugging Face MLflowCallback calls it at the end of `train()`) forgets
  `MLFLOW_RUN_ID`, so the next `log_*` (the metrics of a later `evaluate()`) would start a new run
  that `cascade ls` then shows as the newest. After it, the cascade run is again the one to resume.
- Params logged into the cascade run under a key it already holds with another value make MLflow
  refuse the whole batch (MLflowCallback logs TrainingArguments 100 at a time; `seed` 42 against
  cascade's 0 lost 45 of them). Such keys are logged as `script/KEY` instead, and the run's
  `cascade.renamed_params` tag lists them; keys already there with the same value are left out.
- Lightning's `MLFlowLogger()` without a `run_id` opens its own run in its own experiment, unlinked.
  It logs into the cascade run instead (the tag `cascade.framework_logger` says which logger).

Nothing here may break the script: every wrapper falls back to the framework's own behaviour.
"""

from __future__ import annotations

import functools
import os
import sys
from types import ModuleType
from typing import Any, Callable

from cascade_repro.child import protocol

RENAMED_PREFIX = "script/"
LIGHTNING_MLFLOW_MODULES = ("lightning.pytorch.loggers.mlflow", "pytorch_lightning.loggers.mlflow")


def import_hooks() -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: module name → what to adapt once it is imported."""
    return {"mlflow": after_mlflow, **dict.fromkeys(LIGHTNING_MLFLOW_MODULES, after_lightning_mlflow)}


def cascade_run_id() -> str | None:
    """The cascade run's id once the parent wrote it (set when the script first imported mlflow)."""
    return os.environ.get(protocol.ENV_MLFLOW_RUN_ID) or None


def after_mlflow(mlflow: ModuleType) -> None:
    """Keep the cascade run resumable after `end_run`, and params free of collisions."""
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        return
    os.environ[protocol.ENV_MLFLOW_RUN_ID] = run_id
    try:
        _keep_run_after_end(mlflow, run_id)
        _rename_colliding_params(mlflow.MlflowClient, run_id)
    except Exception as exc:  # observing must never break the user's script
        sys.stderr.write(f"cascade: MLflow calls are not adapted: {type(exc).__name__}: {exc}\n")


def after_lightning_mlflow(module: ModuleType) -> None:
    """`MLFlowLogger()` with no run of its own logs into the cascade run."""
    logger_class = getattr(module, "MLFlowLogger", None)
    if logger_class is None:
        return
    original = logger_class.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)  # imports mlflow: the cascade run id is known after it
        run_id = cascade_run_id()
        if run_id is None or getattr(self, "_run_id", None) is not None:
            return
        try:
            from mlflow import MlflowClient

            self._run_id = run_id
            self._tracking_uri = os.environ.get("MLFLOW_TRACKING_URI", self._tracking_uri)
            self._mlflow_client = MlflowClient(self._tracking_uri)
            experiment = getattr(self, "_experiment_name", "")
            asked = f"lightning MLFlowLogger (experiment {experiment!r} asked)"
            self._mlflow_client.set_tag(run_id, "cascade.framework_logger", asked)
        except Exception as exc:  # it then logs where it would have
            sys.stderr.write(f"cascade: MLFlowLogger keeps its own run: {type(exc).__name__}: {exc}\n")

    logger_class.__init__ = __init__


def _keep_run_after_end(mlflow: ModuleType, run_id: str) -> None:
    fluent: Any = sys.modules.get("mlflow.tracking.fluent")

    def wrap(end_run: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(end_run)
        def end_run_then_resume(*args: Any, **kwargs: Any) -> None:
            try:
                end_run(*args, **kwargs)
            finally:
                os.environ["MLFLOW_RUN_ID"] = run_id  # the next log_* resumes the cascade run

        return end_run_then_resume

    wrapped = wrap(getattr(mlflow, "end_run"))  # noqa: B009  (a module attribute mypy cannot see)
    setattr(mlflow, "end_run", wrapped)  # noqa: B010
    if fluent is not None and getattr(fluent, "end_run", None) is not None:
        fluent.end_run = wrapped  # what mlflow's own atexit handler calls


def _rename_colliding_params(client_class: Any, cascade_id: str) -> None:
    original = client_class.log_batch
    renamed: dict[str, str] = {}

    @functools.wraps(original)
    def log_batch(self: Any, run_id: str, metrics: Any = (), params: Any = (), tags: Any = (),
                  synchronous: Any = None) -> Any:  # fmt: skip  (MLflow's own signature)
        if params and run_id == cascade_id:
            try:
                params, tags = _without_collisions(self, run_id, list(params), list(tags), renamed)
            except Exception as exc:
                sys.stderr.write(f"cascade: params not checked for collisions: {type(exc).__name__}: {exc}\n")
                # and MLflow decides, as it would have
        return original(self, run_id=run_id, metrics=metrics, params=params, tags=tags,
                        synchronous=synchronous)  # fmt: skip

    client_class.log_batch = log_batch


def _without_collisions(client: Any, run_id: str, params: list[Any], tags: list[Any],
                        renamed: dict[str, str]) -> tuple[list[Any], list[Any]]:  # fmt: skip
    from mlflow.entities import Param, RunTag

    held = client.get_run(run_id).data.params
    kept: list[Any] = []
    for param in params:
        value = str(param.value)
        if param.key not in held:
            kept.append(param)
        elif held[param.key] != value:
            key = RENAMED_PREFIX + param.key
            if held.get(key, value) == value:
                kept.append(Param(key, value))
                renamed[param.key] = f"{param.key}: run {held[param.key]}, script {value} (as {key})"
    if renamed:
        tags = [*tags, RunTag("cascade.renamed_params", "; ".join(renamed.values())[:5000])]
    return kept, tags
