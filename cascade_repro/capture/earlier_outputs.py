"""What earlier runs in this checkout wrote into the repository, so the next run leaves it out.

A run's outputs and checkpoints stay in the work tree (Lightning's `lightning_logs/version_N/`, a
script's `sub/out.txt`). They are no part of the user's uncommitted state: the run that wrote them
recorded them (checkpoints in DVC), and storing them again with every later run as untracked files
would make two runs of one clean commit differ, and cost their size per run.

When a run has recorded its outputs, `remember` notes each one still as the run left it in an index
of this checkout, `.cascade/outputs.json` (git ignores `.cascade/`): path → size, mtime and ctime
(ns), inode and run id. The next capture reads that one small file (`load`) and leaves out an
untracked file only while `lstat` still gives the same size, mtime, ctime and inode (`unchanged`:
the test DVC's own state database trusts, with the ctime no `utime` can put back): no file is read
again, whatever its size. A file edited since, replaced, or that no run of this checkout wrote is
captured as before. Runs recorded elsewhere (a shared tracking server) wrote into other checkouts:
they never vouch for a file here.

The index is untrusted input all the same (it is a file in the tree): an entry that is not a
relative path with the expected fields is dropped, and one can only ever leave out a file whose
every stat field it names exactly; the record lists each file left out (`git.earlier_outputs`), so
nothing is silent. It is bounded (MAX_ENTRIES, the oldest runs' entries go first), rewritten whole
under a lock and replaced atomically, and pruned of entries that no longer match their file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from cascade_repro.settings import OWN_DIR

log = logging.getLogger(__name__)
INDEX = f"{OWN_DIR}/outputs.json"
SCHEMA = "cascade.outputs/1"
MAX_ENTRIES = 20_000  # files; a repository with more keeps the newest runs' outputs
MAX_INDEX_BYTES = 8 << 20  # about 300 bytes an entry at most: a larger file was not written here
MAX_DIR_FILES = 10_000  # files under one directory checkpoint (save_pretrained and the like)
_RUN_ID_CHARS = 128
_RUN_ID = re.compile(r"[0-9a-f]{32}")  # what an input's `written_by` may name


@dataclass(frozen=True)
class Written:
    """A file as the run that wrote it left it."""

    size: int
    mtime_ns: int
    ino: int
    ctime_ns: int  # (set by the kernel on any change: an edit whose mtime was put back shows here)
    run_id: str

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "mtime_ns": self.mtime_ns, "ino": self.ino, "ctime_ns": self.ctime_ns,
                "run_id": self.run_id}  # fmt: skip


def load(root: Path) -> dict[str, Written]:
    """The index of `root`, its malformed entries dropped; empty when there is none or it is unreadable
    (then every file is captured, as without an index)."""
    path = root / INDEX
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_INDEX_BYTES + 1)
        if len(raw) > MAX_INDEX_BYTES:
            log.warning("%s is larger than cascade writes it: ignored", path)
            return {}
        data = json.loads(raw)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as exc:  # (nested past the parser's depth: not ours)
        log.warning("%s unreadable, ignored: %s", path, type(exc).__name__)
        return {}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("files"), dict):
        return {}
    index: dict[str, Written] = {}
    for rel, entry in data["files"].items():
        written = _entry(rel, entry)
        if written is not None and len(index) < MAX_ENTRIES:
            index[rel] = written
    return index


def unchanged(root: Path, rel: str, written: Written) -> bool:
    """Whether the file at `rel` is still the regular file its run left (never a symlink)."""
    try:
        now = os.lstat(root / rel)
    except OSError:
        return False
    return stat.S_ISREG(now.st_mode) and _stat_of(now, written.run_id) == written


def name_writers(root: Path, inputs: list[dict[str, Any]], own_run_id: str | None) -> list[dict[str, Any]]:
    """Each input (a record's entry) that is a file an earlier run of this checkout wrote, unchanged
    since (an evaluation reading the training run's model, a resume), gets `written_by`: that run's
    id. Returns those inputs. The index is a file in the tree: only a run id is taken from it."""
    index = load(root)
    named = []
    for item in inputs:
        written = index.get(str(item["path"]))
        if written is None or written.run_id == own_run_id or not _RUN_ID.fullmatch(written.run_id):
            continue
        if unchanged(root, str(item["path"]), written):
            item["written_by"] = written.run_id
            named.append(item)
    return named


def remember(root: Path, run_id: str, paths: Iterable[str], not_after: float | None = None) -> int:
    """Note the regular files at `paths` (root-relative; a directory: the files under it) as `run_id`
    wrote them, in the index of `root`; entries that no longer match their file are dropped. Returns
    how many files of this run were noted. Call it once the run's outputs are recorded. `not_after`
    (a run recovered after it stopped): a file changed since then is someone else's, not noted."""
    own = root / OWN_DIR
    own.mkdir(exist_ok=True)
    with _locked(own / "outputs.lock"):
        index = {rel: w for rel, w in load(root).items() if unchanged(root, rel, w)}
        noted = 0
        for rel in _files(root, paths):
            try:
                now = os.lstat(root / rel)
            except OSError:  # gone (a pruned checkpoint, a temporary file)
                continue
            # (mtime: the DVC cache's hardlink and chmod of a checkpoint change its ctime afterwards)
            if stat.S_ISREG(now.st_mode) and (not_after is None or now.st_mtime <= not_after):
                index.pop(rel, None)  # to the end: the newest run's entries are kept longest
                index[rel] = _stat_of(now, run_id)
                noted += 1
        kept = list(index.items())[-MAX_ENTRIES:]
        _write(root / INDEX, {"schema": SCHEMA, "files": {rel: w.to_dict() for rel, w in kept}})
    return noted


def _files(root: Path, paths: Iterable[str]) -> Iterator[str]:
    """Root-relative paths inside the tree (no `..`, no absolute path, no symlinked directory on the
    way), a directory expanded into its files."""
    real_root = os.path.realpath(root)
    for rel in dict.fromkeys(paths):
        if not _relative(rel):
            continue
        path = root / rel
        parent = os.path.realpath(path.parent)
        if parent != real_root and not parent.startswith(real_root + os.sep):
            continue
        if path.is_dir() and not path.is_symlink():
            yield from _under(root, rel)
        else:
            yield rel


def _under(root: Path, rel: str) -> Iterator[str]:
    count = 0
    for base, dirs, names in os.walk(root / rel):  # symlinked directories are not followed
        dirs.sort()
        for name in sorted(names):
            if count >= MAX_DIR_FILES:
                return
            count += 1
            yield Path(base, name).relative_to(root).as_posix()


def _stat_of(now: os.stat_result, run_id: str) -> Written:
    return Written(now.st_size, now.st_mtime_ns, now.st_ino, now.st_ctime_ns, run_id)


def _entry(rel: Any, entry: Any) -> Written | None:
    if not _relative(rel) or not isinstance(entry, dict):
        return None
    fields = [entry.get(key) for key in ("size", "mtime_ns", "ino", "ctime_ns")]
    numbers = [v for v in fields if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    if len(numbers) != len(fields):
        return None
    run_id = entry.get("run_id")
    if not isinstance(run_id, str) or not 0 < len(run_id) <= _RUN_ID_CHARS:
        return None
    return Written(numbers[0], numbers[1], numbers[2], numbers[3], run_id)


def _relative(rel: Any) -> bool:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
        return False
    parts = rel.split("/")
    return all(part not in ("", ".", "..") for part in parts) and parts[0] != OWN_DIR


def _write(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle, separators=(",", ":"))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One writer at a time (two runs ending together); readers see the old or the new file whole."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform: the last writer wins, as a whole file
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
