"""Checkpoints that frameworks write without `torch.save(obj, path)`, announced like ours.

Lightning writes `.ckpt` files through fsspec (`torch.save` into a buffer), so the `torch.save` hook
never sees a path; the Hugging Face Trainer and Accelerate's `save_state` write a directory
(`checkpoint-500/`: safetensors, config, trainer state and, with torch.save, optimizer and RNG state).
Installed when the script imports Lightning's Trainer or ModelCheckpoint, transformers' Trainer,
Accelerate or safetensors. Every checkpoint's step is the step trace's last step done when it was
saved (None before the first), as for `torch.save`, never the framework's own count:

- `Trainer.save_checkpoint(path)` announces the file once written; inside
  `ModelCheckpoint` also the monitored metric, its mode and score, so `cascade checkout
  --checkpoint best` takes the file ModelCheckpoint's `best_model_path` names.
- `ModelCheckpoint` removing a file that fell out of its top k announces it pruned.
- `transformers.Trainer._save_checkpoint` announces the directory once complete, as one checkpoint
  (its files are not announced one by one), with `metric_for_best_model`'s last value;
  directories its rotation (`save_total_limit`) removed are announced pruned.
- `Accelerator.save_state` announces the directory it wrote once complete, as one checkpoint;
  directories `ProjectConfiguration(total_limit=...)` removed are announced pruned.
- `safetensors.torch.save_file` (and `save_model`, which calls it) announces the file it wrote, as
  the `torch.save` hook does; inside one of the directory saves above, it is a file of that one.

A path written again is unlinked first (a new inode), as for `torch.save`: the DVC cache may hold the
old bytes by hardlink. Nothing here may break the script.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from cascade_repro.child import file_access
from cascade_repro.child.checkpoints import CheckpointLog, wrap_save_function

LIGHTNING_TRAINER_MODULES = ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer")
LIGHTNING_CALLBACK_MODULES = (
    "lightning.pytorch.callbacks.model_checkpoint",
    "pytorch_lightning.callbacks.model_checkpoint",
)

TRANSFORMERS_TRAINER_MODULES = ("transformers.trainer",)
ACCELERATE_MODULES = ("accelerate.accelerator",)
SAFETENSORS_MODULES = ("safetensors.torch",)

_saving = threading.local()  # the ModelCheckpoint whose save is under way, if any


def import_hooks(log: CheckpointLog) -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: module name → what to wrap once it is imported."""
    lightning_callback = _class_hook("ModelCheckpoint", _wrap_lightning_model_checkpoint, log)
    return {
        **dict.fromkeys(LIGHTNING_TRAINER_MODULES, _class_hook("Trainer", _wrap_lightning_trainer, log)),
        **dict.fromkeys(LIGHTNING_CALLBACK_MODULES, lightning_callback),
        **dict.fromkeys(TRANSFORMERS_TRAINER_MODULES, _class_hook("Trainer", _wrap_hf_trainer, log)),
        **dict.fromkeys(ACCELERATE_MODULES, _class_hook("Accelerator", _wrap_accelerator, log)),
        **dict.fromkeys(SAFETENSORS_MODULES, lambda module: _guarded(lambda: _wrap_safetensors(module, log))),
    }


def _class_hook(name: str, wrap: Callable[[Any, CheckpointLog], None],
                log: CheckpointLog) -> Callable[[ModuleType], None]:  # fmt: skip
    """Once a module is imported: wrap its class `name`, if it has one."""

    def after_import(module: ModuleType) -> None:
        found = getattr(module, name, None)
        if found is not None:
            _guarded(lambda: wrap(found, log))

    return after_import


def _wrap_safetensors(module: ModuleType, log: CheckpointLog) -> None:
    """Before transformers and Accelerate import `save_file` by name, so theirs is this one too."""
    wrap_save_function(module, "save_file", "filename", log, source="safetensors")


def _wrap_hf_trainer(trainer_class: Any, log: CheckpointLog) -> None:
    if not hasattr(trainer_class, "_save_checkpoint"):  # another transformers than the one known
        return
    original = trainer_class._save_checkpoint
    announced: list[Path] = []

    @functools.wraps(original)
    def _save_checkpoint(self: Any, model: Any, trial: Any, *args: Any, **kwargs: Any) -> Any:
        log.inside_api.active = True  # its torch.save calls are files of this one checkpoint
        try:
            result = original(self, model, trial, *args, **kwargs)
        finally:
            log.inside_api.active = False
        if getattr(self.args, "should_save", True):
            _guarded(lambda: _announce_hf(self, trial, log, announced))
        return result

    trainer_class._save_checkpoint = _save_checkpoint


