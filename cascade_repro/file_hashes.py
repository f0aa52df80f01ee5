"""The sha256 of a file the project reads again and again (an untracked dataset, `train.bin` of many
GB), hashed once and then known by its stat while it stays as it was: git's index and DVC's state
database do the same.

`cascade run` hashes each input git and DVC do not track when the run ends, and `check` and
`restore` hash them again to see that the checkout still has them: tens of seconds for a 17 GB file,
every time. Kept in the repository's `.cascade/file_hashes.json`, by real path: size, mtime, ctime,
inode and device, and the sha256. Any write to the file, a `touch` or a `utime` that puts the old
mtime back included, changes its ctime, which no user call can set, so a kept hash is used only for
the bytes it was taken from. A file changed less than RACY_S before it was hashed is not kept (it may
change again within the same tick of the file system's clock, leaving its stat as it was), nor one
whose stat changed while it was read. Nothing here is trusted beyond this checkout: a missing,
unreadable or malformed file of hashes is an empty one, and one that cannot be written is left as it
was.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from cascade_repro.settings import ProjectPaths

RACY_S = 1.0
MAX_ENTRIES = 10_000  # the oldest go first beyond this


class FileHashes:
    """The hashes kept for the repository at `root`; `save()` writes what was added."""

    def __init__(self, root: Path) -> None:
        self.path = ProjectPaths(root).file_hashes
        self._entries: dict[str, list[Any]] | None = None
        self._changed = False

    def sha256_and_size(self, path: Path) -> tuple[str, int]:
        """The file's sha256 and size: as kept, if its stat is what it was; else read (OSError as open)."""
        real = os.path.realpath(path)
        before = os.stat(real)
        entries = self._loaded()
        kept = entries.get(real)
        stamp = _stamp(before)
        if kept is not None and kept[:-1] == stamp:
            return kept[-1], before.st_size
        began_ns = time.time_ns()
        digest, size = _read(real)
        after = os.stat(real)
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
        entries = list(self._entries.items())[-MAX_ENTRIES:]
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(dict(entries)), encoding="utf-8")
            os.replace(temporary, self.path)
        except OSError:  # a read-only checkout, a full disk: the hashes are only a shortcut
            temporary.unlink(missing_ok=True)
        self._changed = False

    def _loaded(self) -> dict[str, list[Any]]:
        if self._entries is None:
            self._entries = _load(self.path)
        return self._entries


def _stamp(stat: os.stat_result) -> list[int]:
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev]


def _read(path: str) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _load(path: Path) -> dict[str, list[Any]]:
    """The kept hashes; entries of any other shape are dropped."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        key: value for key, value in data.items()
        if isinstance(value, list) and len(value) == 6 and all(type(v) is int for v in value[:5])
        and isinstance(value[5], str) and len(value[5]) == 64
    }  # fmt: skip
