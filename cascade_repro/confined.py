"""Keeping the writes a run record asks for inside their target directory, symlinks included.

A record may come from a shared server, so it is not trusted. Two layers, both needed:

- before anything is written, `refuse_escapes` follows the symlinks the record itself would create
  (untracked symlinks, symlinks in its patch) over every path it names, as text: a chain of links
  that each look harmless but together lead out is refused there;
- at the moment of writing, `write_file` and `make_symlink` resolve the real path of the directory
  they write into, component by component, and refuse one outside the target: symlinks that were
  already there (committed ones, the user's own) cannot be written through either.

Both raise `UnsafeRecord`, whose message names the path and the link. Neither writes into git's own
directory (`refuse_git_dir`): a `.git/config` with an fsmonitor command, a hook, or a `.git` file
naming another git directory runs whatever it says at the next git command.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import shutil
from pathlib import Path, PurePosixPath
from typing import Iterable, Mapping

from cascade_repro.errors import CascadeError, UnsafeRecord

SYMLINK_MODE = "120000"  # git's file mode for a symbolic link
MAX_LINK_HOPS = 40  # as the kernel's ELOOP limit: a record's link cycle is refused, not followed forever


# -- before writing: the record's own links, as text --------------------------------------------------
def refuse_escapes(links: Mapping[str, str], paths: Iterable[tuple[str, str]]) -> None:
    """Refuse a record whose links (path → target, root-relative) lead out of the root, alone or
    chained, or whose paths ((path, what it is) pairs) would be written through such a link."""
    for link, target in links.items():
        parent = _follow(posixpath.dirname(link), links, f"the symlink {link}")
        if (
            parent is None
            or target.startswith("/")
            or _follow(posixpath.join(parent, target), links, f"the symlink {link}") is None
        ):
            raise UnsafeRecord(f"unsafe record: the symlink {link} points outside the worktree ({target})")
    for path, what in paths:
        parent = _follow(posixpath.dirname(path), links, what)
        if parent is None:
            raise UnsafeRecord(
                f"unsafe record: {what} {path} would be written through a symlink out of the worktree"
            )


def _follow(path: str, links: Mapping[str, str], what: str) -> str | None:
    """`path` with the record's links replaced by their targets, normalized; None once it leaves."""
    parts = [p for p in PurePosixPath(path).parts if p not in ("", ".")] if path else []
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if not resolved:
                return None
            resolved.pop()
            continue
        here = "/".join([*resolved, part])
        target = links.get(here)
        if target is None:
            resolved.append(part)
            continue
        hops += 1
        if hops > MAX_LINK_HOPS or target.startswith("/"):
            if hops > MAX_LINK_HOPS:
                raise UnsafeRecord(f"unsafe record: {what} goes through a cycle of symlinks ({here})")
            return None
        parts = [p for p in PurePosixPath(target).parts if p not in ("", ".")] + parts
    return "/".join(resolved) or "."


def symlinks_in_patch(patch: bytes) -> dict[str, str]:
    """The symlinks a git patch creates or changes: path → target. A link whose target cannot be
    read from the patch (a binary hunk, several lines) is refused: git would write it blind."""
    links: dict[str, str] = {}
    for block in patch.split(b"\ndiff --git "):
        mode, path, added, binary = _file_in_patch(block)
        if mode != SYMLINK_MODE or path is None:
            continue
        if binary or len(added) != 1:
            raise UnsafeRecord(
                f"unsafe record: the patch writes the symlink {path} without a readable target"
            )
        links[path] = added[0]
    return links


def _file_in_patch(block: bytes) -> tuple[str | None, str | None, list[str], bool]:
    """One file's part of a git patch: its new mode, the path it writes, the lines it adds, and
    whether its hunk is binary."""
    mode, path, added, binary = None, None, [], False
    for line in block.split(b"\n"):
        text = line.decode("utf-8", "surrogateescape")
        if text.startswith(("new file mode ", "new mode ")) or (
            text.startswith("index ") and text.count(" ") == 2  # "index a..b MODE": a changed link
        ):
            mode = text.rsplit(" ", 1)[1]
        elif text.startswith("deleted file mode "):
            mode = None
        elif text.startswith("+++ "):
            path = None if text == "+++ /dev/null" else _unquote(text[4:])[2:]
        elif text.startswith(("rename to ", "copy to ")):
            path = _unquote(text.split(" to ", 1)[1])
        elif text == "GIT binary patch":
            binary = True
        elif text.startswith("+") and not text.startswith("+++ "):
            added.append(text[1:])
    return mode, path, added, binary


def _unquote(path: str) -> str:
    """git quotes unusual paths C-style: "a/caf\\303\\251" → a/café."""
    path = path.rstrip("\t")
    if not (path.startswith('"') and path.endswith('"')):
        return path
    raw = path[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
    return raw.encode("latin-1").decode("utf-8", "surrogateescape")


# -- while writing: real paths --------------------------------------------------------------------
# Code points HFS+ ignores in a name (so `.g\u200cit` is `.git` there), as git's own path check has them.
_HFS_IGNORED = dict.fromkeys([0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x206A, 0x2070),
                              0xFEFF])  # fmt: skip
