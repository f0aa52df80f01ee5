"""Checkpoints and data of recorded runs: checkout, load, push."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from cascade_repro.api.loading import dvc_cache, load_project, record_of
from cascade_repro.errors import DataError, UsageError
from cascade_repro.manifest import ARTIFACT_PATH, Manifest
from cascade_repro.record_sections import CheckpointEntry
from cascade_repro.settings import Settings
from cascade_repro.store.dvc_store import DIR_SUFFIX
from cascade_repro.store.run_store import RunStore

if TYPE_CHECKING:
    from cascade_repro.checkout import Chosen, Fetched
    from cascade_repro.store.dvc_store import Cache

ProgressFactory = Callable[[str, "int | None"], "Callable[[int], None] | None"]  # (label, total bytes)


def fetch_files(
    cache: Cache, path: str, md5: str, remote: str | None, size: int | None = None,
    progress: ProgressFactory = lambda label, total: None,
) -> list[tuple[str, Fetched]]:  # fmt: skip
    """Each verified file of one recorded object, with its path below `path` ("" for a file): a
    directory's `.dir` object (`dvc add DIR`, HF's checkpoint-500/) is fetched, verified and expanded
    into its files. Its listing is untrusted: `directory_entries` refuses a path that leads out."""
    from cascade_repro import checkout as checking

    if not md5.endswith(DIR_SUFFIX):
        return [("", checking.fetch(cache, path, md5, remote, progress(f"md5 of {path}", size)))]
    checking.fetch(cache, path, md5, remote)  # its listing, verified
    files = []
    for member, member_md5 in cache.directory_entries(md5):
        bar = progress(f"md5 of {path}/{member}", None)
        files.append((member, checking.fetch(cache, f"{path}/{member}", member_md5, remote, bar)))
    return files


@dataclass(frozen=True)
class CheckoutResult:
    """`cascade checkout`: each file fetched from the DVC cache or remote (md5-verified) and where
    it went; `chosen` is the checkpoint picked by `--checkpoint` or the default rule."""

    run_id: str
    items: tuple[Fetched, ...]
    chosen: Chosen | None = None  # the checkpoint taken, and why (`--checkpoint` or the default)
    not_kept: tuple[str, ...] = ()  # --data: "PATH (why)" for data read whose bytes the record has no copy of


def checkout(ref: str, checkpoint: str | None = None, data: bool = False, to: Path | None = None,
             force: bool = False, cwd: Path | None = None,
             progress: ProgressFactory = lambda label, total: None) -> CheckoutResult:  # fmt: skip
    """Fetch a run's checkpoint and/or data from the DVC cache or remote, md5-verified, into place."""
    from cascade_repro import checkout as checking

    settings = load_project(cwd)
    root = settings.root
    run_id, manifest = record_of(settings, ref)
    cache = dvc_cache(root)
    wanted: list[tuple[str, str]] = []  # (path in the record, md5)
    flat: set[str] = set()  # checkpoints go straight into --to DIR; data keeps its relative path
    sizes: dict[str, int] = {}
    chosen = None
    if checkpoint is not None or not data:  # no option: the default checkpoint (best, else last)
        chosen = checking.choose_checkpoint(manifest.checkpoints, checkpoint)
        entry = chosen.entry
        wanted.append((entry.path, str(entry.md5)))
        flat.add(entry.path)
        sizes[str(entry.md5)] = entry.size or 0
    not_kept: tuple[str, ...] = ()
    if data:
        objects = manifest.data_objects
        not_kept = not_restorable(manifest)
        if not objects:
            raise DataError(f"run {run_id[:12]} recorded no DVC-tracked data it could restore"
                            + (f": {'; '.join(not_kept)}" if not_kept else ""))  # fmt: skip
        wanted += objects
    items = []
    try:
        for path, md5 in wanted:
            base, relative = (root, path) if to is None else (to, Path(path).name if path in flat else path)
            files = fetch_files(cache, path, md5, settings.dvc_remote, sizes.get(md5), progress)
            for member, fetched in files:  # a directory (HF's checkpoint-500/, `dvc add DIR`): file by file
                items.append(checking.deliver(fetched, base, f"{relative}/{member}" if member else relative,
                                              force))  # fmt: skip
    finally:
        cache.close()
    return CheckoutResult(run_id, tuple(items), chosen, not_kept)


