"""What every use case starts from: the project's settings (dead runs recovered first), a run's
record from the store, the project's DVC cache."""

from __future__ import annotations

from pathlib import Path

from cascade_repro.errors import DataError
from cascade_repro.manifest import Manifest
from cascade_repro.project import find_repo_root
from cascade_repro.settings import Settings, load_settings
from cascade_repro.store.dvc_store import Cache
from cascade_repro.store.run_store import RunStore


def load_project(cwd: Path | None) -> Settings:
    """The project's settings; runs whose `cascade run` died are recovered first (see recovery.py)."""
    from cascade_repro.api.spooled import finish_dead_runs

    root = find_repo_root(cwd)
    settings = load_settings(root)
    finish_dead_runs(settings)
    return settings


def record_of(settings: Settings, ref: str) -> tuple[str, Manifest]:
    """The run id a ref names, and its record (shape-checked)."""
    store = RunStore.open(settings)
    run_id = store.resolve(ref).run_id
    return run_id, store.record(run_id)


def dvc_cache(root: Path) -> Cache:
    """The project's DVC cache; a project without `dvc init` is told to run `cascade init`."""
    if not Cache.exists_for(root):
        raise DataError(f"{root} is not a DVC repository", hint="run `cascade init` (it runs `dvc init`)")
    return Cache(root)
