"""DVC-tracked inputs at run start: path, md5, whether the workspace matches the committed pointer.

A workspace file or directory that differs is put into the DVC cache as it is (a directory as a new
`.dir` object listing its files, as `dvc add DIR` would make it; its .dvc file is left alone: no
git-tracked file changes), so the exact bytes the run read can be restored, and compared by md5.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from cascade_repro.store.dvc_store import Cache, workspace_md5

log = logging.getLogger(__name__)


def capture_data(root: Path) -> list[dict[str, Any]]:
    if not Cache.exists_for(root):
        return []
    cache = Cache(root)
    try:
        outputs = cache.tracked_outputs()
        for item in outputs:
            if item["matches"]:
                continue
            path = root / item["path"]
            if not (path.is_file() or path.is_dir()):
                item["note"] = "not restorable: missing"
                continue
            stored = cache.add_directory(path) if path.is_dir() else cache.add(path)
            if stored is None:
                item["note"] = "not restorable: it changed while it was hashed"
                continue
            item.update(workspace_md5=stored.md5, workspace_size=stored.size, committed_to_cache=True)
        return outputs
    finally:
        cache.close()


def tracked_data(root: Path, hash_modified: bool = False) -> list[dict[str, Any]]:
    """The DVC-tracked outputs as they are now, read only: nothing enters the cache. `hash_modified`:
    a workspace file or directory that differs from its pointer gets the md5 it would have there
    (`workspace_md5`, as a run records it), so its bytes can be compared with a run's."""
    if not Cache.exists_for(root):
        return []
    cache = Cache(root)
    try:
        outputs = cache.tracked_outputs()
    finally:
        cache.close()
    for item in outputs if hash_modified else ():
        path = root / item["path"]
        if item["matches"] or not (path.is_file() or path.is_dir()):
            continue
        try:
            item["workspace_md5"], item["workspace_size"] = workspace_md5(path)
        except OSError:  # it changed or went while it was read: unknown bytes
            continue
    return outputs


def dirty_data(root: Path) -> list[str]:
    """Paths of DVC-tracked outputs whose workspace differs from the committed pointer."""
    return [item["path"] for item in tracked_data(root) if not item["matches"]]