def not_restorable(manifest: Manifest) -> tuple[str, ...]:
    """Each DVC-tracked path the run read whose bytes the record has no copy of, as "PATH (why)": a
    path missing at run time; a modified directory in a record made before such were committed."""
    return tuple(f"{d.path[:200]} ({str(d.get('note') or 'not restorable')[:120]})"
                 for d in manifest.data if not d.object_md5)  # fmt: skip


def checkpoint_path(ref: str, which: str = "best", cwd: Path | None = None) -> Path:
    """The verified DVC cache object of a run's checkpoint (read-only; for `load_checkpoint`)."""
    from cascade_repro import checkout as checking

    settings = load_project(cwd)
    _, manifest = record_of(settings, ref)
    chosen = checking.select_checkpoint(manifest.checkpoints, which)
    if str(chosen.md5).endswith(DIR_SUFFIX):
        hint = f"cascade checkout {ref} --checkpoint {which} --to DIR, then load it from there"
        raise UsageError(f"{chosen.path} is a directory checkpoint", hint=hint)
    cache = dvc_cache(settings.root)
    try:
        return checking.fetch(cache, chosen.path, str(chosen.md5), settings.dvc_remote).object_path
    finally:
        cache.close()


@dataclass(frozen=True)
class PushSummary:
    """`cascade push`: how many of a run's DVC objects reached the remote, and which did not."""

    run_id: str
    remote: str | None
    pushed: int
    failed: tuple[str, ...]

    @property
    def nothing(self) -> bool:
        """The run kept no checkpoint and read no DVC-tracked data: nothing to push."""
        return self.remote is None and not self.pushed and not self.failed


def push(ref: str, cwd: Path | None = None) -> PushSummary:
    """Push a run's kept checkpoints and the data it read to the DVC remote (retry after a failure)."""

    settings = load_project(cwd)
    run_id, manifest = record_of(settings, ref)
    md5s = [str(c.md5) for c in manifest.kept_checkpoints]
    md5s += [md5 for _, md5 in manifest.data_objects]
    if not md5s:  # nothing to push: done (`PushSummary.nothing`)
        return PushSummary(run_id, None, 0, ())
    cache = dvc_cache(settings.root)
    try:
        missing = [m for m in md5s if not cache.object_path(m).exists()]
        if missing:
            raise DataError(
                f"{len(missing)} object(s) of run {run_id[:12]} are not in this DVC cache: {missing[0]}, ...",
                hint="push from the machine where the run was recorded",
            )
        result = cache.push(md5s, settings.dvc_remote)
    finally:
        cache.close()
    if result.error:
        raise DataError(f"push to the DVC remote failed: {result.error}",
                        hint="configure a reachable remote: `dvc remote list`, `cascade init`")  # fmt: skip
    _record_pushed(settings, run_id, manifest, result.remote, set(result.failed))
    return PushSummary(run_id, result.remote, result.pushed, result.failed)


def _record_pushed(settings: Settings, run_id: str, manifest: Manifest, remote: str | None,
                   failed: set[str]) -> None:  # fmt: skip
    """The record says where its checkpoints are: after a retried push, `show --checkpoints` and the
    `cascade.checkpoints_pushed` tag agree with the remote."""
    entries = []
    for entry in manifest.checkpoints:
        raw = entry.to_dict()
        if entry.kept:
            raw.update(pushed=entry.md5 not in failed, remote=remote)
        entries.append(raw)
    if entries != [entry.to_dict() for entry in manifest.checkpoints]:
        updated = replace(manifest, checkpoints=CheckpointEntry.each(entries)).to_dict()
        RunStore(settings.tracking_uri, settings.experiment).log_json(run_id, updated, ARTIFACT_PATH)
