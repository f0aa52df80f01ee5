"""A restore's re-run imports the restored code, not the checkout's. Standard library only.

A project installed in editable mode (`pip install -e .` of a src layout: setuptools' finder or a
`.pth` file) or put on PYTHONPATH by its absolute path is imported from the checkout that `cascade
restore` runs in, at whatever commit that is now, not from the worktree that holds the recorded
commit: the re-run would train with today's library code and diverge for no recorded reason.

While a restore re-runs, `RestoredCode` moves each top-level module found inside the checkout to
the same path inside the worktree, where the restored code has it. A package's submodules are
looked for in the worktree first, then in the checkout: a file git ignores (a compiled extension
built in place, generated code) is not in the restored code, and the recorded run read it from the
checkout too. A module the restored code does not have at all is imported as it would be, from the
checkout. Each module moved, or left in the checkout, is said once on stderr. The directories of
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
from types import ModuleType
from typing import Any, Callable, Mapping, Sequence

from cascade_repro.child import protocol


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

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:  # fmt: skip
        if path is not None or getattr(self._local, "busy", False):  # a submodule: its package's path
            return None
        self._local.busy = True
        try:
            spec = _find_with_others(self, fullname, target)
        finally:
            self._local.busy = False
        if spec is None:
            return None
        try:
            return self._moved(fullname, spec)
        except (OSError, ValueError, ImportError):  # a path that cannot be read: imported as found
            return spec

    def _moved(self, fullname: str, spec: importlib.machinery.ModuleSpec) -> importlib.machinery.ModuleSpec:
        locations = list(spec.submodule_search_locations or [])
        origin = spec.origin if spec.has_location else None
        if origin is None:  # a namespace package: its directories in the worktree come first
            joined = self._search(locations)
            if joined != locations:
                spec.submodule_search_locations = joined
                if _under(joined[0], self.worktree):
                    self._tell(fullname, joined[0])
            return spec
        real = os.path.realpath(origin)
        if _under(real, self.worktree):  # found there (sys.path has the worktree's directories first)
            restored, told = real, any(_under(real, where) for where in self._inserted)
        else:
            moved = self._in_worktree(origin)
            if moved is None:
                return spec  # not the checkout's: a package installed elsewhere
            if not os.path.isfile(moved):
                self._tell(fullname, None, origin)
                return spec
            restored, told = moved, True
        search: list[str] | None = self._search(locations) if locations else None
        if restored != real or (search is not None and search != locations):
            new = importlib.util.spec_from_file_location(fullname, restored,
                                                         submodule_search_locations=search)  # fmt: skip
            spec = new if new is not None else spec
        if told:
            self._tell(fullname, os.path.dirname(restored) if search is not None else restored)
        return spec

    def _search(self, locations: list[str]) -> list[str]:
        """A package's directories: the worktree's, then the checkout's (what the restored code lacks,
        a file git ignores), then any other, each once."""
        restored, checkout, other = [], [], []
        for where in locations:
            real = os.path.realpath(where)
            if _under(real, self.worktree):
                restored.append(real)
                back = os.path.normpath(os.path.join(self.checkout, os.path.relpath(real, self.worktree)))
                if os.path.isdir(back):
                    checkout.append(back)
            elif (moved := self._in_worktree(real)) is not None:
                if os.path.isdir(moved):
                    restored.append(moved)
                checkout.append(real)
            else:
                other.append(where)
        return list(dict.fromkeys([*restored, *checkout, *other]))

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

    def _tell(self, fullname: str, moved: str | None, origin: str | None = None) -> None:
        if fullname in self._said:
            return
        self._said.add(fullname)
        if moved is not None:
            where = os.path.relpath(moved, self.worktree)
            self._say(f"cascade: the re-run imports {fullname} from the restored code ({where}), not from "
                      "this checkout, where it is installed (editable, or on PYTHONPATH)\n")  # fmt: skip
        else:
            self._say(f"cascade: {fullname} is not in the restored code: imported from this checkout "
                      f"({origin}), as found now\n")  # fmt: skip


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _find_with_others(skip: object, fullname: str, target: ModuleType | None) -> Any:
    for finder in sys.meta_path:
        if finder is skip or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname, None, target)
        if spec is not None:
            return spec
    return None


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
