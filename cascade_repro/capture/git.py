"""Git state of the work tree: commit, branch, remotes, and the complete dirty state (binary-safe)."""

from __future__ import annotations

import hashlib
import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from cascade_repro.capture import earlier_outputs
from cascade_repro.capture.earlier_outputs import Written
from cascade_repro.store import git_repo
from cascade_repro.store.git_repo import head_commit


@dataclass(frozen=True)
class UntrackedFile:
    path: str  # relative to the repo root, POSIX separators
    size: int
    sha256: str
    stored: bool  # content kept as an artifact under cascade/untracked/
    reason: str | None = None  # why not stored
    symlink_target: str | None = None


@dataclass(frozen=True)
class EarlierOutput:
    """An untracked file an earlier run of this checkout wrote, unchanged since: left out."""

    path: str
    size: int
    run_id: str


MAX_EARLIER_LISTED = 1000  # in the record; beyond it, only their number


@dataclass(frozen=True)
class GitState:
    commit: str
    branch: str | None
    remotes: dict[str, str]
    dirty: bool
    patch: bytes = field(repr=False)
    untracked: tuple[UntrackedFile, ...]
    earlier_outputs: tuple[EarlierOutput, ...] = ()  # not part of the dirty state (earlier_outputs.py)

    @property
    def patch_sha256(self) -> str:
        return hashlib.sha256(self.patch).hexdigest()

    def to_dict(self) -> dict[str, object]:
        return {
            "commit": self.commit,
            "branch": self.branch,
            "remotes": self.remotes,
            "dirty": self.dirty,
            "patch": {"artifact": "cascade/git.patch", "sha256": self.patch_sha256, "size": len(self.patch)}
            if self.patch
            else None,
            "untracked": [
                {k: v for k, v in vars(u).items() if v is not None or k in ("stored",)}
                for u in self.untracked
            ],
            **self._earlier_dict(),
        }

    def _earlier_dict(self) -> dict[str, object]:
        if not self.earlier_outputs:
            return {}
        listed = [vars(e) for e in self.earlier_outputs[:MAX_EARLIER_LISTED]]
        more = len(self.earlier_outputs) - len(listed)
        return {"earlier_outputs": listed, **({"earlier_outputs_more": more} if more else {})}


def is_dirty(root: Path, exclude: tuple[str, ...] = ()) -> list[str]:
    """Paths that differ from HEAD (tracked changes and untracked, non-ignored files), less the
    untracked files earlier runs of this checkout wrote and left unchanged (as capture leaves them out)."""
    listing = git_repo.output(root, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    earlier = earlier_outputs.load(root)
    paths = [
        entry[3:] for entry in git_repo.names(listing)
        if len(entry) > 3 and not (entry.startswith("?? ") and _left_out(root, entry[3:], earlier))
    ]  # fmt: skip
    return [p for p in paths if not excluded(p, exclude)]


def _left_out(root: Path, rel: str, earlier: Mapping[str, Written]) -> bool:
    written = earlier.get(rel)
    return written is not None and earlier_outputs.unchanged(root, rel, written)


def capture_git(root: Path, exclude: tuple[str, ...], max_untracked_bytes: int, keep: Path | None = None,
                earlier: Mapping[str, Written] | None = None) -> GitState:  # fmt: skip
    """`exclude`: root-relative paths of cascade's own files (store, run dirs), never recorded.
    `keep`: a directory that receives a copy of each untracked file small enough to store, written
    from the same single read that hashes it (a file still being written is recorded as read).
    `earlier`: the files earlier runs of this checkout wrote (earlier_outputs.load); an untracked one
    still as its run left it is listed as left out, never read."""
    commit = head_commit(root)
    branch = git_repo.output(root, "rev-parse", "--abbrev-ref", "HEAD").decode().strip()
    # --binary (implies --full-index) makes binary changes round-trip through `git apply`.
    patch = git_repo.output(
        root, "diff", "HEAD", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames"
    )
    listed = git_repo.names(git_repo.output(root, "ls-files", "--others", "--exclude-standard", "-z"))
    earlier = earlier or {}
    candidates = sorted(p for p in listed if not excluded(p, exclude))
    left_out = {p: earlier[p] for p in candidates if _left_out(root, p, earlier)}
    found = (_untracked(root, rel, max_untracked_bytes, keep) for rel in candidates if rel not in left_out)
    untracked = tuple(u for u in found if u is not None)
    return GitState(
        commit=commit,
        branch=None if branch == "HEAD" else branch,
        remotes=_remotes(root),
        dirty=bool(patch) or bool(untracked),
        patch=patch,
        untracked=untracked,
        earlier_outputs=tuple(EarlierOutput(p, w.size, w.run_id) for p, w in left_out.items()),
    )


def strip_credentials(url: str) -> str:
    """https://user:token@host/x.git → https://host/x.git (scp-style git@host:x stays)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme and parts.netloc and "@" in parts.netloc:
        host = parts.netloc.rsplit("@", 1)[1]
        return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", parts.fragment))
    if parts.scheme and parts.query:
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", parts.fragment))
    return url


def _remotes(root: Path) -> dict[str, str]:
    remotes: dict[str, str] = {}
    for line in git_repo.output(root, "remote", "-v").decode(errors="replace").splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "(fetch)":
            remotes[fields[0]] = strip_credentials(fields[1])
    return remotes


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _untracked(root: Path, rel: str, max_bytes: int, keep: Path | None) -> UntrackedFile | None:
    """One read: hashed, and copied into `keep` as the same bytes. None if it vanished meanwhile."""
    path = root / rel
    try:
        if path.is_symlink():
            target = os.readlink(path)
            link_digest = hashlib.sha256(target.encode("utf-8", "surrogateescape")).hexdigest()
            return UntrackedFile(rel, len(target), link_digest, stored=True, symlink_target=target)
        copy = keep / rel if keep is not None and path.stat().st_size <= max_bytes else None
        digest, size = _read_once(path, copy, max_bytes)
    except FileNotFoundError:  # deleted between `git ls-files` and the read
        return None
    if size > max_bytes:
        return UntrackedFile(
            rel, size, digest, stored=False,
            reason=f"larger than untracked_max_bytes ({max_bytes}); `dvc add` it or add it to .gitignore",
        )  # fmt: skip
    return UntrackedFile(rel, size, digest, stored=True)


def _read_once(path: Path, copy: Path | None, max_bytes: int) -> tuple[str, int]:
    """sha256 and size of what was read; `copy` gets those bytes, or is removed if they grew too big."""
    digest, size = hashlib.sha256(), 0
    if copy is not None:
        copy.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "rb") as handle, open(copy, "wb") if copy is not None else _Discard() as out:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
    if copy is not None and size > max_bytes:
        copy.unlink(missing_ok=True)
    return digest.hexdigest(), size


class _Discard:
    """A writer that keeps nothing (hashing without a copy)."""

    def __enter__(self) -> _Discard:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def write(self, data: bytes) -> int:
        return len(data)


def excluded(rel: str, exclude: tuple[str, ...]) -> bool:
    """Whether `rel` is one of the `exclude` paths or lies under one (cascade's own files)."""
    return any(rel == e or rel.startswith(e.rstrip("/") + "/") for e in exclude)
