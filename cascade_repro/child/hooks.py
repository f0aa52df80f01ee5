"""Import hooks: run a callback right after a module is imported, or before its import starts.

This is how the child seeds torch and numpy and applies determinism flags without importing them
itself (the script's first line stays fast), and how a script's own `import mlflow` waits for the
parent's run id so its `mlflow.log_*` calls land in the cascade run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Callable, Sequence


class ImportHooks(importlib.abc.MetaPathFinder):
    """A meta-path finder that never finds anything itself; it decorates other finders' specs."""

    def __init__(
        self,
        before: dict[str, Callable[[], None]],
        after: dict[str, Callable[[ModuleType], None]],
    ) -> None:
        self._before = dict(before)
        self._after = dict(after)
        self._local = threading.local()

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if getattr(self._local, "busy", False):
            return None
        before = self._before.pop(fullname, None)
        if before is not None:
            before()
        if fullname not in self._after:
            return None
        spec = find_while_busy(self, self._local, fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _with_callback(spec.loader, lambda module: self._run_after(fullname, module))
        return spec

    def _run_after(self, fullname: str, module: ModuleType) -> None:
        """Once, when the module is executed: a spec only looked up (`importlib.util.find_spec`, as
        transformers does to see what is installed) must not use the callback up."""
        after = self._after.pop(fullname, None)
        if after is not None:
            after(module)

    def after(self, fullname: str, callback: Callable[[ModuleType], None]) -> None:
        """Call `callback` once `fullname` is imported (a hook added while the script runs)."""
        self._after[fullname] = callback

    def install(self) -> None:
        # Modules already imported (e.g. numpy pulled in by a sitecustomize) get their callback now.
        for name in list(self._after):
            module = sys.modules.get(name)
            if module is not None:
                self._after.pop(name)(module)
        sys.meta_path.insert(0, self)


def find_while_busy(finder: object, local: threading.local, fullname: str, path: Sequence[str] | None,
                    target: ModuleType | None) -> importlib.machinery.ModuleSpec | None:  # fmt: skip
    """`find_with_others`, with `local.busy` set meanwhile: the others may ask `finder` again through
    sys.meta_path (two such finders, each looking with the others), and it answers None while busy."""
    local.busy = True
    try:
        return find_with_others(finder, fullname, path, target)
    finally:
        local.busy = False


def find_with_others(
    skip: object, fullname: str, path: Sequence[str] | None, target: ModuleType | None
) -> importlib.machinery.ModuleSpec | None:
    for finder in sys.meta_path:
        if finder is skip or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def _with_callback(loader: object, callback: Callable[[ModuleType], None]) -> importlib.abc.Loader:
    """The same loader (same class for isinstance checks) whose exec_module then calls back."""
    base = type(loader)

    class _Hooked(base):  # type: ignore[valid-type, misc]
        def exec_module(self, module: ModuleType) -> None:
            super().exec_module(module)
            callback(module)

    hooked = object.__new__(_Hooked)
    hooked.__dict__.update(getattr(loader, "__dict__", {}))
    return hooked
