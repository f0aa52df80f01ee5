"""DVC through its Python API: cache objects hashed once, state entries, push/pull of md5 objects.

DVC's own md5 (`hash: md5` in a .dvc file) is the plain md5 of the bytes, so cascade hashes a file
in one pass and tells DVC's state database, keyed by (inode, mtime, size), what it found: a later
`dvc status` finds the entry and does not read the file again. Objects enter `.dvc/cache/files/md5`
by reflink where the filesystem can, else by copy (DVC's own default); checkpoints of a project
that asks for it (`checkpoint_link: hardlink`) by hardlink, the workspace file then read-only, as
with DVC's own `cache.type: hardlink`. Cache objects are read-only (0444) like DVC's.

DVC exceptions are translated here into DataError; nothing above this module imports dvc.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable

from cascade_repro.errors import DataError

FICLONE = 0x40049409  # linux/fs.h: share the extents of another file (reflink)
CHUNK = 1 << 20


DIR_SUFFIX = ".dir"  # a directory's object: the listing of its files
MAX_DIR_LISTING_BYTES = 16 << 20


@dataclass(frozen=True)
class Stored:
    md5: str
    size: int
    link: str  # reflink | hardlink | copy | present
    files: int | None = None  # a directory's number of files


@dataclass(frozen=True)
class PushResult:
    remote: str | None
    pushed: int
    failed: tuple[str, ...]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.failed


Progress = Callable[[int], None]  # called with the bytes just hashed


def md5_of(path: Path, progress: Progress | None = None) -> tuple[str, int]:
    digest, size = hashlib.md5(usedforsecurity=False), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
            if progress is not None:
                progress(len(chunk))
    return digest.hexdigest(), size


def directory_files(path: Path) -> list[Path]:
    """The files of a directory as DVC's `.dir` object lists them (by relative path; symlinks left out)."""
    return sorted((p for p in path.rglob("*") if p.is_file() and not p.is_symlink()),
                  key=lambda p: p.relative_to(path).as_posix())  # fmt: skip


def directory_object(entries: list[dict[str, str]]) -> tuple[bytes, str]:
    """A `.dir` object's bytes, its entries (md5, relpath), and its name: their md5 + `.dir`."""
    listing = json.dumps(entries, sort_keys=True).encode("utf-8")
    return listing, hashlib.md5(listing, usedforsecurity=False).hexdigest() + DIR_SUFFIX


def workspace_md5(path: Path) -> tuple[str, int]:
    """The md5 a file or directory would have in the DVC cache (a directory's `.dir` object's) and its
    size, read only: nothing enters the cache."""
    if not path.is_dir():
        return md5_of(path)
    entries, total = [], 0
    for file in directory_files(path):
        md5, size = md5_of(file)
        entries.append({"md5": md5, "relpath": file.relative_to(path).as_posix()})
        total += size
    return directory_object(entries)[1], total


def pointer_text(md5: str, size: int, path: str, files: int | None = None) -> str:
    """A stock DVC pointer file (`dvc pull` / `dvc checkout` of it restores the object or directory)."""
    nfiles = "" if files is None else f"  nfiles: {files}\n"
    return f"outs:\n- md5: {md5}\n  size: {size}\n{nfiles}  hash: md5\n  path: {path}\n"


