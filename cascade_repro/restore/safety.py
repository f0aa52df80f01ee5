"""Paths and files from an untrusted record: each must stay inside the worktree and match its hash."""

from __future__ import annotations

import posixpath
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Iterable

from cascade_repro.capture.git import sha256_of
from cascade_repro.confined import names_git_dir
from cascade_repro.errors import RestoreRefused, UnsafeRecord

if TYPE_CHECKING:
    from cascade_repro.manifest import Manifest
    from cascade_repro.record_sections import FileEntry


def untracked_links(untracked: Iterable[FileEntry]) -> dict[str, str]:
    return {posixpath.normpath(u.path): u.symlink_target for u in untracked if u.symlink_target is not None}


def written_paths(manifest: Manifest) -> list[tuple[str, str]]:
    """Every file a restore may write for this record: (path, what it is)."""
    paths = [(u.path, "the untracked file") for u in manifest.git.untracked]
    paths += [(d.path, "the data path") for d in manifest.data]
    paths += [(i.path, "the input file") for i in manifest.inputs]
    paths += [(c.path, "the checkpoint") for c in manifest.kept_checkpoints]
    return paths


def safe_path(path: str, what: str, allow_dot: bool = False) -> str:
    """A relative POSIX path that stays inside the worktree and out of `.git`."""
    normalized = posixpath.normpath(path) if path else ""
    if allow_dot and normalized == ".":
        return "."
    parts = PurePosixPath(path).parts
    if (
        not path
        or "\\" in path
        or "\0" in path
        or PurePosixPath(path).is_absolute()
        or ".." in parts
        or normalized in (".", "")
        or names_git_dir(parts[0])
    ):
        raise UnsafeRecord(f"unsafe record: {what} has the path {path!r}, which escapes the worktree")
    return normalized


def safe_link(path: str, target: str, what: str = "the untracked symlink") -> None:
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if target.startswith("/") or joined == ".." or joined.startswith("../"):
        raise UnsafeRecord(f"unsafe record: {what} {path} points outside the worktree ({target})")


def check_sha256(path: Path, expected: str, what: str) -> None:
    if sha256_of(path) != expected:
        raise RestoreRefused(
            f"{what} does not match the sha256 in the record (tampered or corrupted artifact)",
            hint="nothing was written; restore from an intact copy of the MLflow artifact store",
        )
