"""The script's own argparse namespace, noted for the parent as the params the script used.

A script configured by `argparse` never calls `cascade_repro.params()`; its configuration is the
namespace its parser returns. Installed on the script's `import argparse` (child/hooks.py), this
wraps `ArgumentParser.parse_known_args` (which `parse_args` and `parse_intermixed_args` go through)
and notes the first successful top-level parse of the script's own command line: not a sub-parser
(it runs inside its parent's parse) and not a parser given another list. Values are kept as JSON
can hold them (str, int, float, bool, None and lists of them); anything else as its truncated repr.
"""

from __future__ import annotations

import math
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Sequence

Note = Callable[[dict[str, Any]], None]
MAX_VALUES = 1000  # as many as cascade takes params (params.MAX_PARAMS)
MAX_REPR = 200
MAX_ITEMS = 100  # a list longer than this is kept as its repr
MAX_TEXT = 6000  # MLflow's limit on a param's value


def watch(argparse: ModuleType, note: Note) -> None:
    """Make the first top-level parse of `sys.argv[1:]` call `note` with the namespace's values."""
    parser_class = argparse.ArgumentParser
    original = parser_class.parse_known_args
    if getattr(original, "_cascade_parsed_args", False):
        return
    state = threading.local()
    done: list[bool] = []

    def parse_known_args(self: Any, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        depth = getattr(state, "depth", 0)
        state.depth = depth + 1
        try:
            result = original(self, args, namespace)
        finally:
            state.depth = depth
        if not done and depth == 0 and _own_command_line(args):
            done.append(True)
            try:
                note(values(result[0]))
            except Exception:  # noting must never change what the script does
                pass
        return result

    parse_known_args._cascade_parsed_args = True  # type: ignore[attr-defined]
    parser_class.parse_known_args = parse_known_args


def _own_command_line(args: Sequence[str] | None) -> bool:
    if args is None:
        return True
    try:
        return list(args) == sys.argv[1:]
    except TypeError:
        return False


def values(namespace: Any) -> dict[str, Any]:
    """The namespace's attributes as JSON-safe values, in the order argparse set them."""
    items = list(vars(namespace).items())[:MAX_VALUES]
    return {str(name): _safe(value) for name, value in items}


def _safe(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return value[:MAX_TEXT]
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)) and len(value) <= MAX_ITEMS:
        return [_safe(item) for item in value]
    return _repr(value)


def _repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= MAX_REPR else text[: MAX_REPR - 3] + "..."