class Cache:
    """The DVC repository at `root`, opened on first use (importing dvc costs ~1 s)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._repo: Any = None
        self._lock = threading.Lock()

    @staticmethod
    def exists_for(root: Path) -> bool:
        return (root / ".dvc").is_dir()

    def repo(self) -> Any:
        with self._lock:
            if self._repo is None:
                import logging

                from dvc.repo import Repo

                logging.getLogger("dvc").setLevel(logging.WARNING)
                try:
                    self._repo = Repo(str(self.root))
                except Exception as exc:
                    raise DataError(f"cannot open the DVC repository at {self.root}: {exc}") from exc
            return self._repo

    def close(self) -> None:
        if self._repo is not None:
            self._repo.close()
            self._repo = None

    def share_with(self, other_root: Path) -> None:
        """Make the DVC repo at `other_root` (a restore worktree) use this cache and these remotes."""
        from dvc.repo import Repo

        repo = self.repo()
        remotes = dict(repo.config["remote"])
        default = repo.config["core"].get("remote")
        other = Repo(str(other_root))
        try:
            with other.config.edit("local") as conf:
                conf["cache"]["dir"] = str(Path(repo.cache.local.path).parents[1])
                for name, settings in remotes.items():
                    conf["remote"][name] = dict(settings)
                if default:
                    conf["core"]["remote"] = default
        finally:
            other.close()

    def object_path(self, md5: str) -> Path:
        return Path(self.repo().cache.local.oid_to_path(md5))

    def add(
        self, path: Path, expect: tuple[Any, Any, Any] | None = None, hardlink: bool = False,
        present_only: bool = False,
    ) -> Stored | None:
        """Hash `path` once, put it in the cache, record the state entry. None if the file is gone
        or is not the one announced (`expect`: inode, size, mtime_ns) or changed while hashed, or,
        `present_only`, if the cache does not hold its bytes already (nothing is placed then).

        `hardlink` only where nothing rewrites the file in place (checkpoints: the torch.save hook
        unlinks before writing); a data file edited in place, by root, would corrupt the object."""
        from dvc_data.hashfile.hash_info import HashInfo

        repo = self.repo()
        try:
            before = os.stat(path)
            info = repo.fs.info(str(path))
        except (FileNotFoundError, OSError):
            return None
        if expect and expect[0] is not None and (before.st_ino, before.st_size, before.st_mtime_ns) != expect:
            return None
        try:  # (a checkpoint its framework pruned meanwhile, Lightning's top k: gone, not an error)
            md5, size = md5_of(path)
            after = os.stat(path)
            if (after.st_ino, after.st_size, after.st_mtime_ns) != (
                before.st_ino,
                before.st_size,
                before.st_mtime_ns,
            ):
                return None
            target = self.object_path(md5)
            if present_only and not target.exists():
                return None
            link = "present" if target.exists() else _place(path, target, hardlink)
        except FileNotFoundError:
            return None
        if link == "hardlink":
            info = repo.fs.info(str(path))  # chmod of the shared inode changed its ctime only
        repo.state.save(str(path), repo.fs, HashInfo("md5", md5), info=info)
        repo.state.save(str(target), repo.fs, HashInfo("md5", md5))
        return Stored(md5, size, link)

    def add_directory(self, path: Path) -> Stored | None:
        """A directory as one DVC object, as `dvc add DIR` makes it: each file in the cache, and a
        `.dir` object listing them (md5, relative path), named by its own md5 + `.dir`. None if it
        vanished meanwhile. Symlinks inside are left out (a checkpoint holds files). Files enter by
        reflink or copy, never by hardlink: a framework may rewrite one of them in place later."""
        entries, total, links = [], 0, set()
        for file in directory_files(path):
            stored = self.add(file)
            if stored is None:
                return None
            entries.append({"md5": stored.md5, "relpath": file.relative_to(path).as_posix()})
            total += stored.size
            links.add(stored.link)
        listing, md5 = directory_object(entries)
        target = self.object_path(md5)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(listing)
            os.chmod(tmp, 0o444)
            os.replace(tmp, target)
        return Stored(md5, total, "/".join(sorted(links)) or "present", len(entries))

    def directory_entries(self, md5: str) -> list[tuple[str, str]]:
        """(relative path, md5) of each file of a verified `.dir` object. Its listing is untrusted (a
        remote may be shared): each path must stay inside the directory, each md5 be 32 hex digits."""
        from cascade_repro.errors import UnsafeRecord

        target = self.verified_object(md5)
        if target is None:
            raise DataError(f"the DVC directory object {md5} is not in the cache")
        if target.stat().st_size > MAX_DIR_LISTING_BYTES:
            raise UnsafeRecord(f"unsafe record: the directory object {md5} lists more than 16 MB of files")
        listing = json.loads(target.read_bytes())
        found = []
        for entry in listing if isinstance(listing, list) else [None]:
            relpath = entry.get("relpath") if isinstance(entry, dict) else None
            member = entry.get("md5") if isinstance(entry, dict) else None
            parts = PurePosixPath(relpath).parts if isinstance(relpath, str) and relpath else ("..",)
            if PurePosixPath(str(relpath)).is_absolute() or ".." in parts or not _is_md5(member):
                raise UnsafeRecord(f"unsafe record: the directory object {md5} lists {str(entry)[:120]}")
            found.append((str(relpath), str(member)))
        return found

    def verified_object(self, md5: str, progress: Progress | None = None) -> Path | None:
        """The cache object, re-hashed (DVC's own check trusts read-only files): None if absent.
        Raises DataError when its bytes do not match its name."""
        target = self.object_path(md5)
        if not target.exists():
            return None
        actual, _ = md5_of(target, progress)
        if actual != md5.removesuffix(DIR_SUFFIX):
            raise DataError(
                f"the DVC cache object {md5} at {target} is corrupt (its bytes hash to {actual})",
                hint=f"delete it (rm -f {target}) and fetch it again from the remote",
            )
        return target

    def push(self, md5s: Iterable[str], remote: str | None = None) -> PushResult:
        """Push objects; a directory's files go with its `.dir` listing (DVC pushes the listing alone)."""
        from dvc_data.hashfile.hash_info import HashInfo

        wanted: list[str] = []
        for md5 in md5s:
            if md5.endswith(DIR_SUFFIX) and self.object_path(md5).exists():
                wanted += [member for _, member in self.directory_entries(md5)]
            wanted.append(md5)
        objects = [HashInfo("md5", m) for m in dict.fromkeys(wanted)]
        if not objects:
            return PushResult(remote, 0, ())
        try:
            result = self.repo().cloud.push(objects, remote=remote)
        except Exception as exc:  # NoRemoteError, RemoteNotFoundError, OSError, ImportError, ...
            return PushResult(remote, 0, tuple(str(h.value) for h in objects), _dvc_message(exc))
        failed = tuple(sorted(str(h.value) for h in result.failed))
        return PushResult(remote or self.default_remote(), len(objects) - len(failed), failed)

    def pull(self, md5: str, remote: str | None = None) -> bool:
        """Fetch one object from the remote into the cache; True if it is in the cache afterwards."""
        import logging

        from dvc_data.hashfile.hash_info import HashInfo

        dvc_log = logging.getLogger("dvc")
        level, dvc_log.level = dvc_log.level, logging.ERROR  # our message says what is missing, and where
        try:
            self.repo().cloud.pull([HashInfo("md5", md5)], remote=remote)
        except Exception as exc:
            raise DataError(
                f"cannot fetch {md5} from the DVC remote: {_dvc_message(exc)}",
                hint="check the remote (`dvc remote list`) and that it is reachable",
            ) from exc
        finally:
            dvc_log.setLevel(level)
        return self.object_path(md5).exists()

    def default_remote(self) -> str | None:
        try:
            core = self.repo().config.get("core", {})
            return core.get("remote")
        except Exception:
            return None

    def tracked_outputs(self) -> list[dict[str, Any]]:
        """Every DVC-tracked output (*.dvc files and dvc.lock): path, md5, size, workspace state."""
        repo = self.repo()
        found = []
        for out in repo.index.outs:
            if not out.use_cache or out.hash_info is None:
                continue
            status = out.workspace_status()
            state = next(iter(status.values()), None) if status else None
            found.append(
                {
                    "path": relative_posix(Path(out.fs_path), self.root),
                    "md5": out.hash_info.value,
                    "size": getattr(out.meta, "size", None),
                    "dvcfile": relative_posix(Path(out.stage.path), self.root),
                    "matches": state is None,
                    "workspace": state or "matches",
                    "in_cache": not out.changed_cache(),
                }
            )
        return found


def init_repository(root: Path, remote_dir: Path) -> tuple[bool, str | None]:
    """`dvc init` where there is no .dvc/ yet, and a default remote: the one configured, else a local
    directory `remote_dir` (in config.local). Returns (initialized now, the default remote's name)."""
    from dvc.repo import Repo

    initialized = False
    if not (root / ".dvc").is_dir():
        dvc_log = logging.getLogger("dvc")
        level, dvc_log.level = dvc_log.level, logging.WARNING  # our summary says it instead
        try:
            Repo.init(str(root))
        finally:
            dvc_log.setLevel(level)
        initialized = True
    repo = Repo(str(root))
    try:
        remotes = repo.config["remote"]
        if remotes:
            return initialized, repo.config["core"].get("remote") or next(iter(remotes))
        remote_dir.mkdir(parents=True, exist_ok=True)
        # config.local: a machine-specific path must not end up in the committed .dvc/config.
        _set_local_remote(root / ".dvc" / "config.local", "cascade-local", remote_dir)
        return initialized, "cascade-local"
    finally:
        repo.close()


def _set_local_remote(path: Path, name: str, url: Path) -> None:
    """The remote `name` at `url`, the default, in DVC's config file `path` (its other settings kept):
    written as UTF-8, as DVC reads it (DVC's own writer encodes ASCII: a path such as `prøject`
    failed there, the project half set up)."""
    from configobj import ConfigObj  # DVC's own config format

    config = ConfigObj(str(path), encoding="utf-8", write_empty_values=True)
    config[f'remote "{name}"'] = {"url": str(url)}
    config.setdefault("core", {})["remote"] = name
    config.write()


def _place(source: Path, target: Path, hardlink: bool) -> str:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    link = "reflink"
    try:
        with open(source, "rb") as src, open(tmp, "wb") as dst:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
    except OSError:
        tmp.unlink(missing_ok=True)
        try:
            if not hardlink:
                raise OSError("hardlink not wanted")
            os.link(source, tmp)
            link = "hardlink"
        except OSError:
            try:
                shutil.copyfile(source, tmp)
            except BaseException:  # disk full, Ctrl-C: no half object left behind under a temp name
                tmp.unlink(missing_ok=True)
                raise
            link = "copy"
    os.chmod(tmp, 0o444)
    os.replace(tmp, target)
    return link


def _is_md5(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)


def relative_posix(path: Path, root: Path) -> str:
    """`path` relative to `root` with / separators; the absolute path when it lies outside."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def _dvc_message(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__
