"""The user's project: find its git root, and `cascade init` it (settings, params, DVC, ignores)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from cascade_repro.errors import CascadeError
from cascade_repro.settings import OWN_DIR, SETTINGS_FILE, default_experiment
from cascade_repro.store import dvc_store, git_repo

IGNORE_ENTRIES = ("mlflow.db", "mlruns/", "mlartifacts/", f"{OWN_DIR}/")
INIT_FILES = ("cascade.yaml", "hyperparameters.yaml", "Dockerfile.j2")


@dataclass(frozen=True)
class InitPreview:
    """What `cascade init` would add to a project now (nothing: it was initialized)."""

    ignore_entries: tuple[str, ...]
    files: tuple[str, ...]
    dvc_init: bool

    @property
    def is_empty(self) -> bool:
        return not (self.ignore_entries or self.files or self.dvc_init)


@dataclass(frozen=True)
class InitResult:
    """What `cascade init` did: files created and kept, DVC initialized, its default remote, ignores added."""

    root: Path
    created: tuple[str, ...]
    kept: tuple[str, ...]
    dvc_initialized: bool
    dvc_remote: str | None
    ignore_added: tuple[str, ...]


def find_repo_root(start: Path | None = None) -> Path:
    """The top of the git work tree containing `start` (default: the current directory)."""
    where = start or Path.cwd()
    return git_repo.toplevel(where)


def template_path(name: str) -> Path:
    """A file from templates/ (inside the installed package, or beside it in a source checkout)."""
    here = Path(__file__).resolve().parent
    for base in (here / "templates", here.parent / "templates"):
        if (base / name).is_file():
            return base / name
    raise CascadeError(f"cascade's template {name} is missing", hint="reinstall cascade")


def init_project(root: Path, checkpoints_dir: str = "checkpoints",
                 experiment: str | None = None) -> InitResult:  # fmt: skip
    """Idempotent: writes only what is missing, never overwrites a user's file. cascade.yaml names
    `experiment` (default: `settings.default_experiment`)."""
    experiment = experiment or default_experiment(root)
    created: list[str] = []
    kept: list[str] = []
    for name in INIT_FILES:
        target = root / name
        if target.exists():
            kept.append(name)
            continue
        text = template_path(name).read_text(encoding="utf-8")
        if name == SETTINGS_FILE:  # the experiment named once, so every clone records into the same
            text = text.replace("# experiment: my-project", f"experiment: {json.dumps(experiment)}", 1)
        target.write_text(text, encoding="utf-8")
        created.append(name)
    ignore_added = _add_ignores(root, _ignore_entries(checkpoints_dir))
    dvc_initialized, remote = dvc_store.init_repository(root, default_remote_dir(root))
    return InitResult(root, tuple(created), tuple(kept), dvc_initialized, remote, ignore_added)


def default_remote_dir(root: Path) -> Path:
    """A per-project local DVC remote outside the work tree, so `git clean` never removes it."""
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:8]
    return Path.home() / OWN_DIR / "dvc-remote" / f"{root.name}-{digest}"


def preview_init(root: Path, checkpoints_dir: str = "checkpoints") -> InitPreview:
    """What `cascade init` would write here, without writing anything."""
    path = root / ".gitignore"
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    return InitPreview(
        ignore_entries=tuple(_missing_ignores(text, _ignore_entries(checkpoints_dir))),
        files=tuple(name for name in INIT_FILES if not (root / name).exists()),
        dvc_init=not (root / ".dvc").is_dir(),
    )


def _ignore_entries(checkpoints_dir: str) -> tuple[str, ...]:
    return (*IGNORE_ENTRIES, f"/{checkpoints_dir.strip('/')}/")


def _missing_ignores(text: str, entries: tuple[str, ...]) -> list[str]:
    present = {line.strip() for line in text.splitlines()}
    return [e for e in entries if e not in present and e.rstrip("/") not in present]


def _add_ignores(root: Path, entries: tuple[str, ...]) -> tuple[str, ...]:
    path = root / ".gitignore"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    missing = _missing_ignores(text, entries)
    if missing:
        prefix = "" if not text or text.endswith("\n") else "\n"
        block = "# cascade: local MLflow store, run scratch, checkpoints (DVC-tracked)\n"
        path.write_text(text + prefix + block + "\n".join(missing) + "\n", encoding="utf-8")
    return tuple(missing)
