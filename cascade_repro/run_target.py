"""What `cascade run` runs: a script by its path, or a module by its name (`cascade run -m pkg.train`,
as `python -m pkg.train`), and where that module's file is, found without importing it.

A run of a module records its name (`command.module`) beside the file it resolved to
(`command.script`, relative to the repository root: the code that ran, as for a script). The
restore runs the module by its name again, from the recorded working directory in the worktree.
"""

from __future__ import annotations

import difflib
import re
import sys
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

# A dotted Python name: what `python -m` takes (a record's value is checked against it before use)
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def is_module_name(name: object) -> bool:
    return isinstance(name, str) and len(name) <= 500 and _MODULE_NAME.fullmatch(name) is not None


def may_be_its_file(name: str, script: str) -> bool:
    """Whether `script` (a path) can be the file of the module `name`: `train.py` for `pkg.train`,
    `__main__.py` for a package (its directories may differ: a src layout, a linked directory)."""
    return script.rsplit("/", 1)[-1] in (f"{name.rsplit('.', 1)[-1]}.py", "__main__.py")


def words(script: str, module: str | None) -> list[str]:
    """What follows `python` to run it: `-m MODULE`, else the script's path."""
    return ["-m", module] if module else [script]


class NotRunnable(LookupError):
    """`python -m NAME` would not run a Python file of NAME (the message says why, as python would;
    `missing`: no module of that name was found)."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def module_file(name: str, cwd: Path) -> Path:
    """The file `python -m NAME` run in `cwd` would execute (a package: its `__main__.py`), found as
    the import system finds it but without running any of it (not even its packages' `__init__`):
    `cwd` first, as `python -m` puts it first on sys.path, then this interpreter's finders (an
    editable install's among them). Raises NotRunnable where it finds no Python source to run."""
    parts = name.split(".")
    spec = _top_level(parts[0], cwd)
    searched, depth = [str(cwd)], 1  # where parts[depth - 1] was looked for
    while spec is not None and depth < len(parts):
        if spec.submodule_search_locations is None:
            raise NotRunnable(f"{'.'.join(parts[:depth])} is a module, not a package: it has no "
                              f"{'.'.join(parts[:depth + 1])}")  # fmt: skip
        searched, depth = list(spec.submodule_search_locations), depth + 1
        spec = PathFinder.find_spec(".".join(parts[:depth]), searched)
    if spec is None:
        close = difflib.get_close_matches(parts[depth - 1], _modules_in(searched), n=1, cutoff=0.75)
        guess = ".".join([*parts[: depth - 1], close[0], *parts[depth:]]) if close else None
        said = f"no module named {name}" + (f"; did you mean {guess}?" if guess else "")
        raise NotRunnable(said, missing=True)
    if spec.submodule_search_locations is not None:  # a package runs its __main__
        spec = PathFinder.find_spec(f"{name}.__main__", list(spec.submodule_search_locations))
        if spec is None:
            raise NotRunnable(f"{name} is a package without a __main__.py: it cannot be run itself; name "
                              "one of its modules")  # fmt: skip
    if not spec.has_location or not spec.origin or not spec.origin.endswith(".py"):
        raise NotRunnable(f"{name} is not Python source ({spec.origin}): cascade records the source that ran")
    return Path(spec.origin).resolve()


def _modules_in(directories: list[str]) -> list[str]:
    """The names of the modules and packages in these directories (a typo's suggestions)."""
    names = []
    for directory in directories[:8]:
        try:
            entries = sorted(Path(directory).iterdir())[:2000]
        except OSError:
            continue
        names += [entry.stem if entry.suffix == ".py" else entry.name for entry in entries
                  if entry.suffix == ".py" or (entry / "__init__.py").is_file()]  # fmt: skip
    return names


def _top_level(name: str, cwd: Path) -> ModuleSpec | None:
    spec = PathFinder.find_spec(name, [str(cwd)])
    if spec is not None:
        return spec
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec(name, None)
        except Exception:  # another tool's finder failing on a name it does not know
            continue
        if spec is not None:
            return spec
    return None
