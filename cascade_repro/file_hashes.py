"""The sha256 of a file the project reads again and again (an untracked dataset, `train.bin` of many
GB), hashed once and then known by its stat while it stays as it was: git's index and DVC's state
database do the same.

`cascade run` hashes each input git and DVC do not track when the run ends, and `check`, `diff RUN
current` and `restore` hash them again to see that the checkout still has them: ~0.6 s per GiB here,
every time. Kept in the repository's `.cascade/file_hashes.json`, by real path: size, mtime, ctime,
inode and device, and the sha256. Any write through the file system, a `touch` or a `utime` that
puts the old mtime back included, changes its ctime, which no user call can set, so a kept hash is
used only for the bytes it was taken from. The stat is taken from the opened file (on NFS, opening
revalidates what the client cached). A file changed less than RACY_S before it was hashed is not
kept (it may change again within the same tick of the file system's clock, leaving its stat as it
was), nor one whose stat changed while it was read.

What a stat cannot see, as for git: a process that keeps writing through a shared mapping of the
file (`numpy.memmap` in `r+` mode) after its first write to a page, and file systems whose ctime is
not the kernel's change time (some FUSE file systems report ctime = mtime). A restore copies an
input and checks the copy's bytes whatever is kept.

Nothing here is trusted beyond a shortcut: a missing, oversized, unreadable or malformed file of
hashes is an empty one, and one that cannot be written is left as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from cascade_repro.settings import ProjectPaths

RACY_S = 1.0
MAX_ENTRIES = 10_000  # the least recently used go first beyond this
MAX_FILE_BYTES = 16 << 20


class FileHashes:
    """The hashes kept for the repository at `root`; `save()` writes what was added."""

    def __init__(self, root: Path) -> None:
        self.path = ProjectPaths(root).file_hashes
        self._entries: dict[str, list[Any]] | None = None
        self._changed = False

    def sha256_and_size(self, path: Path) -> tuple[str, int]:
        """The file's sha256 and size: as kept, if its stat is what it was; else read (OSError as open)."""
        real = os.path.realpath(path)
        entries = self._loaded()
        with open(real, "rb") as handle:
            before = os.fstat(handle.fileno())
            stamp = _stamp(before)
            kept = entries.get(real)
            if kept is not None and kept[:-1] == stamp:
                entries[real] = entries.pop(real)  # (used: the last to go, at the next save)
                return kept[-1], before.st_size
            began_ns = time.time_ns()
            digest, size = _read(handle)
            after = os.fstat(handle.fileno())
        newest_ns = max(after.st_mtime_ns, after.st_ctime_ns)
        if _stamp(after) == stamp and size == before.st_size and newest_ns < began_ns - RACY_S * 1e9:
            entries.pop(real, None)  # (re-added last: the newest)
            entries[real] = [*stamp, digest]
            self._changed = True
        return digest, size

    def sha256(self, path: Path) -> str:
        return self.sha256_and_size(path)[0]

    def save(self) -> None:
        """Write the hashes taken since loading (atomically; a run beside this one may write its own)."""
        if not self._changed or self._entries is None:
            return
        self._changed = False
        entries = dict(list(self._entries.items())[-MAX_ENTRIES:])
        temporary = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            descriptor, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
            with os.fdopen(descriptor, "w", encoding="utf-8") as out:  # (mode 0600, a name of its own)
                json.dump(entries, out)
            os.replace(temporary, self.path)
            temporary = None
        except OSError:  # a read-only checkout, a full disk: the hashes are only a shortcut
            pass
        finally:
            if temporary is not None:
                Path(temporary).unlink(missing_ok=True)

    def _loaded(self) -> dict[str, list[Any]]:
        if self._entries is None:
            self._entries = _load(self.path)
        return self._entries


def _stamp(status: os.stat_result) -> list[int]:
    return [status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino, status.st_dev]


def sha256_and_size(path: Path) -> tuple[str, int]:
    """A file's sha256 and size, read now (nothing kept: a copy just made, checked)."""
    with open(path, "rb") as handle:
        return _read(handle)


def _read(handle: Any) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while chunk := handle.read(1 << 20):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def _load(path: Path) -> dict[str, list[Any]]:
    """The kept hashes; entries of any other shape are dropped, a file of any other kind is none."""
    try:
        status = os.lstat(path)
        if not stat.S_ISREG(status.st_mode) or status.st_size > MAX_FILE_BYTES:
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except Exception:  # (deep nesting is a RecursionError)
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        key: value for key, value in data.items()
        if isinstance(value, list) and len(value) == 6 and all(type(v) is int for v in value[:5])
        and isinstance(value[5], str) and len(value[5]) == 64
    }  # fmt: skip
