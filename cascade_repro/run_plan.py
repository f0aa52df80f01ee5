"""What `cascade run` decided before the child starts, and what it returns: RunPlan, RunResult."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from cascade_repro.manifest import Manifest
from cascade_repro.params import ResolvedParams
from cascade_repro.settings import Settings

Notify = Callable[[str], None]


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