_NTFS_SHORT_NAME = re.compile(r"git~[0-9]+")


def names_git_dir(part: str) -> bool:
    """Whether one path component names git's own directory on some disk: `.git` in any case (a
    case-insensitive disk), with what HFS+ ignores, or as NTFS reads it (trailing dots and spaces
    dropped, a `:stream` after it, the 8.3 short name `GIT~1`)."""
    name = part.translate(_HFS_IGNORED).split(":", 1)[0].rstrip(". ").lower()
    return name == ".git" or _NTFS_SHORT_NAME.fullmatch(name) is not None


def refuse_git_dir(relative: str, what: str) -> None:
    """Refuse a record's path with a `.git` component (`names_git_dir`; a nested repository's too):
    git's own directory is never the record's to write."""
    if any(names_git_dir(part) for part in PurePosixPath(relative).parts):
        raise UnsafeRecord(
            f"unsafe record: {what} {relative!r} is in a .git directory, git's own",
            hint="nothing was written; a run never writes there: the record was altered",
        )


def real_directory(root: Path, relative: str, what: str) -> Path:
    """The real directory `relative` (a root-relative directory) is, made as needed, each component
    resolved on disk now and refused when it leads out of `root` or into its `.git`."""
    refuse_git_dir(relative, what)
    real_root = Path(os.path.realpath(root))
    git_dir = real_root / ".git"
    current = real_root
    for part in PurePosixPath(relative).parts:
        if part in ("", "."):
            continue
        candidate = current / part
        if part == ".." or not (candidate.is_dir() or candidate.is_symlink() or _mkdir(candidate)):
            raise UnsafeRecord(f"unsafe record: {what} leads out of {root} ({relative})")
        resolved = Path(os.path.realpath(candidate))
        if not within(resolved, real_root):
            link = candidate.relative_to(real_root)
            raise UnsafeRecord(
                f"unsafe record: {what} would be written through the symlink {link} → {resolved}, "
                f"outside {root}",
                hint=f"nothing was written outside {root}; check the symlinks there",
            )
        if within(resolved, git_dir):  # a symlink in the worktree to its .git
            raise UnsafeRecord(f"unsafe record: {what} would be written into {git_dir} through {part}")
        if not resolved.is_dir():
            raise UnsafeRecord(f"unsafe record: {what} goes through {resolved}, which is not a directory")
        current = resolved
    return current


def write_file(root: Path, relative: str, source: Path, what: str) -> Path:
    """Copy `source` to `root/relative` through a temporary sibling and a rename, so a symlink already
    at the destination is replaced, never followed. Returns the real path written."""
    refuse_git_dir(relative, what)
    directory = real_directory(root, posixpath.dirname(relative), what)
    destination = directory / posixpath.basename(relative)
    tmp = directory / f".{destination.name}.cascade.tmp"
    tmp.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        with open(source, "rb") as src, os.fdopen(os.open(tmp, flags, 0o644), "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, destination)
    except OSError as exc:  # a full disk, a read-only one: nothing half-written stays
        tmp.unlink(missing_ok=True)
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        raise CascadeError(
            f"cannot write {destination}: {exc.strerror or exc}",
            hint=("free space on that file system (df -h " + str(directory) + ")" if full
                  else "check that the directory is writable") + ", then run the command again; "
                 "nothing half-written was left",
        ) from exc
    except BaseException:  # Ctrl-C mid-copy: nothing half-written stays either
        tmp.unlink(missing_ok=True)
        raise
    return destination


def make_symlink(root: Path, relative: str, target: str, what: str) -> Path:
    """Create the symlink `root/relative` → `target`, refused when the target, resolved from where
    the link really is, leads out of `root`."""
    refuse_git_dir(relative, what)
    directory = real_directory(root, posixpath.dirname(relative), what)
    real_root = Path(os.path.realpath(root))
    if target.startswith("/") or not within(Path(os.path.realpath(directory / target)), real_root):
        raise UnsafeRecord(f"unsafe record: the symlink {relative} would point outside {root} ({target})")
    link = directory / posixpath.basename(relative)
    os.symlink(target, link)
    return link


def refuse_links_out(root: Path, relatives: Iterable[str]) -> None:
    """Each of `relatives` that is a symlink on disk must resolve inside `root` (after `git apply`)."""
    real_root = Path(os.path.realpath(root))
    for relative in relatives:
        path = root / relative
        if path.is_symlink() and not within(Path(os.path.realpath(path)), real_root):
            raise UnsafeRecord(f"unsafe record: the patch made {relative} a symlink out of the worktree "
                               f"({os.readlink(path)})")  # fmt: skip


def within(path: Path | str, root: Path | str) -> bool:
    """Whether `path` is `root` or below it, as written (resolve both first where links count)."""
    path, root = Path(path), Path(root)
    return path == root or root in path.parents


def _mkdir(path: Path) -> bool:
    try:
        path.mkdir()
    except FileExistsError:
        pass
    return path.is_dir() or path.is_symlink()
