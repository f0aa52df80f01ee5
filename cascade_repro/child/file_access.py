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
The same holds for a file the script read and is about to remove or rename away (`os.unlink`,
`os.remove`, `os.rename`, `os.replace`, and so `pathlib`, `shutil.rmtree` and `shutil.move`; a
checkpoint saved over, which is unlinked first: checkpoints.py) or cut (`os.truncate` by path): its
bytes as read are kept too, by a hardlink where the file is only unlinked (no copy, whatever its
size: a resume checkpoint of a few GB), else a copy, within the same size bound.

Files written other than through `open` (torch.save's and safetensors' writers, Rust and C++) are
noted as written by their hooks (`note_saved`). A file outside the repository that the run wrote
before reading it is its own output, never named as read outside. Weights read through safetensors
(`safe_open`, which `load_file` and transformers' `from_pretrained` use: Rust opens the file) are
noted as reads when the script imports safetensors (`import_hooks`).
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import io
import json
import os
import sys
from types import ModuleType
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
        self.written_outside: dict[str, None] = {}  # absolute paths the run wrote outside it: its own files
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
        elif writing:
            self.note_written_outside(path)
        elif path not in self.outside and self._data_outside(path):
            self.outside[path] = None
            self._append({"read_outside": path})

    def _data_outside(self, path: str) -> bool:
        """Whether a read outside the repository is one to name: not the run's own file (written
        before), a system or library file, code, or a directory (shutil.rmtree opens those it empties)."""
        return (path not in self.written_outside and len(self.outside) < MAX_OUTSIDE
                and not library_or_system(path, self.system) and not os.path.isdir(path))  # fmt: skip

    def note_written_outside(self, path: str) -> None:
        """The run wrote `path` (absolute) outside the repository: read back later, it is its own."""
        if path not in self.written_outside and len(self.written_outside) < MAX_PATHS \
                and not path.startswith(self.system):  # (never named as read outside anyway)  # fmt: skip
            self.written_outside[path] = None

    def note_saved(self, file: Any) -> None:
        """A writer `open` does not see (torch.save's, safetensors') wrote `file`."""
        self.note(file, True)

    def note_relative(self, rel: str, writing: bool) -> None:
        seen = self.written if writing else self.read
        if rel in seen:
            return
        if len(seen) >= MAX_PATHS:
            self.truncated = True
            return
        seen[rel] = None
        self._append({"written" if writing else "read": rel})

    def before_write(self, rel: str, reads: bool, link: bool = False) -> bool:
        """About to open `rel` for writing (or to remove it, or rename it away): when the run read it
        before (or this open reads it too) and has not written it yet, its bytes as read are hashed
        (and kept) before they go. `link`: the file is only unlinked, its bytes stay as they are, so
        a hardlink keeps them. Returns whether it did (`unlink_failed` then, if the unlink fails)."""
        if rel in self.written or rel in self.as_read or not (reads or rel in self.read):
            return False
        self.as_read[rel] = None
        try:
            fact, linked = self._hash_and_keep(rel, link)
        except OSError:  # not there yet (a new file), or unreadable: there is nothing it read
            return False
        if fact is not None:
            if reads:
                self.note_relative(rel, False)
            self._append(fact)
        return linked

    def before_remove(self, file: Any, dir_fd: int | None = None, link: bool = True) -> str | None:
        """About to unlink `file` (relative to `dir_fd` when given, as shutil.rmtree does) or rename it
        away: a file the run read keeps its bytes as read. Nothing to do, and no work, before any read.
        Returns the file's path where a second name keeps it (`unlink_failed` undoes that)."""
        if not self.read:
            return None
        rel = self.relative(_at(file, dir_fd))
        if rel is None:
            return None
        if rel in self.read:
            return rel if self.before_write(rel, False, link) else None
        if not link and os.path.isdir(self.root + rel):  # renamed away: the files read in it go too
            inside = rel.rstrip("/") + "/"
            for read in [r for r in self.read if r.startswith(inside)]:
                self.before_write(read, False)
        return None

    def kept_through(self, linked: str | None, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`call` (an unlink, a rename over), the file `linked` kept by a second name for it: if it fails
        (EXDEV: shutil.move then copies over the file, in place), the keep becomes a copy."""
        try:
            return call(*args, **kwargs)
        except BaseException:
            if linked is not None:
                self.unlink_failed(linked)
            raise

    def unlink_failed(self, rel: str) -> None:
        """The unlink (or rename over) that `rel` was kept for failed: the file stays, and its second
        name would follow what is written to it next. The keep becomes a private copy of the same
        bytes (or goes, past the size the child copies: the hash as read stays noted)."""
        assert self.keep_dir is not None
        kept = os.path.join(self.keep_dir, rel)
        private = kept + ".copy"
        try:
            if os.stat(kept).st_size <= MAX_KEEP_BYTES:
                with _ORIGINAL_OPEN(kept, "rb") as source, _ORIGINAL_OPEN(private, "wb") as copy:
                    while chunk := source.read(1 << 20):
                        copy.write(chunk)
                _ORIGINAL_REPLACE(private, kept)
                return
        except OSError:
            with contextlib.suppress(OSError):
                _ORIGINAL_UNLINK(private)
        with contextlib.suppress(OSError):
            _ORIGINAL_UNLINK(kept)

    def _hash_and_keep(self, rel: str, link: bool = False) -> tuple[dict[str, Any] | None, bool]:
        """The fact to note of `rel` as read, and whether it is kept by a second name (`link`)."""
        digest, size, kept = hashlib.sha256(), 0, None
        if not os.path.isfile(self.root + rel):  # (a FIFO or a device is never read here)
            return None, False
        with _ORIGINAL_OPEN(self.root + rel, "rb") as source:
            length = os.fstat(source.fileno()).st_size
            if link and self._link(rel):  # (the inode is unlinked next: no bound on a second name)
                while chunk := source.read(1 << 20):
                    digest.update(chunk)
                    size += len(chunk)
                return {"as_read": rel, "sha256": digest.hexdigest(), "size": size, "kept": True}, True
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
        return {"as_read": rel, "sha256": digest.hexdigest(), "size": size, "kept": bool(kept)}, False

    def _link(self, rel: str) -> bool:
        """A second name for `rel` in the keep directory (a file about to be unlinked: its inode stays
        as it is); False where there can be none (another file system)."""
        if self.keep_dir is None:
            return False
        target = os.path.join(self.keep_dir, rel)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.lexists(target):
                _ORIGINAL_UNLINK(target)
            os.link(self.root + rel, target)
        except OSError:
            return False
        return True

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
            else:
                note(file, True)  # outside the repository: read back later, the run's own file
            return handle

        def os_open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            where = _at(path, kwargs["dir_fd"]) if kwargs.get("dir_fd") is not None else path
            if not flags & _WRITE_FLAGS:
                fd = os_open(path, flags, *args, **kwargs)
                note(where, False)
                return fd
            rel = relative(where)
            if rel is not None:
                before_write(rel, False)
            fd = os_open(path, flags, *args, **kwargs)
            if rel is not None:
                note_relative(rel, True)
            else:
                note(where, True)
            return fd

        _replace(os, "open", os_open_)
        _same_face(open_, opened)
        builtins.open = io.open = open_
        self._install_removals()
        _through_pathlib_accessor()

    def _install_removals(self) -> None:
        """os.unlink/os.remove and os.rename/os.replace keep the bytes as read of a file the run read
        before it goes; a rename's target is then written. os.truncate by path: the same before it
        cuts the file."""
        before_remove, note, kept_through = self.before_remove, self.note, self.kept_through

        def removal(original: Callable[..., Any]) -> Callable[..., Any]:
            def unlink_(path: Any, *args: Any, dir_fd: int | None = None, **kwargs: Any) -> Any:
                linked = before_remove(path, dir_fd)
                return kept_through(linked, original, path, *args, dir_fd=dir_fd, **kwargs)

            return unlink_

        def renaming(original: Callable[..., Any]) -> Callable[..., Any]:
            def rename_(src: Any, dst: Any, *args: Any, src_dir_fd: int | None = None,
                        dst_dir_fd: int | None = None, **kwargs: Any) -> Any:  # fmt: skip
                before_remove(src, src_dir_fd, link=False)  # its inode lives on, under `dst`
                linked = before_remove(dst, dst_dir_fd)  # the one `dst` named is unlinked
                result = kept_through(linked, original, src, dst, *args, src_dir_fd=src_dir_fd,
                                      dst_dir_fd=dst_dir_fd, **kwargs)  # fmt: skip
                note(_at(dst, dst_dir_fd), True)
                return result

            return rename_

        for name in ("unlink", "remove"):
            _replace(os, name, removal(getattr(os, name)))
        _replace(os, "truncate", self._truncating(os.truncate))
        for name in ("rename", "replace"):
            _replace(os, name, renaming(getattr(os, name)))

    def _truncating(self, original: Callable[..., Any]) -> Callable[..., Any]:
        relative, before_write, note_relative, note = (self.relative, self.before_write, self.note_relative,
                                                       self.note)  # fmt: skip

        def truncate_(path: Any, length: int) -> Any:  # (by descriptor: its open for writing kept them)
            rel = relative(path)
            if rel is not None:
                before_write(rel, False)  # cut in place: a copy of the bytes as read
            result = original(path, length)
            if rel is not None:
                note_relative(rel, True)
            else:
                note(path, True)  # outside the repository: the run's own file, if read back
            return result

        return truncate_


_ORIGINAL_OPEN = io.open  # (bound at import, before install: the hook's own reads are not noted)
_ORIGINAL_UNLINK = os.unlink
_ORIGINAL_REPLACE = os.replace
_SUPPORTS = ("supports_dir_fd", "supports_fd", "supports_follow_symlinks", "supports_effective_ids")
MAX_OUTSIDE = 100  # files read outside the repository, named (the record holds fewer)
CODE = (".py", ".pyc", ".pyi", ".so", ".pth")  # a library's source (a traceback, a warning reads it): no data
# an installed distribution's metadata (`importlib.metadata` reads it, torch's scan of entry points for
# every distribution on sys.path), wherever it is installed (PYTHONPATH, a `.pth`'s site directory)
METADATA_DIRS = (".dist-info" + os.sep, ".egg-info" + os.sep)
# Where files read are the system's, a library's or a cache of compiled code, not the run's data.
SYSTEM_DIRS = ("/usr/", "/lib/", "/lib64/", "/bin/", "/sbin/", "/etc/", "/proc/", "/sys/", "/dev/", "/run/",
               "/var/", "/snap/")  # fmt: skip
CACHES = ("~/.cache/torch/", "~/.triton/", "~/.nv/", "~/.cascade/", "~/.local/lib/", "~/.config/", "~/.netrc",
          "~/.keras/", "~/.matplotlib/", "~/.cache/matplotlib/", "~/.cache/pip/")  # fmt: skip


def _through_pathlib_accessor() -> None:
    """Python 3.10's pathlib calls io.open and os.unlink/rename/replace through an accessor whose
    class bound them when pathlib was imported (before the hooks): Path.read_bytes, Path.open and
    Path.unlink went around them. (From 3.11 pathlib calls them as module attributes.)"""
    pathlib = sys.modules.get("pathlib")
    accessor = getattr(pathlib, "_NormalAccessor", None)
    if accessor is None:  # 3.11+, or not imported yet (its class will bind the hooked ones)
        return
    for name, module in (("open", io), ("unlink", os), ("rename", os), ("replace", os)):
        if name in vars(accessor):
            setattr(accessor, name, staticmethod(getattr(module, name)))


def library_or_system(path: str, system: tuple[str, ...] = SYSTEM_DIRS) -> bool:
    """Whether a file read outside the repository is no data: a library's code, or under `system`
    (the system's directories; in the child, its Python's prefixes and caches too)."""
    return path.startswith(system) or path.endswith(CODE) or any(part in path for part in METADATA_DIRS)


def _system_prefixes() -> tuple[str, ...]:
    prefixes = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    temp = os.environ.get("TMPDIR") or "/tmp"  # (tempfile's choice, without importing it at the start)
    own = [os.path.join(temp, name) for name in ("torchinductor_", "pymp-", "tmp")]  # compiled, workers'
    prefixes.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # cascade's own package
    return (*SYSTEM_DIRS, *(os.path.normpath(p) + os.sep for p in prefixes if p),
            *(os.path.expanduser(c) for c in CACHES), *own)  # fmt: skip


def _at(file: Any, dir_fd: int | None) -> Any:
    """`file` named relative to the directory `dir_fd` (shutil.rmtree's unlinks) as a path from here;
    `file` itself without a dir_fd or where it is absolute; None where the directory has no name."""
    if dir_fd is None or isinstance(file, int):
        return file
    try:
        path = os.fsdecode(os.fspath(file))
        return path if os.path.isabs(path) else os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    except (TypeError, ValueError, OSError):
        return None


def _replace(module: ModuleType, name: str, wrapper: Callable[..., Any]) -> None:
    """`module.name` becomes `wrapper`, with the original's face and place in os.supports_* (which
    shutil and others check before they pass a dir_fd)."""
    original = getattr(module, name)
    _same_face(wrapper, original)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    for kind in _SUPPORTS:
        supported = getattr(os, kind, None)
        if isinstance(supported, set) and original in supported:
            supported.add(wrapper)
    setattr(module, name, wrapper)


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
    global _active
    _active = access
    return access


_active: FileAccess | None = None  # the one install() put in place, for the hooks below


def note_saved(file: Any) -> None:
    """A checkpoint writer that `open` does not see (torch.save's, safetensors') wrote `file`."""
    if _active is not None:
        _active.note_saved(file)


def import_hooks() -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: safetensors' reader, noted as a read once the script imports it."""
    return {"safetensors": _watch_safetensors}


def _watch_safetensors(module: ModuleType) -> None:
    """`safetensors.safe_open` (which `safetensors.torch.load_file`, transformers and Accelerate use)
    notes the file it opens, before safetensors.torch and transformers bind it by name."""
    original = getattr(module, "safe_open", None)
    if not callable(original):
        return

    def safe_open(filename: Any, *args: Any, **kwargs: Any) -> Any:
        handle = original(filename, *args, **kwargs)
        if _active is not None:
            _active.note(filename, False)
        return handle

    _same_face(safe_open, original)
    safe_open.__wrapped__ = original  # type: ignore[attr-defined]
    module.safe_open = safe_open  # type: ignore[attr-defined]
