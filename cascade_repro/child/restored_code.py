"""A restore's re-run imports the restored code, not the checkout's. Standard library only.

A project installed in editable mode (`pip install -e .` of a src layout: setuptools' finder or a
`.pth` file) or put on PYTHONPATH by its absolute path is imported from the checkout that `cascade
restore` runs in, at whatever commit that is now, not from the worktree that holds the recorded
commit: the re-run would train with today's library code and diverge for no recorded reason.

While a restore re-runs, `RestoredCode` moves each top-level module found inside the checkout to
the same path inside the worktree, where the restored code has it (a module it does not have at all
is imported as found, from the checkout, and said). A module that the worktree lacks (a restored
package's, or one beside the script) is read from the checkout where git does not track it there (a
compiled extension built in place, a generated `_version.py`: the recorded run read it from the
checkout too); one git tracks is newer than the recorded commit and is not found, as it was not
then. Each module moved, or left in the checkout, is said once on stderr. The directories of
sys.path inside the checkout get their worktree's in front, for processes `multiprocessing` spawns
(they get the sys.path, not the finder): with a `.pth` or PYTHONPATH, DataLoader workers import the
restored code too.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Callable, Mapping, Sequence

from cascade_repro.child import protocol
from cascade_repro.child.hooks import find_while_busy


class RestoredCode(importlib.abc.MetaPathFinder):
    """A meta-path finder that finds nothing itself: it moves other finders' top-level specs that
    point inside `checkout` to the same paths inside `worktree`."""

    def __init__(self, checkout: str, worktree: str, own: str, say: Callable[[str], object]) -> None:
        self.checkout = os.path.realpath(checkout)
        self.worktree = os.path.realpath(worktree)
        self.own = os.path.realpath(own)  # cascade's own directory in the checkout: never moved
        self._say = say
        self._local = threading.local()
        self._said: set[str] = set()
        self._inserted: set[str] = set()  # the worktree's directories put on sys.path (`restored_path`)
        self._in_checkout: dict[tuple[str, ...], list[str]] = {}  # a path: its worktree dirs' checkout twins

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:  # fmt: skip
        if getattr(self._local, "busy", False):
            return None
        spec = find_while_busy(self, self._local, fullname, path, target)
        try:
            if spec is None:  # what the restored code lacks: a file git does not track in the checkout?
                return self._untracked(fullname, sys.path if path is None else path)
            return self._moved(fullname, spec) if path is None else spec
        except (OSError, ValueError, ImportError):  # a path that cannot be read: imported as found
            return spec

    def _moved(self, fullname: str, spec: importlib.machinery.ModuleSpec) -> importlib.machinery.ModuleSpec:
        """A top-level module found inside the checkout, from the same path in the worktree."""
        locations = list(spec.submodule_search_locations or [])
        origin = spec.origin if spec.has_location else None
        if origin is None:  # a namespace package: its directories in the worktree instead
            restored = [self._in_worktree(where) or where for where in locations]
            if restored != locations:
                spec.submodule_search_locations = list(dict.fromkeys(restored))
                self._tell(fullname, next(where for where in restored if _under(where, self.worktree)))
            return spec
        real = os.path.realpath(origin)
        if _under(real, self.worktree):  # found there: sys.path has the worktree's directories first
            if any(_under(real, where) for where in self._inserted):
                self._tell(fullname, os.path.dirname(real) if locations else real)
            return spec
        moved = self._in_worktree(real)
        if moved is None:
            return spec  # not the checkout's: a package installed elsewhere
        if not os.path.isfile(moved):  # (imported all the same: a top-level import cannot be refused here)
            self._tell(fullname, None, origin, tracked=self._tracked(real))
            return spec
        search = [self._in_worktree(where) or where for where in locations] if locations else None
        new = importlib.util.spec_from_file_location(fullname, moved, submodule_search_locations=search)
        if new is None:
            return spec
        self._tell(fullname, os.path.dirname(moved) if locations else moved)
        return new

    def _untracked(self, fullname: str, path: Sequence[str]) -> importlib.machinery.ModuleSpec | None:
        """A module that the worktree's directories in `path` lack (a restored package's, or
        sys.path's): the checkout's, where git does not track that file there (a compiled extension
        built in place, a generated `_version.py`: the recorded run read it from the checkout too).
        One git tracks is newer than the recorded commit: it is not found, as it was not then."""
        key = tuple(path)
        back = self._in_checkout.get(key)
        if back is None:  # (kept per path: probes of optional packages miss sys.path again and again)
            back = self._in_checkout[key] = [
                os.path.normpath(os.path.join(self.checkout, os.path.relpath(real, self.worktree)))
                for real in map(os.path.realpath, path) if _under(real, self.worktree)
            ]  # fmt: skip
        if not back:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, back)
        if spec is None or not spec.has_location or spec.origin is None or self._tracked(spec.origin):
            return None
        self._tell(fullname, None, spec.origin)
        return spec

    def _tracked(self, path: str) -> bool:
        """Whether the checkout's git tracks the file (an error, git missing: taken as tracked)."""
        from cascade_repro.store import git_repo  # (rarely: the script's start stays light)

        try:
            return git_repo.succeeds(Path(self.checkout), "ls-files", "--error-unmatch", "--", path)
        except Exception:  # (git missing: a CascadeError)
            return True

    def restored_path(self, entries: list[str]) -> list[str]:
        """sys.path with each directory inside the checkout preceded by the same one in the worktree,
        where it has it: what `multiprocessing`'s spawned processes (DataLoader workers) are given
        as their sys.path, without this finder."""
        out = []
        for entry in entries:
            moved = self._in_worktree(entry) if entry else None
            if moved is not None and os.path.isdir(moved):
                out.append(moved)
                self._inserted.add(moved)
            out.append(entry)
        return out

    def _in_worktree(self, path: str) -> str | None:
        """The same path inside the worktree, for one inside the checkout (not in cascade's own
        directory, where the worktree usually is); None for any other."""
        real = os.path.realpath(path)
        if _under(real, self.worktree) or _under(real, self.own) or not _under(real, self.checkout):
            return None
        return os.path.normpath(os.path.join(self.worktree, os.path.relpath(real, self.checkout)))

    def _tell(self, fullname: str, moved: str | None, origin: str | None = None,
              tracked: bool = False) -> None:  # fmt: skip
        if fullname in self._said:
            return
        self._said.add(fullname)
        if moved is not None:
            where = os.path.relpath(moved, self.worktree)
            self._say(f"cascade: the re-run imports {fullname} from the restored code ({where}), not from "
                      "this checkout, where it is installed (editable, or on PYTHONPATH)\n")  # fmt: skip
        else:
            why = "the recorded commit does not have it" if tracked else "git does not track it there"
            self._say(f"cascade: {fullname} is not in the restored code: imported from this checkout "
                      f"({origin}), as found now ({why})\n")  # fmt: skip


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def restored_code_value(checkout: str, worktree: str, own: str) -> str:
    """What `cascade restore` puts in protocol.ENV_RESTORED_CODE for its re-run (`own`: cascade's own
    directory in the checkout, where restore worktrees and runs are)."""
    return json.dumps({"checkout": checkout, "worktree": worktree, "own": own})


def install(environ: Mapping[str, str], say: Callable[[str], object]) -> RestoredCode | None:
    """In a restore's re-run (protocol.ENV_RESTORED_CODE set), the finder, first on sys.meta_path."""
    given = environ.get(protocol.ENV_RESTORED_CODE)
    if not given:
        return None
    try:
        paths = json.loads(given)
        checkout, worktree, own = str(paths["checkout"]), str(paths["worktree"]), str(paths["own"])
    except (ValueError, TypeError, KeyError):
        return None
    finder = RestoredCode(checkout, worktree, own, say)
    sys.meta_path.insert(0, finder)
    sys.path[1:] = finder.restored_path(sys.path[1:])  # ([0]: the script's directory, set apart)
    return finder
