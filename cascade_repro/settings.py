"""cascade.yaml + CASCADE_* / MLFLOW_TRACKING_URI variables → one frozen Settings object."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from cascade_repro.errors import ConfigError
from cascade_repro.yaml_io import read_yaml_mapping

SETTINGS_FILE = "cascade.yaml"
DEFAULT_ENV_PREFIXES = (
    "CUDA_", "CUBLAS_", "CUDNN_", "NCCL_", "NVIDIA_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "KMP_",
    "OPENBLAS_", "ATEN_", "PYTHONHASHSEED", "CASCADE_", "MLFLOW_", "HF_", "XLA_", "LD_PRELOAD",
    "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_",
)  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """Everything configurable, resolved once per command and passed down."""

    root: Path
    experiment: str
    tracking_uri: str
    params_file: str | None = None
    checkpoints_dir: str = "checkpoints"
    determinism: str = "warn"
    untracked_max_bytes: int = 1024 * 1024
    env_allow_prefixes: tuple[str, ...] = DEFAULT_ENV_PREFIXES
    key_metrics: tuple[str, ...] = ()
    dvc_remote: str | None = None
    docker: Mapping[str, Any] = field(default_factory=dict)
    metrics_flush_s: float = 5.0
    trace_interval: int = 1  # record every Nth optimizer step; 0 turns the trace off
    # Gradient fingerprints tell "backward differs" from "a write between steps". None ("auto"): where
    # cheap (on an accelerator; on CPU for models up to 1 MiB of parameters).
    trace_grads: bool | None = None
    checkpoint_policy: Mapping[str, Any] = field(default_factory=dict)  # monitor, mode, save_top_k, save_last
    log_checkpoints: bool = False  # also log checkpoint files as MLflow artifacts (heavy)

    @property
    def runs_dir(self) -> Path:
        """Where run directories live while a run is going (ignored by git, see `cascade init`)."""
        return self.root / ".cascade" / "runs"

    @property
    def artifact_root(self) -> str:
        return (self.root / "mlruns").as_uri()


def load_settings(root: Path, environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    path = root / SETTINGS_FILE
    raw = read_yaml_mapping(path) if path.is_file() else {}
    known = {
        "experiment", "tracking_uri", "params_file", "checkpoints_dir", "determinism",
        "untracked_max_bytes", "env_allow_prefixes", "key_metrics", "dvc", "docker",
        "metrics_flush_s", "trace_interval", "trace_grads", "checkpoints", "log_checkpoints",
    }  # fmt: skip
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(
            f"{path}: unknown setting(s) {', '.join(unknown)}",
            hint=f"known settings are: {', '.join(sorted(known))}",
        )
    determinism = str(env.get("CASCADE_DETERMINISM") or raw.get("determinism") or "warn")
    if determinism not in ("off", "warn", "strict"):
        raise ConfigError(
            f"determinism must be off, warn or strict, not {determinism!r}",
            hint=f"fix `determinism:` in {path} or CASCADE_DETERMINISM",
        )
    tracking = (
        env.get("MLFLOW_TRACKING_URI")
        or env.get("CASCADE_TRACKING_URI")
        or raw.get("tracking_uri")
        or "sqlite:///mlflow.db"
    )
    dvc = raw.get("dvc") or {}
    return Settings(
        root=root,
        experiment=str(env.get("CASCADE_EXPERIMENT") or raw.get("experiment") or root.name),
        tracking_uri=resolve_tracking_uri(str(tracking), root),
        params_file=raw.get("params_file"),
        checkpoints_dir=str(raw.get("checkpoints_dir") or "checkpoints"),
        determinism=determinism,
        untracked_max_bytes=_int(raw.get("untracked_max_bytes", 1024 * 1024), "untracked_max_bytes"),
        env_allow_prefixes=tuple(raw.get("env_allow_prefixes") or DEFAULT_ENV_PREFIXES),
        key_metrics=tuple(raw.get("key_metrics") or ()),
        dvc_remote=(dvc.get("remote") if isinstance(dvc, dict) else None),
        docker=dict(raw.get("docker") or {}),
        metrics_flush_s=float(raw.get("metrics_flush_s", 5.0)),
        trace_interval=_int(raw.get("trace_interval", 1), "trace_interval"),
        trace_grads=_trace_grads(raw.get("trace_grads", "auto"), path),
        checkpoint_policy=_checkpoint_policy(raw.get("checkpoints"), path),
        log_checkpoints=bool(raw.get("log_checkpoints", False)),
    )


def _checkpoint_policy(raw: Any, path: Path) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: checkpoints must be a mapping (monitor, mode, save_top_k, save_last)")
    unknown = sorted(set(raw) - {"monitor", "mode", "save_top_k", "save_last"})
    if unknown:
        raise ConfigError(f"{path}: unknown checkpoints setting(s) {', '.join(unknown)}",
                          hint="known: monitor, mode, save_top_k, save_last")  # fmt: skip
    if raw.get("mode", "min") not in ("min", "max"):
        raise ConfigError(f"{path}: checkpoints.mode must be min or max, not {raw.get('mode')!r}")
    policy = dict(raw)
    if "save_top_k" in policy:
        policy["save_top_k"] = _int(policy["save_top_k"], "checkpoints.save_top_k")
    return policy


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` store URI (absolute after resolve_tracking_uri), else None."""
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def resolve_tracking_uri(uri: str, root: Path) -> str:
    """Make relative sqlite/file stores absolute against the repo root, as `mlflow ui` there sees them."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str((root / uri[len("sqlite:///") :]).resolve())
    if "://" not in uri and not uri.startswith("databricks"):
        return (root / uri).resolve().as_uri()
    return uri


def _int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} in cascade.yaml must be an integer, not {value!r}") from None


def _trace_grads(value: Any, path: Path) -> bool | None:
    if value is None or value == "auto":
        return None
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{path}: trace_grads must be true, false or auto, not {value!r}")
