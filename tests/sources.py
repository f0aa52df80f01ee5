"""cascade_repro's own sources, for the tests that read them (the layers, the adapters, the tables)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

PACKAGE = Path(__file__).resolve().parents[1] / "cascade_repro"


def modules(skip: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """(path relative to the package, text) of every module, but those whose path starts with `skip`."""
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith(skip):
            yield rel, path.read_text(encoding="utf-8")


def matching_lines(pattern: re.Pattern[str], skip: tuple[str, ...] = ()) -> list[str]:
    """`module:line: text` of each line whose code (comments cut) matches `pattern`."""
    found = []
    for rel, text in modules(skip):
        for number, line in enumerate(text.splitlines(), 1):
            if pattern.search(line.split("#", 1)[0]):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found
