"""What a training script calls: `params()` and `log_metrics()`, inside or outside `cascade run`.

Under `cascade run` the parent has resolved the hyperparameters into the run directory and drains
the metric events into MLflow. Run as plain `python train.py`, `params()` reads the
hyperparameters.yaml beside the script and `log_metrics()` does nothing, so a script stays runnable
without cascade.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

from cascade_repro.child import protocol
from cascade_repro.child.checkpoints import CheckpointLog, Policy, save
from cascade_repro.child.events import EventSink

# One process, one run: the sink and params are per-process singletons, created on first use.
_lock = threading.Lock()
_sink: list[EventSink] = []
_params: list[dict[str, Any]] = []
_checkpoints: list[CheckpointLog] = []
_on_read: list[Callable[[], None]] = []  # the child's bootstrap: the script read its params file


def run_dir() -> Path | None:
    """The run directory of the current `cascade run`, or None outside one."""
    value = os.environ.get(protocol.ENV_RUN_DIR)
    return Path(value) if value else None


def params() -> dict[str, Any]:
    """The run's resolved hyperparameters (hyperparameters.yaml + --set overrides + seed).

    >>> lr = cascade_repro.params()["optimizer"]["lr"]
    """
    with _lock:
        if not _params:
            _params.append(_load_params())
            for note in _on_read:
                note()
        return copy.deepcopy(_params[0])


def on_params_read(note: Callable[[], None]) -> None:
    """Call `note` when the script first reads its params (under `cascade run`, the parent then
    records the params file as part of what the script used)."""
    _on_read.append(note)


def log_metrics(metrics: Mapping[str, Any], step: int | None = None) -> None:
    """Record scalar metrics for this step; returns after an in-memory append (microseconds).

    The parent writes them to MLflow in batches of at most 1000. `step` defaults to a counter of
    calls. Outside `cascade run` this does nothing.
    """
    sink = _sink[0] if _sink else _open_sink()
    if sink is not None:
        sink.add(metrics, step)


def log_metric(key: str, value: Any, step: int | None = None) -> None:
    """Record one scalar metric (see `log_metrics`)."""
    log_metrics({key: value}, step)


def flush() -> None:
    """Write queued metrics to the run directory now (also done every 0.25 s and at exit)."""
    if _sink:
        _sink[0].flush()


def checkpoint(
    obj: Any,
    step: int | None = None,
    metrics: Mapping[str, Any] | None = None,
    *,
    monitor: str | None = None,
    mode: str | None = None,
    save_top_k: int | None = None,
    save_last: bool | None = None,
    filename: str | None = None,
) -> Path:
    """`torch.save(obj)` into the checkpoints dir, kept to the best `save_top_k` by `monitor`.

    >>> cascade_repro.checkpoint({"model": m.state_dict()}, step=s, metrics={"val_loss": v},
    ...                          monitor="val_loss")
    Pruned checkpoints are deleted from the workspace. Under `cascade run` each kept one enters the
    DVC cache and is pushed at the end; defaults come from `checkpoints:` in cascade.yaml.
    Returns the path written.
    """
    import torch  # the script has it already

    base = Policy.from_env()
    if mode is not None and mode not in ("min", "max"):
        raise ValueError(f"checkpoint: mode must be 'min' or 'max', not {mode!r}")
    policy = Policy(
        monitor=monitor if monitor is not None else base.monitor,
        mode=mode or base.mode,
        save_top_k=save_top_k if save_top_k is not None else base.save_top_k,
        save_last=save_last if save_last is not None else base.save_last,
    )
    return save(checkpoint_log(run_dir()), torch, obj, step, metrics, policy, filename)


def checkpoint_log(directory: Path | None) -> CheckpointLog:
    with _lock:
        if not _checkpoints:
            _checkpoints.append(CheckpointLog(directory / protocol.CHECKPOINTS_FILE if directory else None))
        return _checkpoints[0]


def write_checkpoint_notes() -> str | None:
    """At the script's end: the checkpoint notes a full run directory kept waiting, written now if it
    takes them; what is still missing otherwise (None: nothing is)."""
    with _lock:
        log = _checkpoints[0] if _checkpoints else None
    if log is None or log.path is None:
        return None
    with log.lock:
        error = log.write_unwritten()
        return None if error is None else f"{len(log.unwritten)} checkpoint save(s) not noted: {error}"


def _open_sink() -> EventSink | None:
    directory = run_dir()
    if directory is None:
        return None
    with _lock:
        if not _sink:
            _sink.append(EventSink(directory / protocol.EVENTS_FILE))
        return _sink[0]


def _load_params() -> dict[str, Any]:
    directory = run_dir()
    if directory is not None:
        data = json.loads((directory / protocol.PARAMS_FILE).read_text(encoding="utf-8"))
        return dict(data)
    # Plain `python train.py`: the hyperparameters.yaml beside the script, else in the cwd.
    script = Path(sys.argv[0]).resolve().parent if sys.argv and sys.argv[0] else Path.cwd()
    for candidate in (script / "hyperparameters.yaml", Path.cwd() / "hyperparameters.yaml"):
        if candidate.is_file():
            from cascade_repro.yaml_io import parse_yaml  # same float rules as `cascade run`

            loaded = parse_yaml(candidate.read_text(encoding="utf-8")) or {}
            return dict(loaded) if isinstance(loaded, dict) else {}
    return {}
