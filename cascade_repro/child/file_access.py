"""Which files inside the repository the script opened, for reading or for writing (stdlib only).

`open` (builtins and io, which numpy's memmap and pathlib go through) and `os.open` are wrapped: a
call costs one path join and a set lookup, each path is noted once, nothing is read or hashed here.
A path seen for the first time is appended as one JSON line to `files.jsonl` in the run directory
(O_APPEND: forked DataLoader workers, which inherit the hook and the descriptor, add theirs too, and
a script killed halfway keeps what it opened so far). The parent decides at the end which of them
neither git nor DVC tracks (inputs to hash and warn about) and which the run wrote (outputs, never
snapshotted as untracked inputs).
"""

from __future__ import annotations

import builtins
import io
import json
import os
import sys
from typing import Any, Callable

MAX_PATHS = 10_000  # per kind: a script that opens millions of files gets a bounded record
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

    def __init__(self, root: str, skip: tuple[str, ...] = (), log: int | None = None) -> None:
        self.root = os.path.normpath(root) + os.sep
        self.skip = tuple(os.path.normpath(s) + os.sep for s in skip)
        self.read: dict[str, None] = {}  # insertion-ordered sets
        self.written: dict[str, None] = {}
        self.truncated = False
        self.log = log  # an O_APPEND descriptor of files.jsonl, or None

    def note(self, file: Any, writing: bool) -> None:
        path = _absolute(file)
        if path is None or not path.startswith(self.root) or path.startswith(self.skip):
            return
        seen = self.written if writing else self.read
        rel = path[len(self.root) :].replace(os.sep, "/")
        if rel in seen:
            return
        if len(seen) >= MAX_PATHS:
            self.truncated = True
            return
        seen[rel] = None
        if self.log is not None:
            self._append(rel, writing)

    def _append(self, rel: str, writing: bool) -> None:
        assert self.log is not None
        try:
            os.write(self.log, (json.dumps({"written" if writing else "read": rel}) + "\n").encode())
        except OSError:
            self.log = None  # the run directory is gone or full: the in-memory notes stay

    def facts(self) -> dict[str, Any]:
        return {"read": list(self.read), "written": list(self.written), "truncated": self.truncated}

    def install(self) -> None:
        opened, os_open = builtins.open, os.open
        note = self.note

        def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            handle = opened(file, mode, *args, **kwargs)
            note(file, isinstance(mode, str) and ("w" in mode or "a" in mode or "x" in mode or "+" in mode))
            return handle

        def os_open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            fd = os_open(path, flags, *args, **kwargs)
            note(path, bool(flags & _WRITE_FLAGS))
            return fd

        _same_face(open_, opened)
        _same_face(os_open_, os_open)
        builtins.open = io.open = open_
        os.open = os_open_


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
    access = FileAccess(root, skip, log)
    access.install()
    return access