def _announce_hf(trainer: Any, trial: Any, log: CheckpointLog, announced: list[Path]) -> None:
    # The directory is named by HF's own count; the step is the trace's (see _fields).
    folder = f"checkpoint-{trainer.state.global_step}"
    directory = Path(trainer._get_output_dir(trial=trial), folder).absolute()
    fields: dict[str, Any] = {"step": log.current_step(), "metrics": {}, "source": "transformers"}
    wanted = getattr(trainer.args, "metric_for_best_model", None)
    if wanted:
        name = wanted if str(wanted).startswith("eval_") else f"eval_{wanted}"
        history = trainer.state.log_history
        values = [entry[name] for entry in history if isinstance(entry.get(name), (int, float))]
        if values:
            mode = "max" if getattr(trainer.args, "greater_is_better", False) else "min"
            fields.update(metrics={name: float(values[-1])}, monitor=name, mode=mode)
    _announce_directory(directory, fields, log, announced)


def _wrap_accelerator(accelerator_class: Any, log: CheckpointLog) -> None:
    original = accelerator_class.save_state
    announced: list[Path] = []

    @functools.wraps(original)
    def save_state(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer = getattr(log.inside_api, "active", False)  # inside a save that announces itself
        log.inside_api.active = True  # its safetensors and torch.save files are files of this one checkpoint
        try:
            result = original(self, *args, **kwargs)
        finally:
            log.inside_api.active = outer
        directory = _local_path(result)  # where it saved: output_dir, or the name it chose
        if not outer and directory is not None and getattr(self, "is_main_process", True):
            fields: dict[str, Any] = {"step": log.current_step(), "metrics": {}, "source": "accelerate"}
            _guarded(lambda: _announce_directory(directory, fields, log, announced))
        return result

    accelerator_class.save_state = save_state


def _announce_directory(directory: Path, fields: dict[str, Any], log: CheckpointLog,
                        announced: list[Path]) -> None:  # fmt: skip
    """A directory written whole is one checkpoint; those announced before and since removed (the
    framework's rotation) are pruned."""
    if directory.is_dir():
        log.announce("saved", directory, **fields)
        announced.append(directory)
    for gone in [d for d in announced if not d.exists()]:
        announced.remove(gone)
        log.announce("pruned", gone)


def _wrap_lightning_trainer(trainer_class: Any, log: CheckpointLog) -> None:
    original = trainer_class.save_checkpoint

    @functools.wraps(original)
    def save_checkpoint(self: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
        path = _local_path(filepath)
        if path is not None:
            log.make_room(path)  # a new inode: the cache may hold the old one by hardlink
        result = original(self, filepath, *args, **kwargs)
        if path is not None:
            file_access.note_saved(path)  # (written through fsspec: maybe a temporary file, then moved)
        if path is not None and getattr(self, "is_global_zero", True):
            _guarded(lambda: log.announce("saved", path, **_fields(log)))
        return result

    trainer_class.save_checkpoint = save_checkpoint


def _wrap_lightning_model_checkpoint(callback_class: Any, log: CheckpointLog) -> None:
    save = callback_class._save_checkpoint
    remove = callback_class._remove_checkpoint

    @functools.wraps(save)
    def _save_checkpoint(self: Any, trainer: Any, filepath: Any) -> Any:
        _saving.callback = self
        try:
            return save(self, trainer, filepath)
        finally:
            _saving.callback = None

    @functools.wraps(remove)
    def _remove_checkpoint(self: Any, trainer: Any, filepath: Any) -> Any:
        result = remove(self, trainer, filepath)
        path = _local_path(filepath)
        if path is not None and getattr(trainer, "is_global_zero", True):
            _guarded(lambda: log.announce("pruned", path))
        return result

    callback_class._save_checkpoint = _save_checkpoint
    callback_class._remove_checkpoint = _remove_checkpoint


def _fields(log: CheckpointLog) -> dict[str, Any]:
    """The step is the trace's last step done (None before the first), as for `torch.save`: not the
    framework's count of steps, one ahead of it (the trace numbers from 0), counted from a resumed
    checkpoint's and restarted by each fit, so `checkout --checkpoint N` finds what trace step N saved."""
    fields: dict[str, Any] = {"step": log.current_step(), "metrics": {}, "source": "lightning"}
    callback = getattr(_saving, "callback", None)
    monitor = getattr(callback, "monitor", None)
    score = getattr(callback, "current_score", None)
    if callback is not None and monitor and score is not None:
        fields.update(metrics={str(monitor): float(score)}, monitor=str(monitor), mode=str(callback.mode))
    return fields


def _local_path(filepath: Any) -> Path | None:
    """An absolute local path; None for a remote one (s3://...), which is not ours to cache."""
    text = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else None
    if not isinstance(text, str) or "://" in text:
        return None
    return Path(text).absolute()


def _guarded(action: Callable[[], Any]) -> None:
    try:
        action()
    except Exception as exc:  # observing must never break the user's script
        sys.stderr.write(f"cascade: a framework checkpoint is not recorded: {type(exc).__name__}: {exc}\n")
