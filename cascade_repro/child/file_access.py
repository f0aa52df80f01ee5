"""Which files inside the repository the script opened, for reading or for writing (stdlib only).

`open` (builtins and io, which numpy's memmap and pathlib go through) and `os.open` are wrapped: a
call costs one path join and a set lookup, each path is noted once, nothing is read or hashed here.
A path seen for the first time is appended as one JSON line to `files.jsonl` in the run directory
(O_APPEND: forked DataLoader workers, which inherit the hook and the descriptor, add theirs too, and
a script killed halfway keeps what it opened so far). The parent decides at the end which of them
neither git nor DVC tracks (inputs to hash and warn about) and which the run wrote (outputs, never
snapshotted as untracked inputs).

The one exception to "nothing is read here": a file the script read and is about to write (its
first write-open after a read, or an `r+` open) would lose the bytes the run read, so just before
that open they are hashed and, up to MAX_KEEP_BYTES, copied into the run directory (`read_before_write/`)
in the same pass: one line `{"as_read": path, "sha256", "size", "kept"}`. Only such files pay it.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import os
import sys
from typing import Any, Callable

MAX_PATHS = 100_000  # per kind: a script that opens millions of files gets a bounded record
MAX_KEEP_BYTES = 64 << 20  # a file read and then rewritten up to this size is copied as it was read
KEPT_DIR = "read_before_write"  # in the run directory: those copies, by root-relative path
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _absolute(file: Any) -> str | None:
    """An opened path as an absolute, normalized one; None for an fd (whoever opened it was seen
    then) or a value that is no path."""
    if isinstance(file, int):
        return None
    try:
        path = os.fspath(file)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not os.path.isabs(path):
            path = os.path.join(os.getcwd(), path)
        if "/." in path or "//" in path or os.sep != "/":  # only then is there anything to normalize
            path = os.path.normpath(path)
    except (TypeError, ValueError, OSError):
        return None
    return path


class FileAccess:
    """Root-relative POSIX paths opened for reading and for writing, each noted once."""

    def __init__(self, root: str, skip: tuple[str, ...] = (), log: int | None = None,
                 keep_dir: str | None = None) -> None:  # fmt: skip
        self.root = os.path.normpath(root) + os.sep
        self.skip = tuple(os.path.normpath(s) + os.sep for s in skip)
        self.read: dict[str, None] = {}  # insertion-ordered sets
        self.written: dict[str, None] = {}
        self.as_read: dict[str, None] = {}  # read, then hashed before the first write
        self.outside: dict[str, None] = {}  # absolute paths read outside the repository (not the system's)
        self.system = _system_prefixes()
        self.truncated = False
        self.log = log  # an O_APPEND descriptor of files.jsonl, or None
        self.keep_dir = keep_dir  # where the bytes of a file read and then rewritten are copied

    def relative(self, file: Any) -> str | None:
        """`file` as a root-relative POSIX path when it is one to note, else None."""
        path = _absolute(file)
        if path is None or not path.startswith(self.root) or path.startswith(self.skip):
            return None
        return path[len(self.root) :].replace(os.sep, "/")

    def note(self, file: Any, writing: bool) -> None:
        path = _absolute(file)
        if path is None or path.startswith(self.skip):
            return
        if path.startswith(self.root):
            self.note_relative(path[len(self.root) :].replace(os.sep, "/"), writing)
        elif not writing and path not in self.outside and len(self.outside) < MAX_OUTSIDE \
                and not path.startswith(self.system) and not path.endswith(CODE):  # fmt: skip
            self.outside[path] = None
            self._append({"read_outside": path})

    def note_relative(self, rel: str, writing: bool) -> None:
        seen = self.written if writing else self.read
        if rel in seen:
            return
        if len(seen) >= MAX_PATHS:
            self.truncated = True
            return
        seen[rel] = None
        self._append({"written" if writing else "read": rel})

    def before_write(self, rel: str, reads: bool) -> None:
        """About to open `rel` for writing: when the run read it before (or this open reads it too)
        and has not written it yet, its bytes as read are hashed (and kept) before they go."""
        if rel in self.written or rel in self.as_read or not (reads or rel in self.read):
            return
        self.as_read[rel] = None
        try:
            fact = self._hash_and_keep(rel)
        except OSError:  # not there yet (a new file), or unreadable: there is nothing it read
            return
        if fact is not None:
            if reads:
                self.note_relative(rel, False)
            self._append(fact)

    def _hash_and_keep(self, rel: str) -> dict[str, Any] | None:
        digest, size, kept = hashlib.sha256(), 0, None
        if not os.path.isfile(self.root + rel):  # (a FIFO or a device is never read here)
            return None
        with _ORIGINAL_OPEN(self.root + rel, "rb") as source:
            length = os.fstat(source.fileno()).st_size
            copy = self._copy_target(rel) if length <= MAX_KEEP_BYTES else None
            try:
                while chunk := source.read(1 << 20):
                    digest.update(chunk)
                    size += len(chunk)
                    if copy is not None:
                        try:
                            copy.write(chunk)
                        except OSError:  # the run directory filled up: the hash is still noted
                            copy.close()
                            os.unlink(copy.name)
                            copy = None
                kept = copy is not None
            finally:
                if copy is not None:
                    copy.close()
        return {"as_read": rel, "sha256": digest.hexdigest(), "size": size, "kept": bool(kept)}

    def _copy_target(self, rel: str) -> Any:
        if self.keep_dir is None:
            return None
        target = os.path.join(self.keep_dir, rel)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            return _ORIGINAL_OPEN(target, "wb")
        except OSError:  # the run directory is full or gone: the hash is still noted
            return None

    def _append(self, entry: dict[str, Any]) -> None:
        if self.log is None:
            return
        try:
            os.write(self.log, (json.dumps(entry) + "\n").encode())
        except OSError:
            self.log = None  # the run directory is gone or full: the in-memory notes stay

    def facts(self) -> dict[str, Any]:
        return {"read": list(self.read), "written": list(self.written), "truncated": self.truncated}

    def install(self) -> None:
        opened, os_open = builtins.open, os.open
        note, relative = self.note, self.relative
        note_relative, before_write = self.note_relative, self.before_write

        def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if not isinstance(mode, str) or not ("w" in mode or "a" in mode or "x" in mode or "+" in mode):
                handle = opened(file, mode, *args, **kwargs)
                note(file, False)
                return handle
            rel = relative(file)  # before the open, which may truncate what the run read
            if rel is not None:
                before_write(rel, "r" in mode)
            handle = opened(file, mode, *args, **kwargs)
            if rel is not None:
                note_relative(rel, True)
            return handle

        def os_open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if not flags & _WRITE_FLAGS:
                fd = os_open(path, flags, *args, **kwargs)
                note(path, False)
                return fd
            rel = relative(path)
            if rel is not None:
                before_write(rel, False)
            fd = os_open(path, flags, *args, **kwargs)
            if rel is not None:
                note_relative(rel, True)
            return fd

        _same_face(open_, opened)
        _same_face(os_open_, os_open)
        builtins.open = io.open = open_
        os.open = os_open_


_ORIGINAL_OPEN = io.open  # (bound at import, before install: the hook's own reads are not noted)
MAX_OUTSIDE = 100  # files read outside the repository, named (the record holds fewer)
CODE = (".py", ".pyc", ".pyi", ".so", ".pth")  # a library's source (a traceback, a warning reads it): no data
# Where files read are the system's, a library's or a cache of compiled code, not the run's data.
SYSTEM_DIRS = ("/usr/", "/lib/", "/lib64/", "/bin/", "/sbin/", "/etc/", "/proc/", "/sys/", "/dev/", "/run/",
               "/var/", "/snap/")  # fmt: skip
CACHES = ("~/.cache/torch/", "~/.triton/", "~/.nv/", "~/.cascade/", "~/.local/lib/", "~/.config/", "~/.netrc",
          "~/.keras/", "~/.matplotlib/", "~/.cache/matplotlib/", "~/.cache/pip/")  # fmt: skip


def _system_prefixes() -> tuple[str, ...]:
    prefixes = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    temp = os.environ.get("TMPDIR") or "/tmp"  # (tempfile's choice, without importing it at the start)
    own = [os.path.join(temp, name) for name in ("torchinductor_", "pymp-", "tmp")]  # compiled, workers'
    prefixes.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # cascade's own package
    return (*SYSTEM_DIRS, *(os.path.normpath(p) + os.sep for p in prefixes if p),
            *(os.path.expanduser(c) for c in CACHES), *own)  # fmt: skip


def _same_face(wrapper: Callable[..., Any], original: Callable[..., Any]) -> None:
    for name in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(wrapper, name, getattr(original, name))
        except (AttributeError, TypeError):
            pass


def install(root: str | None, log_path: str) -> FileAccess | None:
    """Watch opens under `root` (the repository), except in the run directory (where `log_path` is)
    and a virtual environment inside the repository. None when the parent named no root."""
    if not root:
        return None
    skip = (os.path.dirname(log_path), *(p for p in {sys.prefix, sys.exec_prefix} if p))
    try:
        log: int | None = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        log = None
    access = FileAccess(root, skip, log, os.path.join(os.path.dirname(log_path), KEPT_DIR))
    access.install()
    return access
